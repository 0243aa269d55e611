"""Errors of durable workflows.

Two families: failures a workflow may catch and handle (`StepError` and its kinds, `JoinError`,
`RaceError`), and errors that mean the code no longer matches its recorded history or misuses the
API (`HistoryDiverged`, `EntryInProgress`, `RollbackCheckpointError`), which end the execution.
"""

from __future__ import annotations

from pagekv.actor.errors import ActorError


class WorkflowError(ActorError):
    """Base of workflow errors."""


class WorkflowFormatError(WorkflowError):
    """The history was written in a newer format than this pagekv reads."""


class WorkflowChangeRefused(WorkflowError):
    """A cancel or replay that cannot be done now (the workflow is rolling back) or names no
    entry of the history; nothing was changed."""


class HistoryDiverged(WorkflowError):
    """The workflow code does not match its recorded history (a different kind or name at a
    location, a name used twice in one scope, or recorded entries the code no longer reaches).
    Use `wf.removed(name, kind)` to retire an operation that no longer exists."""


class EntryInProgress(WorkflowError):
    """A second operation was started on a workflow context while one is still pending; run
    operations concurrently only through `join` or `race` branches."""


class RollbackCheckpointError(WorkflowError):
    """A step with a rollback handler ran before any `rollback_checkpoint`."""


class StepContextClosed(WorkflowError):
    """A step context was used after its step settled."""


class StepError(WorkflowError):
    """A step failed for good. `kind` is `critical`, `timeout` or `exhausted`."""

    kind = "failed"

    def __init__(self, step: str, attempts: int, error: str) -> None:
        super().__init__(f"step {step!r} {self.kind} after {attempts} attempt(s): {error}")
        self.step = step
        self.attempts = attempts
        self.error = error


class StepExhausted(StepError):
    kind = "exhausted"


class StepTimeout(StepError):
    kind = "timeout"


class StepCritical(StepError):
    """A step failed at once, without retries: it raised `Critical`, a `UserError`
    (`pagekv.actor.UserError`) or an error of a class in its `non_retryable`, or its result
    cannot be recorded."""

    kind = "critical"


class Critical(Exception):
    """Raise inside a step to fail it at once, without retries. A `UserError` does the same,
    as does an exception of a class listed in the step's `non_retryable=(ValueError, ...)`."""


class JoinError(WorkflowError):
    """Some branches of a join failed; `errors` maps branch name to its error message."""

    def __init__(self, name: str, errors: dict[str, str]) -> None:
        super().__init__(f"join {name!r}: branches failed: {errors}")
        self.errors = errors


class RaceError(WorkflowError):
    """Every branch of a race failed; `errors` maps branch name to its error message."""

    def __init__(self, name: str, errors: dict[str, str]) -> None:
        super().__init__(f"race {name!r}: all branches failed: {errors}")
        self.errors = errors
