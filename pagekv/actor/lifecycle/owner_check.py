"""Whether an instance still owns its actor (`OwnerCheck`): the reads that keep a stale
instance, taken over elsewhere without knowing it, from running calls or answering them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import anyio

from pagekv.actor.async_db import ActorDb
from pagekv.actor.lifecycle.phase import NotServing
from pagekv.actor.worker_threads import Workers
from pagekv.kv import ActorKv

FRESHNESS_S = 0.05
"""A call first checks that no other instance took the actor over (one KV read) unless this
instance checked less than this long ago, so a stale instance rarely runs user code at all. The
answer is what must be current: see `Calls._answer_current` (`calls.py`)."""


class OwnerCheck:
    """Proves that an instance still owns its actor, at the moments its calls need it.

    Fencing does the rest: a takeover elsewhere opens the database with a new generation, and
    every write of this instance carries its own, so a write after a takeover fails
    (`FenceMismatch`) and none lands. What fencing cannot catch is a call that writes nothing
    or the same value: that is what this check is for.

    Invariants: a generation read or a fenced commit begun after a moment proves ownership at
    that moment; one read at a time, shared by the calls that wait for it; once a takeover is
    found, the instance is never proven current again, it asks to crash (`on_taken_over`), and
    it is counted in `takeovers` once however many of its calls meet the takeover.
    """

    def __init__(
        self,
        actor_id: str,
        kv: ActorKv,
        db: ActorDb,
        workers: Workers,
        counters: Counter[str],
        *,
        checked_at: float,
        on_taken_over: Callable[[], None],
    ) -> None:
        self._actor_id = actor_id
        self._kv = kv
        self._db = db
        self._workers = workers
        self._counters = counters
        self._on_taken_over = on_taken_over
        self._checked_at = checked_at
        """When this instance last knew it was current (its takeover at start, then checks).
        Event loop only, as are the fields below."""
        self._checking: anyio.Event | None = None
        """Set when the generation check under way ends; None while none is."""
        self._taken_over = False
        """A generation check found another instance's takeover."""
        self._counted = False

    async def check_current(self) -> None:
        """Refuse the call before it runs (`NotServing`: the registry wakes a fresh instance,
        which takes the actor back) unless this instance was known to own the actor less than
        `FRESHNESS_S` ago."""
        if not await self.owned_recently():
            raise NotServing(f"actor {self._actor_id} was taken over elsewhere")

    async def owned_recently(self) -> bool:
        """Whether this instance owned the actor less than `FRESHNESS_S` ago."""
        return await self.owned_since(time.monotonic() - FRESHNESS_S)

    async def owned_since(self, since: float) -> bool:
        """Whether this instance owned the actor at some moment after `since`: a commit since
        then passed the fence, or a generation read begun since then says so (one KV read,
        shared by the calls that wait for it). False once a takeover was found, which tears the
        instance down (counted once)."""
        while max(self._checked_at, self._db.proven_at) < since:
            if self._taken_over:
                return False
            if self._checking is not None:
                await self._checking.wait()
                continue
            self._checking = checking = anyio.Event()
            started = time.monotonic()
            try:
                generation = await self._workers.run(self._kv.generation)
            finally:
                self._checking = None
                checking.set()
            if generation != self._db.database.generation:
                self._taken_over = True
                self._on_taken_over()
                self.count_takeover()
                return False
            self._checked_at = max(self._checked_at, started)
        return True

    def count_takeover(self) -> None:
        """Count this instance as taken over (`takeovers`): once, however many of its calls
        meet the takeover."""
        if not self._counted:
            self._counted = True
            self._counters["takeovers"] += 1
