"""What each kind of workflow history entry records: one payload type per kind, and the one
encode/decode pair between them and the `data` column of `_pagekv_workflow_history`.

Why it exists: the payload is the part of a history entry that is a persisted format of its own
(a CBOR map per entry, documented in docs/FORMAT.md); the engine reads and writes typed fields,
and only `encode` and `decode` know the map's keys.

Invariants: `decode(kind, encode(p))` equals `p`; `encode` writes exactly the maps every history
format version wrote (a key that is absent stays absent: a pending step is `{}`, a message entry
has no `completable` before it received, a received message has `returned` only once given
back), so histories written before these types existed read unchanged, and describe the same.
History format 2 added the `iteration` kind; nothing else changed since format 1.

Payloads whose fields the engine changes in place (`LoopProgress`, `Join`, `Race`) are mutated
on the event loop only, by the run handler that owns the history; the others are frozen.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, assert_never, cast, get_args

from pagekv.actor.workflow.errors import WorkflowFormatError
from pagekv.actor.workflow.step import FailureKind


class Kind(enum.StrEnum):
    STEP = "step"
    LOOP = "loop"
    SLEEP = "sleep"
    MESSAGE = "message"
    ROLLBACK_CHECKPOINT = "rollback_checkpoint"
    JOIN = "join"
    RACE = "race"
    REMOVED = "removed"
    VERSION_CHECK = "version_check"
    ITERATION = "iteration"
    """The state a finished loop iteration holding a step with a rollback handler started with,
    at the iteration's own scope location: what a rollback replays that iteration from."""


# -- step ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPending:
    """A step not yet attempted, or under way: `{}`."""


@dataclass(frozen=True)
class StepRetrying:
    """A step whose last attempt failed, retried at `retry_at`: `{"retry_at": t}`."""

    retry_at: float


@dataclass(frozen=True)
class StepDone:
    """A completed step: `{"output": v}`, with `"rollback": true` if it has a rollback handler
    (`undoable`: loop pruning keeps it, a failure of the workflow runs the handler)."""

    output: Any
    undoable: bool = False


@dataclass(frozen=True)
class StepFailed:
    """A step that failed for good: `{"failure": "critical" | "timeout" | "exhausted"}`."""

    failure: FailureKind


Step = StepPending | StepRetrying | StepDone | StepFailed


# -- the other kinds -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sleep:
    """`{"deadline": t}`: the Unix time the sleep ends."""

    deadline: float


@dataclass
class LoopProgress:
    """`{"state", "iteration", "pruned"}`: the current iteration, the state it started with,
    and the first iteration whose history is kept (those before were pruned)."""

    state: Any
    iteration: int = 0
    pruned: int = 0


@dataclass(frozen=True)
class Iteration:
    """`{"state": s}`: the state a kept loop iteration started with."""

    state: Any


@dataclass(frozen=True)
class ReceivedMessage:
    """One message a message entry received, as the queue held it (`body` decoded). `completed`:
    consumed for good (a plain receive, or `complete()`); `returned`: given back by a race."""

    id: int
    name: str
    body: Any
    created: float
    completed: bool
    returned: bool = False


@dataclass(frozen=True)
class Messages:
    """`{"deadline", "messages": [...], "completable"}`: a receive, waiting until `deadline`
    (None: forever); `completable` is None (absent) until it received."""

    deadline: float | None
    messages: tuple[ReceivedMessage, ...] = ()
    completable: bool | None = None


@dataclass(frozen=True)
class RollbackCheckpoint:
    """`{}`: from here on a failure of the workflow runs rollback handlers."""


