"""Running a workflow as its actor's `run` handler: execution, waits, outcome, rollback.

One runner per live instance, and the instance runs at most one run handler at a time, so a
workflow never executes twice concurrently; a wake that races a due deadline only finds the
handler running (or starts it once). Waits (sleeps, retry backoff, message waits) happen in place
and do not keep the actor awake: the earliest deadline is a row of the actor's ordinary schedule
table (`WORKFLOW_WAKE`), written in the same transaction as the entry that waits (`Journal`), so a
sleeping or restarted actor is woken on time by the same mechanism as any schedule, and neither
can overwrite the other's deadline. After a wake the workflow replays from the top.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, assert_never

from pagekv.actor.async_db import ActorDb
from pagekv.actor.queue import Message
from pagekv.actor.workflow.errors import (
    EntryInProgress,
    HistoryDiverged,
    RollbackCheckpointError,
    WorkflowChangeRefused,
    WorkflowFormatError,
)
from pagekv.actor.workflow.history import Entry, History, WorkflowState
from pagekv.actor.workflow.hosts import RunActor, RunHost
from pagekv.actor.workflow.journal import Journal
from pagekv.actor.workflow.mailbox import Mailbox
from pagekv.actor.workflow.primitives import (
    INFRASTRUCTURE,
    RollbackStop,
    WorkflowContext,
    check_encodable,
    unwrap,
)
from pagekv.actor.workflow.rewind import rewind
from pagekv.actor.workflow.rollback import Rollbacks
from pagekv.actor.workflow.step import RollbackFn

WorkflowFn = Callable[[WorkflowContext], Awaitable[Any]]
log = logging.getLogger("pagekv.actor.workflow")
_CODE_ERRORS = (HistoryDiverged, EntryInProgress, RollbackCheckpointError)
"""The code does not fit its history: the workflow fails, and is tried again on the next wake
(a deploy with `wf.removed(...)` may have fixed it); detected before any side effect."""


@dataclass(frozen=True)
class WorkflowStatus:
    state: WorkflowState
    output: Any
    error: dict[str, Any] | None


class Runner:
    """The run handler of one workflow actor: runs the workflow function until it settles,
    rolls it back after a failure past a checkpoint, and serves the handle's status, cancel and
    replay.

    Invariants: at most one execution at a time (the instance runs one run handler, and
    `cancel`/`replay` hold it off); every execution replays the history from the top with a
    fresh `Execution`, so nothing one execution registered or set leaks into the next; the
    outcome and the wake row's deletion commit together (`Journal.settle`). Its fields are set
    once: the history, the writes and the held messages live in `journal` and `mailbox`.
    """

    def __init__(self, instance: RunHost, fn: WorkflowFn) -> None:
        self.instance = instance
        self.fn = fn
        self.journal = Journal(instance)
        self.mailbox = Mailbox(instance, self.journal)

    @property
    def db(self) -> ActorDb:
        return self.journal.db

    async def load(self) -> None:
        """Read the history; only while the run handler is not running (it owns the history)."""
        await self.journal.load()
        self.mailbox.hold_received()

    async def run(self) -> None:
        """Execute or resume the workflow until it settles or the instance stops."""
        try:
            await self.load()
        except WorkflowFormatError as e:
            log.error("actor %s: workflow not run: %s", self.instance.actor_id, e)
            return
        history = self.journal.history
        state = history.state
        match state:
            case WorkflowState.COMPLETED | WorkflowState.CANCELLED:
                return
            case WorkflowState.FAILED:
                if not (history.error or {}).get("code_error"):
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
        history = self.journal.history
        history.restart()
        execution = Execution(self.instance, self.journal, self.mailbox, rollback_mode=False)
        history.set_state(WorkflowState.RUNNING)
        wf = WorkflowContext(execution, "")
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
            if execution.checkpointed:
                history.set_outcome(WorkflowState.ROLLING_BACK, error=_error(e))
                await self.journal.flush()
                await self._roll_back()
                return
            history.set_outcome(WorkflowState.FAILED, error=_error(e))
        else:
            history.set_outcome(WorkflowState.COMPLETED, output=output)
        await self.journal.settle()

    async def _roll_back(self) -> None:
        """Replay the workflow in rollback mode (recorded outcomes only, every join and race
        branch and every kept loop iteration) to find the handlers, then run them. Always a
        replay, never the handlers the failed execution registered: that execution may have
        replayed only part of the history (after a restart it skips settled branches and old
        iterations), and a restart mid-rollback has to find the same handlers anyway."""
        self.journal.history.restart()
        execution = Execution(self.instance, self.journal, self.mailbox, rollback_mode=True)
        try:
            await self.fn(WorkflowContext(execution, ""))
        except RollbackStop:
            pass
        except INFRASTRUCTURE:
            raise
        except Exception as e:
            log.debug("actor %s: rollback replay ended with %s", self.instance.actor_id, e)
        await execution.rollbacks.run(self.journal, self.instance.ctx)
        await self.journal.settle()

    # -- handle operations ------------------------------------------------------------------

    async def status(self) -> WorkflowStatus:
        """From memory once the run handler loaded the history (it is ahead of the database,
        but an outcome counts only once committed: `History.visible_outcome`), else from the
        database; never replaces the history the run handler works on."""
        history = self.journal.history
        if not self.journal.loaded:
            history = await self.db.locked(History.load_outcome, internal=True)
        return WorkflowStatus(*history.visible_outcome())

    async def cancel(self) -> None:
        """Stop the workflow for good: once this returns no step runs, and later wakes do not
        run it (a wake while it cancels finds the run handler held)."""
        async with self._changing("cancel"):
            self.journal.history.set_outcome(WorkflowState.CANCELLED)
            await self.journal.settle()

    async def replay(self, location: str | None = None) -> None:
        """Forget the entry at `location` (as `describe` spells it, e.g. `retry/~2/charge`; if
        inside a loop, the outermost loop holding it: an outer loop's entry records its current
        iteration, so forgetting only an inner loop resumed the outer one past the entry) and
        every entry created after it, then run again. None replays the whole workflow."""
        async with self._changing("replay"):
            rewind(self.journal.history, location)
            self.journal.history.set_outcome(WorkflowState.PENDING)
            await self.journal.settle()
        self.instance.start_run()

    @asynccontextmanager
    async def _changing(self, what: str) -> AsyncIterator[None]:
        """Around `cancel` and `replay`: the run handler held off and the history loaded. A
        rollback under way is refused and goes on (the handler it interrupted rolled back and
        runs again, once): cancelling it would leave completed steps never undone, replaying
        would forget which handlers ran."""
        async with self.instance.run_held():
            await self.load()
            if self.journal.history.state is not WorkflowState.ROLLING_BACK:
                yield
                return
        self.instance.start_run()
        raise WorkflowChangeRefused(
            f"the workflow is rolling back; {what} it once it has failed "
            "(handle.workflow.status() says when)"
        )


class Execution:
    """One execution of the workflow function from the top, as its `wf` scopes see it
    (`ScopeHost`): the runner's journal and mailbox, the mode it runs in, and what it collects.

    Why its own object: what an execution collects (the rollback handlers, whether a
    checkpoint was passed) must start empty each time, and a fresh object makes that so.
    Invariant: in rollback mode no step runs and no message becomes completable. Its fields are
    event loop only; `checkpointed` and `rollbacks` are written by its `wf` scopes and read by
    the runner once the function returned.
    """

    def __init__(
        self, instance: RunActor, journal: Journal, mailbox: Mailbox, *, rollback_mode: bool
    ) -> None:
        self._instance = instance
        self._journal = journal
        self._mailbox = mailbox
        self._rollback_mode = rollback_mode
        self.checkpointed = False
        self.rollbacks = Rollbacks()

    @property
    def instance(self) -> RunActor:
        return self._instance

    @property
    def history(self) -> History:
        return self._journal.history

    @property
    def rollback_mode(self) -> bool:
        return self._rollback_mode

    def transaction(self) -> AbstractAsyncContextManager[list[Entry]]:
        return self._journal.transaction()

    async def flush(self) -> None:
        await self._journal.flush()

    async def wait(self, deadline: float | None) -> None:
        await self._journal.wait(deadline)

    def register_rollback(self, entry: Entry, handler: RollbackFn) -> None:
        self.rollbacks.register(entry, handler)

    async def receive(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message]:
        return await self._mailbox.receive(entry, names, count, completable)

    def messages(self, entry: Entry) -> list[Message]:
        return self._mailbox.messages(entry, replaying=self._rollback_mode)

    async def return_messages(self, gone: Sequence[Entry], kept: Sequence[Entry]) -> None:
        await self._mailbox.return_messages(gone, kept)


def _error(error: BaseException, *, code_error: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if code_error:
        record["code_error"] = True
    return record
