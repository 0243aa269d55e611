"""The workflow's history in memory and the transactions that make it durable, with its wake row.

Split from the run handler because every part of a running workflow writes through it (steps,
receives, completions, rollback handlers, the outcome) while only the run handler decides what
runs: it owns the one copy of the history the others read and record into.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import anyio
import apsw
import cbor2

from pagekv.actor.async_db import ActorDb
from pagekv.actor.schedule import WORKFLOW_WAKE
from pagekv.actor.tables.sql import ScheduledCall, schedule_cancel, schedule_due, schedule_put
from pagekv.actor.workflow.history import Entry, History, PendingWrite, WorkflowState
from pagekv.actor.workflow.hosts import RunHost

_KEEP = object()
_NO_ARGS = cbor2.dumps([])
"""The arguments of the wake row (it calls no action)."""


class Journal:
    """The history one runner works on, and the only way it is written.

    Invariants: an entry reaches the database only in a commit that also writes every pending
    change before it (`History.take_pending`), and memory counts it as written only once that
    commit is done; the wake row (`WORKFLOW_WAKE`) holds the earliest deadline any wait of this
    execution is in, written in the same commit as the entry that waits, and is gone once the
    workflow settles. The wake time is announced to the instance before it commits and
    refreshed after, so a sleeping actor is never woken late.
    """

    def __init__(self, instance: RunHost) -> None:
        self._instance = instance
        self.history = History()
        """Event loop only; replaced only by `load`, which runs while the run handler does not."""
        self.loaded = False
        """Event loop only: `history` was read from the database (it may be ahead of it since)."""
        self._deadlines: list[float] = []
        """Event loop only: the deadline of each wait under way; the wake row holds the least."""
        self._wake_due: float | None = None
        """Event loop only: the wake row's due time as last committed (None: no row)."""

    @property
    def db(self) -> ActorDb:
        return self._instance.ctx.db

    async def load(self) -> None:
        """Read the history and the wake row; only while the run handler is not running."""
        self.history, self._wake_due = await self.db.locked(_load, internal=True)
        self.loaded = True

    @asynccontextmanager
    async def transaction(self, *, wake: object = _KEEP) -> AsyncIterator[list[Entry]]:
        """A database transaction that also writes the pending history, the `staged` entries
        (applied to memory only once committed) and the wake row (`wake=None` deletes it)."""
        if wake is _KEEP and self._deadlines:
            wake = min(self._deadlines)
        if wake == self._wake_due:
            wake = _KEEP
        staged: list[Entry] = []
        if isinstance(wake, int | float):
            await self._instance.announce_wake(wake)
        taken: list[PendingWrite] = []  # the history this commit writes, once the block is done
        try:
            async with self.db.transaction(before_commit=lambda c: _write(c, taken[0], wake)):
                yield staged
                taken.append(self.history.take_pending(staged))
        except BaseException:
            if taken:
                self.history.not_committed(taken[0])
            raise
        self.history.committed(taken[0])
        if wake is not _KEEP:
            self._wake_due = wake  # type: ignore[assignment]
            await self._instance.refresh_wake()

    async def flush(self) -> None:
        """Make the pending history durable now (no-op if nothing changed)."""
        wake = min(self._deadlines) if self._deadlines else None
        if self.history.dirty() or (wake is not None and wake != self._wake_due):
            async with self.transaction():
                pass

    async def settle(self) -> None:
        """Write the outcome and drop the workflow's wake row, in one transaction."""
        self._deadlines.clear()
        async with self.transaction(wake=None):
            pass

    async def wait(self, deadline: float | None, arrival: anyio.Event | None = None) -> None:
        """Wait until `deadline` (or `arrival` is set), letting the actor sleep meanwhile."""
        if deadline is not None:
            self._deadlines.append(deadline)
        try:
            self.history.set_state(WorkflowState.SLEEPING)
            await self.flush()
            remaining = None if deadline is None else max(0.0, deadline - time.time())
            with self._instance.waiting(), anyio.move_on_after(remaining):
                if arrival is None:
                    await anyio.sleep_forever()
                else:
                    await arrival.wait()
        finally:
            if deadline is not None:
                self._deadlines.remove(deadline)
        self.history.set_state(WorkflowState.RUNNING)


def _write(connection: apsw.Connection, batch: PendingWrite, wake: object) -> None:
    """In the commit's worker hop: only `batch`, taken from memory on the event loop, is read
    here, so branches changing the history meanwhile share nothing with this thread."""
    batch.write(connection)
    if wake is None:
        schedule_cancel(connection, WORKFLOW_WAKE)
    elif wake is not _KEEP:
        due = cast(float, wake)
        call = ScheduledCall(WORKFLOW_WAKE, due, WORKFLOW_WAKE, _NO_ARGS, None, time.time())
        schedule_put(connection, call)


def _load(connection: apsw.Connection) -> tuple[History, float | None]:
    return History.load(connection), schedule_due(connection, WORKFLOW_WAKE)
