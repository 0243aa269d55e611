"""The lease entry of an awake actor (`LeaseKeeper`): which registry owns it, until when, and
when it must run next, as every registry of the store reads it (`directory/leases.py`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar, cast

import anyio

from pagekv.actor.async_db import ActorDb
from pagekv.actor.directory.leases import Lease, Ownership
from pagekv.actor.tables.sql import earliest_due
from pagekv.actor.worker_threads import Workers
from pagekv.kv import KvError

T = TypeVar("T")
log = logging.getLogger("pagekv.actor")


class LeaseKeeper:
    """Publishes and renews one instance's lease entry and the actor's wake time.

    Invariants (see `_target` for the lease's bounds):
    - the lease is published at the takeover, before any hook runs, and renewed with half of it
      still to go, so no other registry that routes takes a served actor over;
    - a schedule is covered before it commits (`announce`), so a crash between can only cause
      an early wake, never a missed one;
    - one write of the entry at a time, so `published` is what the index holds (None while that
      is unknown);
    - going to sleep publishes exactly when the actor must run next (`release`).
    """

    def __init__(
        self,
        *,
        actor_id: str,
        name: str,
        key: str,
        db: ActorDb,
        ownership: Ownership,
        workers: Workers,
        lease: float,
        next_due: float | None,
        run_pending: Callable[[], bool],
    ) -> None:
        self._actor_id = actor_id
        self._name = name
        self._key = key
        self._db = db
        self._ownership = ownership
        self._workers = workers
        self._run_pending = run_pending
        """Whether the run handler has work to do now (`RunHandler.pending`)."""
        self.next_due = next_due
        """When the actor's next schedule is due (its schedules' table). Event loop only, as
        are the fields below."""
        self._published: Lease | None = None
        """What the lease entry holds, once this instance wrote it."""
        self._lease = lease
        """Seconds its lease on the actor runs from each renewal while this instance holds it;
        0 once it gives the lease up to sleep (see `_target`)."""
        self._publishing = anyio.Lock()
        self.holding = False
        """It went to sleep keeping its lease, for the sockets this process holds
        (`realtime/holds.py`)."""
        self.released_due: float | None = None
        """The next run it published as it went to sleep."""

    @property
    def published(self) -> Lease | None:
        """What its lease entry holds, once written; None while that is unknown."""
        return self._published

    def _target(self, next_run: float | None, now: float) -> Lease:
        """The lease entry to publish at `now` (`leases.py`, which every registry of the
        store reads) for a next run at `next_run`: the one published already if it still does
        (no write), else a fresh one.

        Invariants, while this instance holds a lease (from its takeover, before any hook runs,
        until it goes to sleep):
        - `until` lies in [now + lease / 2, now + lease]: the registry's housekeeping renews it
          (`lapsing`) with half of it still to go, so other registries forward calls here
          rather than take the actor over. Only an event loop stalled that long, or clocks that
          disagree by as much, let another registry find it run out;
        - with a run pending, `due` is `max(next_run, until)`: never due while the lease is
          live, so no other registry's poll takes the actor from a healthy owner (it would run
          a due schedule a second time); and if this process dies, the actor is woken on time
          for its schedule or at most one lease after the death, whichever is later. Schedules
          stay at least once across crashes: one cut short by the crash runs again.
        Without a lease (going to sleep), `due` is exactly `next_run` and there is no owner;
        gone to sleep with its sockets held here (`holding`), it keeps the lease, and `due` is
        exactly `next_run` all the same, since only this registry's poll may wake it then
        (`socket_leases.py`).
        """
        lease = self._lease
        if not lease:
            return Lease(next_run, None)
        kept = self._published.until if self._published is not None else None
        until = kept if kept is not None and now + lease / 2 <= kept <= now + lease else now + lease
        if self.holding:
            return Lease(next_run, until)
        return Lease(None if next_run is None else max(next_run, until), until)

    async def _publish(
        self,
        next_run: float | None,
        *,
        then: Callable[[], T] | None = None,
        upkeep: bool = True,
    ) -> T | None:
        """Write the lease entry for `next_run` unless it is there already, then run `then` in the
        same worker hop and return its result; on the registry's upkeep threads unless `upkeep` is
        False (a wake, which a call waits for, shares the actors' pool). One write at a time, so
        what `_published` says is what the index holds; None while that is unknown (before the first
        write, and after one that failed: it may have landed), which makes the next write read the
        entries first (`Ownership.publish`)."""
        async with self._publishing:
            target = self._target(next_run, time.time())
            previous = self._published
            hop = self._workers.upkeep if upkeep else self._workers.run
            if target == previous:
                return None if then is None else await hop(then)
            ownership, name, key = self._ownership, self._name, self._key
            actor_id, generation = self._actor_id, self._db.database.generation

            def write() -> T | None:
                ownership.publish(actor_id, generation, name, key, target, previous)
                return None if then is None else then()

            try:
                result = await hop(write)
            except BaseException:
                self._published = None
                raise
            self._published = target
            return result

    async def publish_first(self, then: Callable[[], T]) -> T:
        """At the takeover: publish the lease, then run `then` in the same worker hop (on the
        actors' pool, which the waking call waits for) and return its result."""
        return cast(T, await self._publish(self.next_run(time.time()), then=then, upkeep=False))

    def next_run(self, now: float, run_pending: bool | None = None) -> float | None:
        """When the actor must run next: its next schedule, or `now` while its run handler has
        work (`RunHandler.pending`, or `run_pending` as it was before a stop), so that a
        workflow or a busy run handler cut off by a graceful stop resumes on the next registry
        at once, and after a crash within one lease (`_target`)."""
        pending = self._run_pending() if run_pending is None else run_pending
        if pending:
            return now if self.next_due is None else min(self.next_due, now)
        return self.next_due

    async def announce(self, due: float) -> None:
        """Before committing a schedule row due at `due`: make sure its lease entry covers it
        should this instance die (see `_target`). Written ahead of the commit, so a crash in
        between can only cause an early (harmless) wake, never a missed one; `refresh` sets
        the time after the commit."""
        next_run = self.next_run(time.time())
        await self._publish(due if next_run is None else min(due, next_run))

    async def refresh(self) -> None:
        """Record the next due schedule here and in the actor's durable lease entry."""
        self.next_due = await self._db.locked(earliest_due, internal=True)
        await self.publish_wake()

    async def publish_wake(self) -> None:
        """Write the lease entry for `next_run` unless it is there already."""
        await self._publish(self.next_run(time.time()))

    def late(self) -> bool:
        """The lease ran out (or its entry is unknown): a renewal must first prove that the
        instance still owns the actor."""
        published = self._published
        return published is None or published.until is None or published.until <= time.time()

    def lapsing(self, now: float) -> bool:
        """The lease entry must move on (its lease runs short, or the next run changed) and no
        write of it is under way."""
        return (
            not self._publishing.locked()
            and self._target(self.next_run(now), now) != self._published
        )

    async def release(self, run_pending: bool, *, holding: bool) -> None:
        """Going to sleep: give the lease up, so the next call is served wherever it arrives,
        and publish exactly the time the actor must run next (`next_run`, with the run handler
        as it was before the stop), so the actor is woken on time rather than a lease late.
        With connections open here (`holding`), keep the lease instead, which the registry then
        renews (`socket_leases.py`): the actor must wake where its sockets are."""
        self.holding = holding
        if not self.holding:
            self._lease = 0.0
        self.released_due = self.next_run(time.time(), run_pending)
        await self.publish_logged(self.released_due)

    async def publish_logged(self, next_run: float | None) -> None:
        """`_publish`, with a store error logged, not raised: the lease left behind still wakes
        the actor, at most one lease late."""
        try:
            await self._publish(next_run)
        except KvError:
            log.exception("actor %s: lease entry not written; woken a lease late", self._actor_id)
