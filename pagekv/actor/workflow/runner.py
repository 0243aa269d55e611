"""Running a workflow as its actor's `run` handler: execution, waits, outcome, rollback.

One runner per live instance, and the instance runs at most one run handler at a time, so a
workflow never executes twice concurrently; a wake that races a due deadline only finds the
handler running (or starts it once). Waits (sleeps, retry backoff, message waits) happen in place
and do not keep the actor awake: the earliest deadline is a row of the actor's ordinary schedule
table (`WORKFLOW_WAKE`), written in the same transaction as the entry that waits, so a sleeping
or restarted actor is woken on time by the same mechanism as any schedule, and neither can
overwrite the other's deadline. After a wake the workflow replays from the top.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, assert_never, cast

import anyio
import apsw
import cbor2

from pagekv.actor.async_db import ActorDb
from pagekv.actor.queue import Message
from pagekv.actor.schedule import WORKFLOW_WAKE
from pagekv.actor.tables.sql import (
    QueueMessage,
    ScheduledCall,
    queue_delete,
    queue_messages,
    schedule_cancel,
    schedule_due,
    schedule_put,
)
from pagekv.actor.workflow.errors import (
    EntryInProgress,
    HistoryDiverged,
    RollbackCheckpointError,
    WorkflowChangeRefused,
    WorkflowFormatError,
)
from pagekv.actor.workflow.history import (
    Entry,
    History,
    PendingWrite,
    Status,
    WorkflowState,
    child,
    readable,
    subtree_range,
)
from pagekv.actor.workflow.hosts import RunHost
from pagekv.actor.workflow.payloads import (
    PENDING_BRANCH,
    Join,
    Kind,
    Messages,
    Race,
    ReceivedMessage,
    StepDone,
)
from pagekv.actor.workflow.primitives import (
    INFRASTRUCTURE,
    RollbackStop,
    WorkflowContext,
    check_encodable,
    describe_error,
    unwrap,
)
from pagekv.actor.workflow.step import RollbackFn, StepContext

WorkflowFn = Callable[[WorkflowContext], Awaitable[Any]]
log = logging.getLogger("pagekv.actor.workflow")
_CODE_ERRORS = (HistoryDiverged, EntryInProgress, RollbackCheckpointError)
"""The code does not fit its history: the workflow fails, and is tried again on the next wake
(a deploy with `wf.removed(...)` may have fixed it); detected before any side effect."""
_KEEP = object()
_NO_ARGS = cbor2.dumps([])
"""The arguments of the wake row (it calls no action)."""


@dataclass(frozen=True)
class WorkflowStatus:
    state: WorkflowState
    output: Any
    error: dict[str, Any] | None


class Runner:
    def __init__(self, instance: RunHost, fn: WorkflowFn) -> None:
        self.instance = instance
        self.fn = fn
        self.history = History()
        self.loaded = False
        self.rollback_mode = False
        self.checkpointed = False
        self._rollbacks: list[tuple[Entry, RollbackFn]] = []
        self._deadlines: list[float] = []
        self._wake_due: float | None = None
        self._held: set[int] = set()
        """Queue ids received as completable and not completed yet: never delivered twice."""

    @property
    def db(self) -> ActorDb:
        return self.instance.ctx.db

    async def load(self) -> None:
        """Read the history; only while the run handler is not running (it owns `history`)."""
        self.history, self._wake_due = await self.db.locked(_load, internal=True)
        self._held = {
            m.id
            for e in self.history.entries.values()
            if isinstance(e.data, Messages) and e.data.completable
            for m in e.data.messages
            if not m.completed and not m.returned
        }
        self.loaded = True

    # -- the run handler --------------------------------------------------------------------

    async def run(self) -> None:
        """Execute or resume the workflow until it settles or the instance stops."""
        try:
            await self.load()
        except WorkflowFormatError as e:
            log.error("actor %s: workflow not run: %s", self.instance.actor_id, e)
            return
        state = self.history.state
        match state:
            case WorkflowState.COMPLETED | WorkflowState.CANCELLED:
                return
            case WorkflowState.FAILED:
                if not (self.history.error or {}).get("code_error"):
                    return
            case WorkflowState.ROLLING_BACK:
                await self._roll_back()
                return
            case WorkflowState.PENDING | WorkflowState.RUNNING | WorkflowState.SLEEPING:
                pass
            case _:
                assert_never(state)
        await self._execute()

    async def _execute(self) -> None:
        history = self.history
        history.restart()
        self.rollback_mode, self.checkpointed = False, False
        self._rollbacks.clear()
        history.set_state(WorkflowState.RUNNING)
        wf = WorkflowContext(self, "")
        try:
            try:
                output = await self.fn(wf)
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
            wf._finish()
            check_encodable(output, "the workflow's output")
        except _CODE_ERRORS as e:
            log.error("actor %s: workflow does not fit its history: %s", self.instance.actor_id, e)
            history.set_outcome(WorkflowState.FAILED, error=_error(e, code_error=True))
        except INFRASTRUCTURE:
            raise
        except Exception as e:
            log.warning("actor %s: workflow failed: %s", self.instance.actor_id, e)
            if self.checkpointed:
                history.set_outcome(WorkflowState.ROLLING_BACK, error=_error(e))
                await self.flush()
                await self._roll_back()
                return
            history.set_outcome(WorkflowState.FAILED, error=_error(e))
        else:
            history.set_outcome(WorkflowState.COMPLETED, output=output)
        await self._settle()

    async def _settle(self) -> None:
        """Write the outcome and drop the workflow's wake row, in one transaction."""
        self._deadlines.clear()
        async with self.transaction(wake=None):
            pass

    # -- rollback ---------------------------------------------------------------------------

    def register_rollback(self, entry: Entry, handler: RollbackFn) -> None:
        self._rollbacks.append((entry, handler))

    async def _roll_back(self) -> None:
        """Replay the workflow in rollback mode (recorded outcomes only, every join and race
        branch and every kept loop iteration) to find the handlers, then run them. Always a
        replay, never the handlers the failed execution registered: that execution may have
        replayed only part of the history (after a restart it skips settled branches and old
        iterations), and a restart mid-rollback has to find the same handlers anyway."""
        self.history.restart()
        self.rollback_mode, self.checkpointed = True, False
        self._rollbacks.clear()
        try:
            await self.fn(WorkflowContext(self, ""))
        except RollbackStop:
            pass
        except INFRASTRUCTURE:
            raise
        except Exception as e:
            log.debug("actor %s: rollback replay ended with %s", self.instance.actor_id, e)
        await self._run_rollbacks()

    async def _run_rollbacks(self) -> None:
        """Run the handlers newest completion first; each success is recorded as it happens."""
        history = self.history
        unique = {entry.location: (entry, handler) for entry, handler in self._rollbacks}
        order = sorted(unique.values(), key=lambda r: (r[0].completed or 0, r[0].seq))
        for registered, handler in reversed(order):
            entry = history.entries[registered.location]
            if entry.rollback_completed is not None:
                continue
            step_ctx = StepContext(self.instance.ctx, entry.name, 1)
            try:
                async with self.transaction() as staged:
                    await handler(step_ctx, entry.payload(StepDone).output)
                    staged.append(replace(entry, rollback_completed=time.time()))
            except INFRASTRUCTURE:
                raise
            except Exception as e:
                entry.rollback_error = describe_error(e)
                history.put(entry)
                error = {**(history.error or {}), "rollback_error": entry.rollback_error}
                history.set_outcome(WorkflowState.FAILED, error=error)
                await self._settle()
                return
            finally:
                step_ctx.close()
        history.set_outcome(WorkflowState.FAILED, error=history.error)
        await self._settle()

    # -- writing ----------------------------------------------------------------------------

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
            await self.instance.announce_wake(wake)
        taken: list[PendingWrite] = []  # the history this commit writes, once the block is done
        try:
            async with self.db.transaction(before_commit=lambda c: self._write(c, taken[0], wake)):
                yield staged
                taken.append(self.history.take_pending(staged))
        except BaseException:
            if taken:
                self.history.not_committed(taken[0])
            raise
        self.history.committed(taken[0])
        if wake is not _KEEP:
            self._wake_due = wake  # type: ignore[assignment]
            await self.instance.refresh_wake()

    def _write(self, connection: apsw.Connection, batch: PendingWrite, wake: object) -> None:
        """In the commit's worker hop: only `batch`, taken from memory on the event loop, is
        read here, so branches changing the history meanwhile share nothing with this thread."""
        batch.write(connection)
        if wake is None:
            schedule_cancel(connection, WORKFLOW_WAKE)
        elif wake is not _KEEP:
            due = cast(float, wake)
            call = ScheduledCall(WORKFLOW_WAKE, due, WORKFLOW_WAKE, _NO_ARGS, None, time.time())
            schedule_put(connection, call)

    async def flush(self) -> None:
        """Make the pending history durable now (no-op if nothing changed)."""
        wake = min(self._deadlines) if self._deadlines else None
        if self.history.dirty() or (wake is not None and wake != self._wake_due):
            async with self.transaction():
                pass

    # -- waiting ----------------------------------------------------------------------------

    async def wait(self, deadline: float | None, arrival: anyio.Event | None = None) -> None:
        """Wait until `deadline` (or `arrival` is set), letting the actor sleep meanwhile."""
        if deadline is not None:
            self._deadlines.append(deadline)
        try:
            self.history.set_state(WorkflowState.SLEEPING)
            await self.flush()
            remaining = None if deadline is None else max(0.0, deadline - time.time())
            with self.instance.waiting(), anyio.move_on_after(remaining):
                if arrival is None:
                    await anyio.sleep_forever()
                else:
                    await arrival.wait()
        finally:
            if deadline is not None:
                self._deadlines.remove(deadline)
        self.history.set_state(WorkflowState.RUNNING)

    # -- messages ---------------------------------------------------------------------------

    async def receive(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message]:
        queue = self.instance.ctx.queue
        while True:
            arrival = queue.arrival()
            batch = await self._take(entry, names, count, completable)
            if batch is not None:
                return batch
            deadline = entry.payload(Messages).deadline
            if deadline is not None and time.time() >= deadline:
                entry.status, entry.completed = Status.COMPLETED, time.time()
                self.history.put(entry)
                return []
            await self.wait(deadline, arrival)

    async def _take(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message] | None:
        """Receive and record in one transaction: a message leaves the queue exactly when its
        history entry is written (unless completable: then at `complete()`). A plain read looks
        first, so waiting on an empty queue never takes the actor's exclusive transaction.

        What other branches hold is read again once the transaction is under way, and what
        this receive holds is held before it ends: two branches never take one message."""
        peek = await self.db.locked(self._select(names, count), internal=True)
        if not peek:
            return None
        taken: set[int] = set()
        try:
            async with self.transaction() as staged:
                select = self._select(names, count)
                rows = await self.db.run(
                    lambda c: _take_rows(c, select(c), completable), internal=True
                )
                if not rows:
                    return None  # another branch took them meanwhile
                records = tuple(
                    ReceivedMessage(r.id, r.name, cbor2.loads(r.body), r.created, not completable)
                    for r in rows
                )
                received = replace(
                    entry.payload(Messages), messages=records, completable=completable
                )
                staged.append(entry.settled(data=received))
                if completable:
                    taken = {r.id for r in records}
                    self._held |= taken
        except BaseException:
            self._held -= taken
            raise
        return self.messages(staged[0])

    def _select(
        self, names: Sequence[str] | None, count: int
    ) -> Callable[[apsw.Connection], list[QueueMessage]]:
        """The query for up to `count` messages (of `names`) not held, as the held set is now."""
        skip = sorted(self._held)
        return lambda c: list(queue_messages(c, limit=count, names=names, skip=skip))

    async def return_messages(self, gone: Sequence[Entry], kept: Sequence[Entry] = ()) -> None:
        """Commit the pending history (a race's losers deleted, or `kept` for their rollback
        handlers), with what their entries had received given back: a message received as not
        completable goes back into the queue under its own id (so in its order), since no
        replay could receive it again; a completable one not yet completed never left the queue
        and only stops being held, as after a restart; one the branch completed stays consumed.
        A kept entry keeps its messages for the rollback replay, marked `returned`; one given
        back once (by a race nested in a loser) is not given back again. The rows go back with
        the pending history (`History.give_back`), so that whichever commit writes the losers'
        deletion writes them too."""
        rows = []
        for entry in [*gone, *kept]:
            if not isinstance(entry.data, Messages) or not entry.data.messages:
                continue
            received, marked = entry.data, []
            for record in received.messages:
                if record.returned:
                    marked.append(record)
                    continue
                if not received.completable:
                    body = cbor2.dumps(record.body)
                    rows.append(QueueMessage(record.id, record.name, body, record.created))
                elif not record.completed:
                    self._held.discard(record.id)
                marked.append(replace(record, returned=True))
            if entry in kept:
                self.history.put(replace(entry, data=replace(received, messages=tuple(marked))))
        self.history.give_back(rows)
        await self.flush()
        if rows or any(e.kind is Kind.MESSAGE for e in [*gone, *kept]):
            self.instance.ctx.queue.notify()

    def messages(self, entry: Entry) -> list[Message]:
        received = entry.payload(Messages)
        return [
            Message(
                record.id,
                record.name,
                record.body,
                record.created,
                _complete=(
                    _done
                    if record.completed or record.returned or self.rollback_mode
                    else partial(self._complete, entry.location, index)
                )
                if received.completable
                else None,
            )
            for index, record in enumerate(received.messages)
        ]

    async def _complete(self, location: str, index: int) -> None:
        """Delete a completable message and mark it completed in its entry, in one commit."""
        entry = self.history.entries[location]
        received = entry.payload(Messages)
        messages = list(received.messages)
        message_id = messages[index].id
        async with self.transaction() as staged:
            await self.db.run(lambda c: queue_delete(c, [message_id]), internal=True)
            messages[index] = replace(messages[index], completed=True)
            staged.append(replace(entry, data=replace(received, messages=tuple(messages))))
        self._held.discard(message_id)

    # -- handle operations ------------------------------------------------------------------

    async def status(self) -> WorkflowStatus:
        """From memory once the run handler loaded the history (it is ahead of the database,
        but an outcome counts only once committed: `History.visible_outcome`), else from the
        database; never replaces the history the run handler works on."""
        history = self.history
        if not self.loaded:
            history = await self.db.locked(History.load_outcome, internal=True)
        return WorkflowStatus(*history.visible_outcome())

    async def cancel(self) -> None:
        """Stop the workflow for good: once this returns no step runs, and later wakes do not
        run it (a wake while it cancels finds the run handler held)."""
        async with self._changing("cancel"):
            self.history.set_outcome(WorkflowState.CANCELLED)
            await self._settle()

    async def replay(self, location: str | None = None) -> None:
        """Forget the entry at `location` (as `describe` spells it, e.g. `retry/~2/charge`; if
        inside a loop, the outermost loop holding it: an outer loop's entry records its current
        iteration, so forgetting only an inner loop resumed the outer one past the entry) and
        every entry created after it, then run again. None replays the whole workflow."""
        async with self._changing("replay"):
            history = self.history
            if location is None:
                history.delete_from(0)
            else:
                target = self._target(location)
                self._reopen_branches(history.delete_from(target.seq))
            history.set_outcome(WorkflowState.PENDING)
            await self._settle()
        self.instance.start_run()

    @asynccontextmanager
    async def _changing(self, what: str) -> AsyncIterator[None]:
        """Around `cancel` and `replay`: the run handler held off and the history loaded. A
        rollback under way is refused and goes on (the handler it interrupted rolled back and
        runs again, once): cancelling it would leave completed steps never undone, replaying
        would forget which handlers ran."""
        async with self.instance.run_held():
            await self.load()
            if self.history.state is not WorkflowState.ROLLING_BACK:
                yield
                return
        self.instance.start_run()
        raise WorkflowChangeRefused(
            f"the workflow is rolling back; {what} it once it has failed "
            "(handle.workflow.status() says when)"
        )

    def _reopen_branches(self, forgotten: list[str]) -> None:
        """Mark every join and race branch that lost entries (`forgotten`) as not run: a join or
        race that recorded its branch as settled would skip it on the replay (only the code
        after the join re-ran, and the branch's entries were gone for good), and a replay in
        one branch forgets what the other branches did after it too. A race forgets its
        winner: it is run again from that point, its losers from their start."""
        names = {idx: name for name, idx in self.history.names.items()}
        for entry in list(self.history.entries.values()):
            if not isinstance(entry.data, Join | Race):
                continue
            prefix = entry.location + "/"
            segments = {
                loc[len(prefix) :].split("/")[0] for loc in forgotten if loc.startswith(prefix)
            }
            branches = {names.get(int(s)) for s in segments if s.isdigit()}
            if not branches:
                continue
            data = copy.deepcopy(entry.data)
            for branch in set(data.branches) & branches:
                data.branches[branch] = PENDING_BRANCH
            if isinstance(data, Race):
                data.winner = None
                for loser, status in data.branches.items():
                    if status.kept:
                        data.branches[loser] = replace(status, kept=False)
                        index = self.history.names[loser]
                        self.history.delete_range(*subtree_range(child(entry.location, index)))
            self.history.put(replace(entry, data=data, status=Status.PENDING, completed=None))

    def _target(self, path: str) -> Entry:
        """The entry a replay from `path` (a readable location) forgets from: that entry, or
        if it is inside a loop, the outermost loop holding it. Matched whole and then walked on
        the stored location, whose segments are name indexes and `~` iterations: a name may
        itself hold `/` or start with `~`, so the readable path cannot be split."""
        names = {idx: name for name, idx in self.history.names.items()}
        found = [e for loc, e in self.history.entries.items() if readable(loc, names) == path]
        if not found:
            raise WorkflowChangeRefused(f"the workflow history has no entry {path!r}")
        if len(found) > 1:
            raise WorkflowChangeRefused(
                f"{path!r} names {len(found)} entries of the history (names holding '/' or "
                "starting with '~' spell alike); nothing was replayed"
            )
        segments = found[0].location.split("/")
        loops = [i for i, s in enumerate(segments) if s.startswith("~")]
        if loops:
            return self.history.entries["/".join(segments[: loops[0]])]
        return found[0]


def _take_rows(
    connection: apsw.Connection, rows: list[QueueMessage], completable: bool
) -> list[QueueMessage]:
    if not completable:
        queue_delete(connection, [r.id for r in rows])
    return rows


def _load(connection: apsw.Connection) -> tuple[History, float | None]:
    return History.load(connection), schedule_due(connection, WORKFLOW_WAKE)


def _error(error: BaseException, *, code_error: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if code_error:
        record["code_error"] = True
    return record


async def _done() -> None:
    """`complete()` of a message whose completion is already recorded."""
