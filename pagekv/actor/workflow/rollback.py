"""The rollback handlers one execution of a workflow found, and running them.

Split from the run handler because the handlers are collected by an execution (a rollback
replay, see `Runner`) and run after it, with their own recording: each success is written as
it happens, so a rollback interrupted by a restart resumes where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pagekv.actor.context import ActorContext
from pagekv.actor.workflow.history import Entry, WorkflowState
from pagekv.actor.workflow.journal import Journal
from pagekv.actor.workflow.payloads import StepDone
from pagekv.actor.workflow.primitives import INFRASTRUCTURE, describe_error
from pagekv.actor.workflow.step import RollbackFn, StepContext


class Rollbacks:
    """The handlers registered by one execution, one per completed step that has one.

    Invariants: the handlers run in reverse order of their steps' completion (the last
    registration of a step counts), each at most once over the workflow's life (its success is
    recorded as `rollback_completed` in the same commit as its writes, and a recorded one is
    skipped); the first failure stops the rollback and fails the workflow with its error.
    """

    def __init__(self) -> None:
        self._registered: list[tuple[Entry, RollbackFn]] = []
        """Event loop only: appended to by the execution's `wf` scopes, read once it ended."""

    def register(self, entry: Entry, handler: RollbackFn) -> None:
        self._registered.append((entry, handler))

    async def run(self, journal: Journal, ctx: ActorContext) -> None:
        """Run the handlers newest completion first, then record the workflow as failed (with
        the handler's error if one failed); the caller settles."""
        history = journal.history
        unique = {entry.location: (entry, handler) for entry, handler in self._registered}
        order = sorted(unique.values(), key=lambda r: (r[0].completed or 0, r[0].seq))
        for registered, handler in reversed(order):
            entry = history.entries[registered.location]
            if entry.rollback_completed is not None:
                continue
            step_ctx = StepContext(ctx, entry.name, 1)
            try:
                async with journal.transaction() as staged:
                    await handler(step_ctx, entry.payload(StepDone).output)
                    staged.append(replace(entry, rollback_completed=time.time()))
            except INFRASTRUCTURE:
                raise
            except Exception as e:
                entry.rollback_error = describe_error(e)
                history.put(entry)
                error = {**(history.error or {}), "rollback_error": entry.rollback_error}
                history.set_outcome(WorkflowState.FAILED, error=error)
                return
            finally:
                step_ctx.close()
        history.set_outcome(WorkflowState.FAILED, error=history.error)
