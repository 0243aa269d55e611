"""An actor's entries in the registry namespace, written by a tool rather than by a registry:
an import or a copy that has just written the actor's data as generation `generation` of its
namespace (`enroll`).

The same entries a registry writes (`records.py`, `leases.py`): the record of the actor, and
its lease entry with no owner and the time it must run next (with its due entry), so that the
wake poll of any registry of the store wakes it on time for a schedule or an unfinished
workflow. All of them go in one batch (with older generations' lease entries deleted in it),
so a tool killed at any point leaves either the actor recorded whole or nothing of it in the
index; older generations' records go after it (a stale record is harmless: the newest one
counts).
"""

from __future__ import annotations

from collections.abc import Mapping

from pagekv.actor.directory.leases import Lease, Ownership
from pagekv.actor.directory.records import delete_records_up_to, encode_record, record_key
from pagekv.kv import ActorKv

TOOL_REGISTRY: str = "pagekv-tool"
"""The registry id the tools' `Ownership` writes as (never as an owner: their leases have
none)."""


def enroll(
    index: ActorKv,
    aid: str,
    name: str,
    key: str,
    generation: int,
    *,
    created: float | None,
    due: float | None,
    fresh: bool,
    extra: Mapping[bytes, bytes] | None = None,
) -> None:
    """Record the actor `aid` as created at `created` (now if None) by `generation`, due at
    `due`, with `extra` entries written in the same batch as the record. `fresh`: the index
    holds no entry of the actor (a copy into an empty store), so nothing older is read or
    deleted; otherwise older generations' records and lease entries are replaced."""
    ownership = Ownership(index, TOOL_REGISTRY, None)
    record = {record_key(aid, generation): encode_record(name, key, generation, created)}
    previous = Lease(None, None) if fresh else None
    lease = Lease(due, None)
    ownership.publish(aid, generation, name, key, lease, previous, {**record, **(extra or {})})
    if not fresh and generation > 0:
        delete_records_up_to(index, aid, generation - 1)


def forget(index: ActorKv, aid: str, generation: int) -> None:
    """Remove every entry of `aid` in the index up to `generation` (its records, lease and due
    entries): a tool removed its data, or found it had none."""
    Ownership(index, TOOL_REGISTRY, None).erase(aid, generation)
    delete_records_up_to(index, aid, generation)
