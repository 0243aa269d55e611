"""`ctx.db`: async SQL on the actor's own database, serialised per actor.

All SQLite work of one actor runs one call at a time (`_serial`), on the registry's pool of worker
threads (`worker_threads.py`: a slow KV blocks only the actors whose work waits on it) or inline on
a store that never waits. A transaction holds the actor's database lock from BEGIN to COMMIT, so
statements of other concurrently running actions wait instead of landing inside it; the actor's
state is written in the same commit."""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, TypeVar

import anyio
import apsw

from pagekv.actor import call_chain
from pagekv.actor.errors import ActorStopped, ActorTakenOver, ReservedName
from pagekv.actor.gate import Gate
from pagekv.actor.request_writes import note_writes
from pagekv.actor.state import StateCell
from pagekv.actor.tables.schema import Reserved
from pagekv.actor.worker_threads import Workers
from pagekv.kv import FenceMismatch
from pagekv.vfs import Database

T = TypeVar("T")
_in_transaction: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "pagekv_actor_transaction", default=None
)
_rollbacks: contextvars.ContextVar[list[ActorDb] | None] = contextvars.ContextVar(
    "pagekv_actor_rollbacks", default=None
)


@contextmanager
def noting_rollbacks() -> Iterator[list[ActorDb]]:
    """The transactions that a cancellation rolled back in this task (and the tasks it starts)
    while the block ran, one entry (their database) each: the innermost noting alone counts
    them, so a call learns of its own transactions, not those of the calls it makes."""
    noted: list[ActorDb] = []
    token = _rollbacks.set(noted)
    try:
        yield noted
    finally:
        _rollbacks.reset(token)


