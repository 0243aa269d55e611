"""Leases kept for sleeping actors whose sockets this process holds.

A hibernating actor sleeps, but its sockets stay open here, and only this process's hub can push its
events to them (`realtime/hub.py`). Were its lease released, the next call arriving at another
server, or another server's poll finding a schedule due, would wake it there: that instance would
take the sockets' rows for connections gone, run `on_disconnect` for them and delete the rows, and
its broadcasts would never reach them. So an actor that goes to sleep with connections open here
keeps its lease (`LeaseKeeper.release`): every registry that routes forwards its calls here,
and only this registry's poll wakes it for a due schedule (another's finds the lease and leaves it),
so it wakes where its sockets are.

Invariants:
- a hold exists only while the actor has no live instance here; a wake here replaces it (its
  instance publishes a newer generation's lease, and the registry drops the hold);
- a held lease entry names this registry with `until` renewed with half a lease to go, and
  `due` exactly the actor's next run (so this registry's poll wakes it on time);
- it is released (no owner, `due` kept) once the actor's last connection here is gone or the
  registry drains;
- a renewal that comes after the lease ran out (the process was stopped that long) first reads
  whether a newer generation took the actor over; if one did, the wake elsewhere reaped the
  rows of these connections, so the caller closes them (`MOVED`) and their clients reconnect
  to where the actor runs. A stale renewal can only write its own, older generation's entry,
  which no registry believes over the newer one (`directory/leases.py`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pagekv.actor.directory.leases import Lease, Ownership
from pagekv.actor.worker_threads import Workers
from pagekv.kv import KvError

log = logging.getLogger("pagekv.actor")


@dataclass
class _Hold:
    name: str
    key: str
    generation: int
    due: float | None
    published: Lease | None
    """What the lease entry holds; None while that is unknown (a write failed: it may have
    landed), which makes the next write read the entries first (`Ownership.publish`)."""


class Holds:
    """The held leases of one registry (see the module). Callers hold the actor's lock around
    `renew`, as its wakes do, so a renewal never races the wake that replaces the hold."""

    def __init__(self, ownership: Ownership, workers: Workers, lease: float) -> None:
        self._ownership = ownership
        self._workers = workers
        self._lease = lease
        self._held: dict[str, _Hold] = {}
        self._renewing: set[str] = set()

    def keep(
        self,
        aid: str,
        name: str,
        key: str,
        generation: int,
        due: float | None,
        published: Lease | None,
    ) -> None:
        """An instance of `aid` went to sleep keeping its lease, `published` (None if its last
        write failed), with its next run at `due`."""
        self._held[aid] = _Hold(name, key, generation, due, published)

    def drop(self, aid: str) -> None:
        """A wake here replaced the hold (a renewal found it so, or the wake itself)."""
        self._held.pop(aid, None)
        self._renewing.discard(aid)

    def held(self) -> list[str]:
        return list(self._held)

    def lapsing(self, now: float) -> list[str]:
        """The holds to renew now (half their lease gone, or their entry unknown), each
        returned once until its `renew` (or a `drop`) ends."""
        due = [
            aid
            for aid, hold in self._held.items()
            if aid not in self._renewing
            and (
                hold.published is None
                or hold.published.until is None
                or (hold.published.until - now < self._lease / 2)
            )
        ]
        self._renewing.update(due)
        return due

    async def renew(self, aid: str, *, release: bool) -> bool:
        """Renew the hold of `aid`, or release it (`release`: its connections are gone, or the
        registry drains). False if a newer generation took the actor over meanwhile: the hold
        is dropped, and the caller closes the connections it held."""
        try:
            hold = self._held.get(aid)
            if hold is None:
                return True
            now = time.time()
            if release:
                if await self._publish(aid, hold, Lease(hold.due, None)):
                    del self._held[aid]
                return True
            published = hold.published
            if published is None or published.until is None or published.until <= now:
                newest = await self._workers.upkeep(self._ownership.newest_generation, aid)
                if newest != hold.generation:
                    del self._held[aid]
                    return False
            await self._publish(aid, hold, Lease(hold.due, now + self._lease))
            return True
        finally:
            self._renewing.discard(aid)

    async def _publish(self, aid: str, hold: _Hold, lease: Lease) -> bool:
        """Write `lease` as the hold's entry; whether it was written. A store error is logged,
        not raised: the hold is renewed (or released) again at the next round, and meanwhile its
        lease runs out at worst, as a dead owner's does."""
        previous = hold.published

        def write() -> None:
            self._ownership.publish(aid, hold.generation, hold.name, hold.key, lease, previous)

        try:
            await self._workers.upkeep(write)
        except KvError:
            hold.published = None
            log.exception("actor %s: the lease its sockets hold here was not written", aid)
            return False
        except BaseException:
            hold.published = None
            raise
        hold.published = lease
        return True
