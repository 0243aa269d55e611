"""Who owns each awake actor, until when, and when each sleeping actor must wake: one lease
mechanism in the registry namespace, shared by every registry of the store.

An instance publishes one **lease entry** per generation, `wake/<actor id>/<generation>`:

    {"name", "key", "due": when it must run next or None,
     "owner": registry id or None, "address": where that registry takes calls, "until": time}

- While an instance holds the actor (from just after its takeover, before any hook runs, until
  it goes to sleep), `owner`/`address` name its registry and `until` is the lease's end, which
  its registry renews with half of it to go. Going to sleep releases it (`owner` None); a
  destroy erases the entries; an instance torn down by a crash leaves its lease to run out.
- Only the newest generation's entry counts. A stale instance can only ever write its own,
  older generation's entry, so it can never be believed over the instance that took the actor
  from it, and no compare-and-set is needed.
- `due` is what the wake poll reads (through the **due entries**
  `due/<milliseconds>/<actor id>/<generation>`, sorted by time, so a poll reads only what is
  due). While a lease is held, `due >= until` whenever a schedule is pending, so no other
  registry's poll wakes a healthy owner's actor; if the owner dies, the actor wakes on time for
  its schedule or one lease after the death, whichever is later.

A registry that finds another registry's live lease on an actor forwards the call to that
owner instead of taking the actor over (`Registry`); takeover is for an owner whose lease ran
out, one that refused because it is draining, and registries nobody can forward to.

**Member entries** `member/<registry id>` record the running registries (address, host, pid,
lease), so a server can tell whether other processes share its store.

Leases are wall-clock times compared across hosts: the lease must exceed twice the clock
difference between them.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import cbor2

from pagekv.kv import ActorKv, KeyTooLarge, prefix_end

LEASE_S: Final = 10.0
"""Default lease of an awake actor's owner : other registries forward calls to
the owner while it runs and take the actor over once it ran out, so it is also how late, at
most, an actor whose process died is served elsewhere and runs its schedules. The owner renews
it with half of it to go. It must exceed twice the clock difference between hosts."""
_WAKE = b"wake/"
_DUE = b"due/"
_MEMBER = b"member/"
_DUE_DIGITS = 16
_GENERATION_DIGITS = 20
MAX_DUE_READ = 1000
"""Due entries read per poll; the next poll reads on."""


@dataclass(frozen=True)
class Owner:
    """The registry holding an actor under a live lease."""

    registry: str
    address: str | None
    """None: a registry nobody can forward to (an in-process one without a server)."""
    until: float
    generation: int


@dataclass(frozen=True)
class Forwarded:
    """A call another registry (`sender`) forwarded, believing registry `owner` owns the actor
    (the receiving one, or one that advertised the same address before it) under a lease that
    ends at `until` (the owner's own clock wrote it): the sender waits for the answer at least
    that long, and may have given up after it."""

    sender: str
    owner: str
    until: float


@dataclass(frozen=True)
class Member:
    """A running registry of the store."""

    id: str
    address: str | None
    host: str
    pid: int
    until: float
    draining: bool = False
    """It is stopping: it sends calls away rather than take actors."""


@dataclass(frozen=True)
class Lease:
    """What an instance publishes: when it must run next, and while it holds the actor, the
    end of its lease (None once released)."""

    due: float | None
    until: float | None


@dataclass(frozen=True)
class Sleeper:
    name: str
    key: str
    aid: str


class Ownership:
    """The lease and member entries of one store's registry namespace (`index`), as registry
    `registry_id` at `address` reads and writes them. Methods block: run them on a thread."""

    def __init__(self, index: ActorKv, registry_id: str, address: str | None) -> None:
        self._index = index
        self.registry_id = registry_id
        self.address = address
        self._lock = threading.Lock()
        """The list and the write of `publish` see no other writer of this registry."""

    # -- lease entries ------------------------------------------------------------------------

    def publish(
        self,
        aid: str,
        generation: int,
        name: str,
        key: str,
        lease: Lease,
        previous: Lease | None = None,
        extra: Mapping[bytes, bytes] | None = None,
    ) -> None:
        """Record `lease` for the instance of `generation`, and remove the entries of older
        generations. The due entries of this and older generations go in the same batch as the
        new one arrives, so no due entry outlives its time unless a newer generation wrote it
        (the poll never has to guess what is stale).

        `previous` is what this generation's entry is known to hold (the instance wrote it, and
        only it writes that entry): then one write replaces it, with no read. Entries an older
        generation's stale instance wrote meanwhile stay until the next publish without
        `previous` (at the next wake) or a wake poll's `still_due`: only the newest
        generation's entry is ever believed. Without `previous` (the first publish of an
        instance, or after a write whose outcome is unknown), the entries of this generation
        and older ones are read and replaced in one batch (one list, one write). `extra`
        entries of the caller's go in the same batch as the new entry (a tool's record of the
        actor: `index_entries.enroll`)."""
        prefix = _lease_prefix(aid)
        entry: dict[str, Any] = {"due": lease.due, "name": name, "key": key}
        if lease.until is not None:
            entry |= {"owner": self.registry_id, "address": self.address, "until": lease.until}
        lease_key = prefix + b"%0*d" % (_GENERATION_DIGITS, generation)
        puts = {**(extra or {}), lease_key: cbor2.dumps(entry)}
        if lease.due is not None:
            puts[_due_key(lease.due, lease_key)] = b""
        with self._lock:
            if previous is not None:
                stale = [] if previous.due is None else [_due_key(previous.due, lease_key)]
                self._index.write(put=puts, delete=[k for k in stale if k not in puts])
                return
            older = self._index.list(start=prefix, end=prefix_end(lease_key))
            stale = [*_due_keys(older), *(k for k, _ in older)]
            deletes = [k for k in stale if k not in puts]
            if len(puts) + len(deletes) <= self._index.limits.max_batch_entries:
                self._index.write(put=puts, delete=deletes)
                return
            self._index.write(put=puts, delete=[k for k in _due_keys(older) if k not in puts])
            self._index.delete_range(prefix, lease_key)

    def owner(self, aid: str, now: float) -> Owner | None:
        return lease_owner(self._index, aid, now)

    def due_sleepers(self, now: float, awake: set[str]) -> list[Sleeper]:
        """Actors not in `awake` whose newest lease entry is due at `now`.

        Reads only the due entries up to `now`, so a poll costs the same with ten sleeping
        actors or a million. A due entry counts only if the lease entry it names still holds
        that time. One whose lease entry is gone (a newer generation removed it, or the actor
        was destroyed) is deleted: only a stale writer of that generation could write the lease
        entry again, and the newer generation's own entries decide the wake then.
        """
        rows = self._index.list(start=_DUE, end=_due_key(now, _WAKE + b"\xff"), limit=MAX_DUE_READ)
        due: dict[str, Sleeper] = {}
        keys = [key for key, _ in rows]
        step = self._index.limits.max_batch_entries
        for part in (keys[i : i + step] for i in range(0, len(keys), step)):
            values = self._index.get([_lease_key(k) for k in part])
            orphans = []
            for due_key, value in zip(part, values, strict=True):
                if value is None:
                    orphans.append(due_key)
                    continue
                entry = cbor2.loads(value)
                if entry["due"] is None or _due_key(entry["due"], _lease_key(due_key)) != due_key:
                    continue  # a later time replaced it; the write that did removes it
                sleeper = Sleeper(entry["name"], entry["key"], _aid_of(due_key))
                if sleeper.aid not in awake:
                    due[sleeper.aid] = sleeper
            if orphans:
                self._index.delete(orphans)
        return list(due.values())

    def still_due(self, aid: str, now: float) -> bool:
        """Whether the newest generation's lease entry of `aid` is due at `now`.

        Only the newest generation's entry decides: an older one is what a stale instance
        wrote after a newer one took the actor over (a lease it renewed, or its time at
        sleep), and it must not take the actor from the newer owner; it is deleted here with its
        due entry. Read again just before the takeover, so an owner that took the actor, or
        renewed its lease, since the poll read the index is left alone.
        """
        entries = self._index.list(prefix=_lease_prefix(aid))
        if not entries:
            return False
        *older, (_, newest) = entries
        if older:
            self._index.write(delete=[*_due_keys(older), *(key for key, _ in older)])
        due = cbor2.loads(newest)["due"]
        return due is not None and due <= now

    def index_due_times(self) -> None:
        """Give every lease entry with a due time its due entry (at start: the index may have
        been written by a pagekv that kept no due entries, which then read every entry per
        poll)."""
        present = {key for key, _ in self._index.list(prefix=_DUE)}
        leases = self._index.list(prefix=_WAKE)
        missing = [(key, b"") for key in _due_keys(leases) if key not in present]
        step = self._index.limits.max_batch_entries
        for i in range(0, len(missing), step):
            self._index.put(missing[i : i + step])

    def erase(self, aid: str, generation: int) -> None:
        """Remove the lease and due entries of `aid` up to `generation` (its data is gone)."""
        prefix = _lease_prefix(aid)
        end = prefix + b"%0*d" % (_GENERATION_DIGITS, generation + 1)
        dues = _due_keys(self._index.list(start=prefix, end=end))
        self._index.delete_range(prefix, end)
        if dues:
            self._index.delete(dues)

    def check_fits(self, aid: str) -> None:
        """Refuse an actor whose entries would not fit the store's keys before anything is
        written: found at the lease write, after the takeover, it left a namespace behind that
        no index entry names. The longest entry is the due entry (its numbers have fixed
        widths)."""
        lease_key = _lease_prefix(aid) + b"0" * _GENERATION_DIGITS
        longest = len(_due_key(0.0, lease_key))
        limit = self._index.limits.max_key_bytes
        if longest > limit:
            raise KeyTooLarge(f"registry entry of {longest} bytes for this key", longest, limit)

    # -- member entries -----------------------------------------------------------------------

    def join(self, until: float, *, draining: bool = False) -> None:
        """Record (or renew) this registry as a member until `until`."""
        entry = {
            "address": self.address,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "until": until,
            "draining": draining,
        }
        self._index.put([(_MEMBER + self.registry_id.encode(), cbor2.dumps(entry))])

    def leave(self) -> None:
        self._index.delete([_MEMBER + self.registry_id.encode()])

    def due(self, aid: str) -> float | None:
        """When the newest generation's lease entry of `aid` says it must run next (None: no
        entry, or nothing due); read only, for tools that copy the entry elsewhere."""
        entries = self._index.list(prefix=_lease_prefix(aid))
        return cbor2.loads(entries[-1][1])["due"] if entries else None

    def newest_generation(self, aid: str) -> int | None:
        """The generation of the newest lease entry of `aid` (None: no entry): whether another
        instance took the actor over since a given one (`socket_leases.py`)."""
        entries = self._index.list(prefix=_lease_prefix(aid))
        return int(entries[-1][0][len(_lease_prefix(aid)) :]) if entries else None

    def members(self, now: float, *, prune: bool = True) -> list[Member]:
        """The registries whose member lease is live at `now`; expired entries are deleted
        (a member that was only paused writes its entry again at its next renewal) unless
        `prune` is false (a tool that must not write to the store it reads)."""
        live, expired = [], []
        for key, value in self._index.list(prefix=_MEMBER):
            entry = cbor2.loads(value)
            member_id = key[len(_MEMBER) :].decode()
            if entry["until"] <= now:
                expired.append(key)
                continue
            live.append(
                Member(
                    member_id,
                    entry["address"],
                    entry["host"],
                    entry["pid"],
                    entry["until"],
                    entry.get("draining", False),
                )
            )
        if expired and prune:
            self._index.delete(expired)
        return live


def lease_owner(index: ActorKv, aid: str, now: float) -> Owner | None:
    """The registry whose lease on `aid` is live at `now`, from the newest generation's entry
    of the registry namespace `index`; None if the actor sleeps, its owner's lease ran out, or
    it has no entry. Only reads: the inspector asks it beside live registries."""
    entries = index.list(prefix=_lease_prefix(aid))
    if not entries:
        return None
    lease_key, value = entries[-1]
    entry = cbor2.loads(value)
    until = entry.get("until")
    if entry.get("owner") is None or until is None or until <= now:
        return None
    generation = int(lease_key[len(_lease_prefix(aid)) :])
    return Owner(entry["owner"], entry.get("address"), until, generation)


def _lease_prefix(aid: str) -> bytes:
    return _WAKE + aid.encode() + b"/"


def _due_key(due: float, lease_key: bytes) -> bytes:
    """The due entry of lease entry `wake/<actor id>/<generation>` due at `due`:
    `due/<milliseconds>/<actor id>/<generation>`. Rounded down: a wake can come up to 1 ms
    early, which is harmless (the actor runs only the schedules that are due)."""
    millis = max(0, int(due * 1000))
    return b"%s%0*d/%s" % (_DUE, _DUE_DIGITS, millis, lease_key[len(_WAKE) :])


def _due_keys(leases: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The due entries that lease entries `(key, value)` call for."""
    dues = ((key, cbor2.loads(value)["due"]) for key, value in leases)
    return [_due_key(due, key) for key, due in dues if due is not None]


def _lease_key(due_key: bytes) -> bytes:
    return _WAKE + due_key[len(_DUE) + _DUE_DIGITS + 1 :]


def _aid_of(due_key: bytes) -> str:
    """The actor id in `due/<milliseconds>/<actor id>/<generation>`."""
    rest = due_key[len(_DUE) + _DUE_DIGITS + 1 :]
    return rest[: rest.rindex(b"/")].decode()