class BranchStatus(enum.StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Branch:
    """A join or race branch: `{"status"}`, with `"output"` once completed, `"error"` once
    failed, and `"kept": true` for a race loser whose history a rollback still needs."""

    status: BranchStatus
    output: Any = None
    error: str | None = None
    kept: bool = False


PENDING_BRANCH = Branch(BranchStatus.PENDING)


@dataclass
class Join:
    """`{"branches": {name: branch}}`."""

    branches: dict[str, Branch]


@dataclass
class Race:
    """`{"winner": name or None, "branches": {name: branch}}`."""

    winner: str | None
    branches: dict[str, Branch]


@dataclass(frozen=True)
class Removed:
    """`{"original_kind": kind}`: an operation the code retired (`wf.removed`)."""

    original_kind: str


@dataclass(frozen=True)
class VersionCheck:
    """`{"resolved", "latest"}`: the code version this execution follows at this point."""

    resolved: int
    latest: int


Payload = (
    Step
    | Sleep
    | LoopProgress
    | Iteration
    | Messages
    | RollbackCheckpoint
    | Join
    | Race
    | Removed
    | VersionCheck
)


# -- the codec -------------------------------------------------------------------------------


def encode(payload: Payload) -> dict[str, Any]:
    """The map stored (as CBOR) for `payload`; also what inspectors show as an entry's data."""
    match payload:
        case StepPending() | RollbackCheckpoint():
            return {}
        case StepRetrying(retry_at):
            return {"retry_at": retry_at}
        case StepDone(output, undoable):
            return {"output": output, "rollback": True} if undoable else {"output": output}
        case StepFailed(failure):
            return {"failure": failure}
        case Sleep(deadline):
            return {"deadline": deadline}
        case LoopProgress(state, iteration, pruned):
            return {"state": state, "iteration": iteration, "pruned": pruned}
        case Iteration(state):
            return {"state": state}
        case Messages(deadline, messages, completable):
            data: dict[str, Any] = {
                "deadline": deadline,
                "messages": [_message(m) for m in messages],
            }
            if completable is not None:
                data["completable"] = completable
            return data
        case Join(branches):
            return {"branches": {b: _branch(s) for b, s in branches.items()}}
        case Race(winner, branches):
            return {"winner": winner, "branches": {b: _branch(s) for b, s in branches.items()}}
        case Removed(original_kind):
            return {"original_kind": original_kind}
        case VersionCheck(resolved, latest):
            return {"resolved": resolved, "latest": latest}
        case _:
            assert_never(payload)


def decode(kind: Kind, data: dict[str, Any]) -> Payload:
    """The payload of an entry of `kind` stored as `data`; `WorkflowFormatError` if the map is
    not one this pagekv writes."""
    try:
        return _decode(kind, data)
    except (KeyError, TypeError, ValueError) as e:
        raise WorkflowFormatError(f"a {kind.value} entry holds {data!r}: {e!r}") from e


def _decode(kind: Kind, data: dict[str, Any]) -> Payload:
    match kind:
        case Kind.STEP:
            if "failure" in data:
                return StepFailed(_failure(data["failure"]))
            if "output" in data:
                return StepDone(data["output"], bool(data.get("rollback")))
            if "retry_at" in data:
                return StepRetrying(data["retry_at"])
            return StepPending()
        case Kind.SLEEP:
            return Sleep(data["deadline"])
        case Kind.LOOP:
            return LoopProgress(data["state"], data["iteration"], data["pruned"])
        case Kind.ITERATION:
            return Iteration(data["state"])
        case Kind.MESSAGE:
            messages = tuple(
                ReceivedMessage(
                    m["id"],
                    m["name"],
                    m["body"],
                    m["created"],
                    m["completed"],
                    bool(m.get("returned")),
                )
                for m in data["messages"]
            )
            return Messages(data["deadline"], messages, data.get("completable"))
        case Kind.ROLLBACK_CHECKPOINT:
            return RollbackCheckpoint()
        case Kind.JOIN:
            return Join(_branches(data["branches"]))
        case Kind.RACE:
            return Race(data["winner"], _branches(data["branches"]))
        case Kind.REMOVED:
            return Removed(data["original_kind"])
        case Kind.VERSION_CHECK:
            return VersionCheck(data["resolved"], data["latest"])
        case _:
            assert_never(kind)


def _failure(kind: object) -> FailureKind:
    if kind not in get_args(FailureKind):
        raise ValueError(f"no step failure kind {kind!r}")
    return cast(FailureKind, kind)


def _message(message: ReceivedMessage) -> dict[str, Any]:
    record = {
        "id": message.id,
        "name": message.name,
        "body": message.body,
        "created": message.created,
        "completed": message.completed,
    }
    if message.returned:
        record["returned"] = True
    return record


def _branch(branch: Branch) -> dict[str, Any]:
    record: dict[str, Any] = {"status": branch.status.value}
    if branch.status is BranchStatus.COMPLETED:
        record["output"] = branch.output
    if branch.error is not None:
        record["error"] = branch.error
    if branch.kept:
        record["kept"] = True
    return record


def _branches(data: dict[str, dict[str, Any]]) -> dict[str, Branch]:
    return {
        name: Branch(
            BranchStatus(b["status"]), b.get("output"), b.get("error"), bool(b.get("kept"))
        )
        for name, b in data.items()
    }
