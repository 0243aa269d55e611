"""Errors as HTTP answers: every failure becomes a status and a stable `ErrorCode`, never a stack
trace.

`HttpError` is raised by the server's own checks (auth, bodies, parameters). `classify` maps what
the runtime raises: a `UserError` an action raised (its own 4xx status and code), the actor
errors, the queue and schedule limits, and the KV limits, which may arrive wrapped (e.g. as the
cause of an SQLite I/O error), so the whole cause chain is searched. Anything else an action
raises is the action's own error (`action_error`, 500), with its type and message but no
traceback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pagekv.actor import (
    ActionNotFound,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    CallCycle,
    InvalidArguments,
    NotOwner,
    UnknownActor,
    UserError,
)
from pagekv.actor.errors import STORAGE_ERRORS
from pagekv.actor.inspect_reads import (
    AnswerTooLarge,
    InspectError,
    QueryRefused,
    QueryTooLarge,
    TableNotFound,
)
from pagekv.actor.queue import InvalidQueueName, MessageTooLarge, QueueFull
from pagekv.actor.request_writes import Writes
from pagekv.actor.schedule import TooManySchedules
from pagekv.actor.workflow import WorkflowChangeRefused
from pagekv.kv import LimitError
from pagekv.protocol import ErrorCode

log = logging.getLogger("pagekv.server")


@dataclass
class HttpError(Exception):
    status: int
    code: ErrorCode | str
    """One of `ErrorCode`, or the code of a `UserError` an action raised."""
    message: str
    limit: str | None = None
    """The name of the limit that was hit, when one was."""
    writes: Writes | None = None
    """What the failed call committed, on routes that call actors: the answer's `written`."""

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        # An exception's text may hold what no encoding can (a lone surrogate): escaped.
        message = self.message.encode("utf-8", "backslashreplace").decode()
        error: dict[str, Any] = {"code": str(self.code), "message": message}
        if self.limit is not None:
            error["limit"] = self.limit
        if self.writes is not None:
            error["written"] = self.writes.state()
        return {"error": error}


_KNOWN: tuple[tuple[type[BaseException], int, ErrorCode, str | None], ...] = (
    (UnknownActor, 404, ErrorCode.UNKNOWN_ACTOR, None),
    (ActionNotFound, 404, ErrorCode.UNKNOWN_ACTION, None),
    (ActorNotFound, 404, ErrorCode.ACTOR_NOT_FOUND, None),
    (ActorExists, 409, ErrorCode.ACTOR_EXISTS, None),
    (CallCycle, 409, ErrorCode.CALL_CYCLE, None),
    (InvalidArguments, 400, ErrorCode.INVALID_ARGUMENTS, None),
    (ActorTakenOver, 503, ErrorCode.ACTOR_TAKEN_OVER, None),
    (NotOwner, 503, ErrorCode.NOT_OWNER, None),
    (ActorStopped, 503, ErrorCode.ACTOR_STOPPED, None),
    (QueueFull, 429, ErrorCode.QUEUE_FULL, "MAX_MESSAGES"),
    (TooManySchedules, 429, ErrorCode.TOO_MANY_SCHEDULES, "MAX_SCHEDULES"),
    (MessageTooLarge, 413, ErrorCode.MESSAGE_TOO_LARGE, "MAX_MESSAGE_BYTES"),
    (InvalidQueueName, 400, ErrorCode.INVALID_QUEUE_NAME, "MAX_QUEUE_NAME_BYTES"),
    (AnswerTooLarge, 413, ErrorCode.ANSWER_TOO_LARGE, AnswerTooLarge.limit),
    (TableNotFound, 404, ErrorCode.TABLE_NOT_FOUND, None),
    (QueryTooLarge, 403, ErrorCode.QUERY_REFUSED, QueryTooLarge.limit),
    (QueryRefused, 403, ErrorCode.QUERY_REFUSED, None),
    (WorkflowChangeRefused, 409, ErrorCode.WORKFLOW_CHANGE_REFUSED, None),
    (InspectError, 400, ErrorCode.INVALID_QUERY, None),
)


def _causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _message(error: BaseException) -> str:
    """The error's own message (`str` of a `KeyError` subclass would add quotes)."""
    if len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


def classify(error: Exception, *, in_action: bool, writes: Writes | None = None) -> HttpError:
    """The HTTP answer for an exception raised while serving a request.

    `in_action`: the request ran actor code, so an unknown exception is the action's own error
    (reported with its type and message); otherwise it is a server bug (logged, not described).
    `writes`: what the request committed before it failed, reported as `written`.
    """
    answer = _classify(error, in_action)
    return answer if writes is None else replace(answer, writes=writes)


def _classify(error: Exception, in_action: bool) -> HttpError:
    if isinstance(error, HttpError):
        return error
    if isinstance(error, UserError):  # the action's own answer, whatever it was raised from
        return HttpError(error.status, error.code, error.message)
    for cause in _causes(error):
        if isinstance(cause, LimitError):
            return HttpError(413, ErrorCode.KV_LIMIT, _message(cause), limit=cause.limit)
    for kind, status, code, limit in _KNOWN:
        if isinstance(error, kind):
            return HttpError(status, code, _message(error), limit=limit)
    for cause in _causes(error):
        if isinstance(cause, STORAGE_ERRORS):
            message = f"the actor's store failed; retry: {_message(cause)}"
            return HttpError(503, ErrorCode.STORAGE_UNAVAILABLE, message)
    if in_action:  # logged by the gateway, which knows the actor and the action
        message = f"{type(error).__name__}: {_message(error)}"
        return HttpError(500, ErrorCode.ACTION_ERROR, message)
    log.error("internal error", exc_info=error)
    return HttpError(500, ErrorCode.INTERNAL, "internal server error (logged by the server)")