class ActorDb:
    def __init__(self, database: Database, state: StateCell, gate: Gate, workers: Workers) -> None:
        self.database = database
        self.state = state
        self.gate = gate
        self.workers = workers
        self.reserved = Reserved()
        database.connection.authorizer = self.reserved
        self._serial = anyio.Lock(fast_acquire=True)
        """Held for each piece of work on a worker thread: one at a time on the connection.
        Inline work needs none (it runs within one step of the event loop)."""
        self._lock = anyio.Lock(fast_acquire=True)
        self._begin_pending = False
        """A transaction began but no statement ran yet: its first worker hop starts with BEGIN
        (one hop fewer per transaction). Only the task holding `_lock` runs statements then."""
        self._after_transaction: list[Callable[[], Awaitable[None]]] = []
        self._death_cause: BaseException | None = None
        self.proven_at = float("-inf")
        """`time.monotonic()` just before the latest worker hop that committed: the commit passed
        the fence, so the actor was still this instance's at some moment after then."""

    async def run(self, fn: Callable[[apsw.Connection], T], *, internal: bool = False) -> T:
        """Run `fn(connection)` on the worker, translating storage death into actor errors."""

        committed = [0]

        def work() -> T:
            self.reserved.internal = internal
            self.reserved.violation = None
            before, issued = self.database.commits, time.monotonic()
            try:
                if self._begin_pending:
                    self.database.connection.execute("BEGIN IMMEDIATE")
                    self._begin_pending = False
                return fn(self.database.connection)
            except Exception as e:
                if self.database.is_dead:
                    raise self.death() from e
                if isinstance(e, apsw.ConnectionClosedError):
                    raise ActorStopped("the actor stopped while this statement ran") from e
                if isinstance(e, apsw.AuthError) and self.reserved.violation:
                    raise ReservedName(
                        f"{self.reserved.violation!r}: the table prefix '_pagekv_' is reserved "
                        "for the runtime's own tables"
                    ) from e
                raise
            finally:
                self.reserved.internal = False
                committed[0] = self.database.commits - before
                if committed[0] and not self.database.is_dead:
                    self.proven_at = max(self.proven_at, issued)

        try:
            return await self._serialised(work)
        finally:
            note_writes(committed=committed[0] > 0, unknown=self.database.outcome_unknown)

    async def _serialised(self, fn: Callable[[], T]) -> T:
        if self.workers.inline:
            return await self.workers.run(fn)
        async with self._serial:
            return await self.workers.run(fn)

    async def close(self) -> None:
        """Close the database once no work of it runs (never under a running statement)."""
        await self._serialised(self.database.close)

    def death(self) -> Exception:
        """The error for a hop that met the dead database: the same for every hop, so that
        each call that meets a fenced-off database learns it was taken over (the database
        hands its cause out once)."""
        if self._death_cause is None:
            self._death_cause = self.database.take_last_kv_error()
        cause = self._death_cause
        if isinstance(cause, FenceMismatch):
            return ActorTakenOver(f"another instance took this actor over: {cause}")
        return ActorStopped(f"the actor's database failed: {cause!r}")

    async def locked(self, fn: Callable[[apsw.Connection], T], *, internal: bool = False) -> T:
        """`run` under the database lock, unless this task is inside a transaction already;
        `CallCycle` if the lock is a transaction's that waits for this task (`call_chain.py`)."""
        if _in_transaction.get() is self:
            return await self.run(fn, internal=internal)
        self.gate.refuse_cycle(call_chain.current())
        async with self._lock:
            return await self.run(fn, internal=internal)

    async def execute(self, sql: str, bindings: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run SQL (autocommit outside a transaction) and return all rows."""
        _refuse_reserved_rename(sql)
        return await self.locked(lambda c: c.execute(sql, bindings).fetchall())

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        _refuse_reserved_rename(sql)
        await self.locked(lambda c: c.executemany(sql, rows).fetchall())

    @asynccontextmanager
    async def transaction(
        self, *, before_commit: Callable[[apsw.Connection], None] | None = None
    ) -> AsyncIterator[ActorDb]:
        """BEGIN ... COMMIT around the block, with the actor's state saved in the same commit.

        If the block raises or the commit fails, the SQL is rolled back and the state restored
        to what it was at BEGIN; so does a cancellation (a stop past `stop_grace`), before the
        lock is released. No other action runs meanwhile (see `gate.py`); the transaction is a
        frame of the call chain, so a call back into this actor from inside it fails at once
        (`CallCycle`). `before_commit(connection)` runs internal writes in the commit's own
        worker hop.
        """
        if _in_transaction.get() is self:
            raise RuntimeError("ctx.db.transaction() does not nest; use SAVEPOINT inside it")
        with call_chain.entering(self.gate.actor_id) as frame:
            async with self.gate.exclusive(frame), self._lock:
                token = _in_transaction.set(self)
                snapshot = self.state.snapshot()
                try:
                    self._begin_pending = True
                    try:
                        yield self
                        commit = partial(self._commit, before=before_commit)
                        self.state.mark_saved(await self.run(commit, internal=True))
                    except BaseException as e:
                        with anyio.CancelScope(shield=True):
                            self.state.restore(snapshot)
                            if not self.database.is_dead and not self._begin_pending:
                                await self.run(_rollback)
                        noted = _rollbacks.get()
                        if noted is not None and isinstance(e, anyio.get_cancelled_exc_class()):
                            noted.append(self)
                        raise
                finally:
                    self._begin_pending = False
                    _in_transaction.reset(token)
                    after, self._after_transaction = self._after_transaction, []
        with anyio.CancelScope(shield=True):
            for fn in after:
                await fn()

    async def after_transaction(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `fn` once the transaction this task is in ends (committed or rolled back), or at
        once outside one: what it computes from the database must not see a change that may
        still be rolled back (the wake time of a schedule cancelled inside a transaction)."""
        if _in_transaction.get() is self:
            self._after_transaction.append(fn)
        else:
            await fn()

    def _commit(
        self,
        connection: apsw.Connection,
        before: Callable[[apsw.Connection], None] | None = None,
    ) -> bytes | None:
        if before is not None:
            before(connection)
        written = self.state.write_if_changed(connection)
        connection.execute("COMMIT")
        return written

    async def save_state(self, also: Callable[[apsw.Connection], None] | None = None) -> None:
        """Make the state durable now (its own commit) if it changed, with what `also` writes
        (the runtime's own rows) in the same commit; no worker hop if there is nothing."""
        if also is None:
            if self.state.changed() is not None:
                written = await self.locked(self.state.write_if_changed, internal=True)
                self.state.mark_saved(written)
            return

        def write(connection: apsw.Connection) -> bytes | None:
            with connection:
                also(connection)
                written = self.state.write_if_changed(connection)
            return written

        self.state.mark_saved(await self.locked(write, internal=True))


def _rollback(connection: apsw.Connection) -> None:
    if connection.in_transaction:
        connection.execute("ROLLBACK")


_RENAME = re.compile(r"\balter\b.*\brename\b.*_pagekv_", re.IGNORECASE | re.DOTALL)


def _refuse_reserved_rename(sql: str) -> None:
    """The authorizer sees only a renamed table's old name; catch renames *to* the prefix."""
    if _RENAME.search(sql):
        raise ReservedName(
            "ALTER TABLE ... RENAME to a '_pagekv_' name: the prefix is reserved for the "
            "runtime's own tables"
        )
