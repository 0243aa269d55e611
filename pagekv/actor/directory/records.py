"""Which actors exist: their records in the registry namespace, one per creating generation.

A record `actor/<actor id>\\0<generation>` says that the instance of that generation created the
actor (or found it unrecorded). Records are per generation so that a destroy and a create racing
each other in two processes never erase each other's record:

- a destroy drops the actor's namespace fenced by its own generation `g`, and only then deletes
  the records of generations up to `g`: each describes data the drop removed. A record of a later
  generation was written by an instance that took the actor over after the drop (had it been
  before, the fenced drop would have failed and nothing would be deleted), so it stays;
- a create writes its record after its takeover and before it serves any call, so an actor that
  has acknowledged a write always has a record.

A record is a hint that the data is there, not proof: the data decides. A wake that finds no
initialised actor behind a record (its destroyer died between the drop and the delete) treats the
actor as absent and deletes the stale records.

The NUL after the actor id sorts below every character an actor id holds, so the records of one
actor are contiguous and follow the actor ids' order, and a record from before generations
(`actor/<actor id>`, read as generation 0) sorts just before them: one range read finds them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

import cbor2

from pagekv.kv import ActorKv, prefix_end

REGISTRY_NAMESPACE: Final = "pagekv-registry"
"""The namespace of the store that holds the directory (its keys: docs/FORMAT.md)."""
_ACTOR: Final = b"actor/"
_GENERATION_DIGITS: Final = 20


def actor_id(name: str, key: str) -> str:
    return f"{name}/{quote(key, safe='')}"


@dataclass(frozen=True)
class ActorRecord:
    name: str
    key: str
    created: float
    generation: int = 0

    @property
    def actor_id(self) -> str:
        return actor_id(self.name, self.key)


def _base(aid: str) -> bytes:
    """The key of a record from before generations; every record of `aid` starts with it."""
    return _ACTOR + aid.encode()


def record_key(aid: str, generation: int) -> bytes:
    return _base(aid) + b"\x00%0*d" % (_GENERATION_DIGITS, generation)


def encode_record(name: str, key: str, generation: int, created: float | None = None) -> bytes:
    """The record of a creation at `generation`, made now unless `created` says when (a copy or
    an import keeps the actor's own creation time)."""
    when = time.time() if created is None else created
    return cbor2.dumps({"name": name, "key": key, "created": when, "generation": generation})


def _decode(value: bytes) -> ActorRecord:
    entry = cbor2.loads(value)
    return ActorRecord(entry["name"], entry["key"], entry["created"], entry.get("generation", 0))


def records_of(index: ActorKv, aid: str) -> list[ActorRecord]:
    """The actor's records, oldest generation first (one range read)."""
    base = _base(aid)
    return [_decode(value) for _, value in index.list(start=base, end=base + b"\x01")]


def delete_records_up_to(index: ActorKv, aid: str, generation: int) -> None:
    """Delete the actor's records of generations up to `generation` (one range delete)."""
    index.delete_range(_base(aid), record_key(aid, generation + 1))


def list_actors(
    index: ActorKv,
    *,
    limit: int,
    name: str | None = None,
    key_prefix: str = "",
    after: str | None = None,
) -> list[ActorRecord]:
    """Up to `limit` actors (of type `name`, if given, with keys starting with `key_prefix`) in
    actor-id order, after the actor id `after`; an actor with records of several generations
    (for a moment, after a race) once, with its newest record. A key prefix is a range of the
    index, as quoting a key quotes each character alone, so a search reads only its matches."""
    if key_prefix and name is None:
        raise ValueError("a key prefix needs the actor's type (name)")
    prefix = _ACTOR + (actor_id(name, key_prefix).encode() if name is not None else b"")
    start = prefix if after is None else max(prefix, _base(after) + b"\x01")
    end = prefix_end(prefix)
    found: dict[str, ActorRecord] = {}
    while True:
        rows = index.list(start=start, end=end, limit=limit + 1)
        for _, value in rows:
            record = _decode(value)
            if len(found) == limit and record.actor_id not in found:
                return list(found.values())
            found[record.actor_id] = record
        if len(rows) <= limit:
            return list(found.values())
        start = rows[-1][0] + b"\x00"


def find_actor(index: ActorKv, name: str, key: str) -> ActorRecord | None:
    """The newest record of the actor, or None."""
    records = records_of(index, actor_id(name, key))
    return records[-1] if records else None
