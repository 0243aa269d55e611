"""Errors of the actor runtime."""

from __future__ import annotations

import re
from typing import Any

import apsw

from pagekv.kv import FenceMismatch, KvIndeterminate, KvUnavailable


class ActorError(Exception):
    """Base of the runtime's errors."""


class ActorNotFound(ActorError):
    """No actor with that name and key exists (or it was destroyed)."""


class ActorExists(ActorError):
    """`create` of a name and key that already exist."""


class UnknownActor(ActorError, KeyError):
    """The registry has no actor definition of that name."""


class ActionNotFound(ActorError, AttributeError):
    """The actor defines no action of that name."""


class InvalidArguments(ActorError, TypeError):
    """A call's arguments do not bind to its action's signature (too many, a required one
    missing, an unknown keyword)."""


class InvalidDefinition(ActorError, TypeError):
    """A function given to an actor's decorator (`@a.action`, `@a.on_wake`, ...) that could
    not be called as the runtime calls it: not an `async def`, or not taking `ctx` (and the
    hook's other arguments) first. Raised as it is declared, so the mistake shows when the app
    loads rather than at the first call."""


_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class UserError(Exception):
    """The caller's fault: raise it in an action to refuse the request, or in a workflow step
    to fail the step at once.

        raise UserError("quantity must be at least 1", code="invalid_quantity")

    Over HTTP it answers `status` (400 by default; any 4xx) with `{"error": {"code": code,
    "message": message, "written": ...}}`; an in-process caller gets it raised as is. `code` is
    1 to 64 letters, digits, `_`, `.` or `-`, starting with a letter (a `ValueError`
    otherwise, as for a `status` that is not a 4xx int). Like any error an action raises, it
    undoes only an open `ctx.db.transaction()`: what the action changed outside one stands
    (the answer's `written` says so). A workflow step that raises it fails as `critical`
    (`StepCritical`) without a retry, since a retry would only be refused again.
    """

    def __init__(self, message: str, *, code: str = "user_error", status: int = 400) -> None:
        if not isinstance(message, str):
            raise TypeError(f"a UserError's message must be a str, got {type(message).__name__}")
        if not isinstance(code, str) or not _CODE.match(code):
            raise ValueError(
                f"a UserError's code must be 1-64 letters, digits, '_', '.', '-' starting with "
                f"a letter, got {code!r}"
            )
        if type(status) is not int or not 400 <= status <= 499:
            raise ValueError(f"a UserError's status must be a 4xx int, got {status!r}")
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_user_error, (type(self), self.message, self.code, self.status))


def _restore_user_error(kind: type[UserError], message: str, code: str, status: int) -> UserError:
    """A pickled `UserError` again, with its code and status (the default pickling of an
    exception would call `UserError(message)` and lose them)."""
    error = kind.__new__(kind)
    UserError.__init__(error, message, code=code, status=status)
    return error


class ActorTakenOver(ActorError):
    """Another instance (another process or host) took this actor over; this one was torn down.

    The action may or may not have been applied; nothing acknowledged is lost. Retry it: the next
    call wakes a fresh instance that sees every acknowledged write.
    """


class ActorStopped(ActorError):
    """The instance stopped (slept, was destroyed or crashed) while the call was in flight."""


class CallCutOff(ActorStopped):
    """A stop cancelled the call once it had waited the actor's `stop_grace` for it: the
    runtime ended it, no code of the call failed. What of it may stand is in the message and,
    over HTTP, in the answer's `written` (see `Calls._cut_off_by_stop`)."""


class CallCycle(ActorError):
    """A call that could only wait for actor code that waits for it: it re-enters an actor whose
    transaction (or whose action, while the call opens a transaction) is on its call chain
    (`call_chain.py`), e.g. A in `ctx.db.transaction()` calls B, which calls A. Refused before it
    runs; the message names the chain. Over HTTP, 409 `call_cycle`."""


class OwnedElsewhere(ActorError):
    """Another live registry owns actor `actor_id` (`owner`, an `ownership.Owner`): the call is
    for it. Raised before anything is woken or written; a server forwards the call to
    `owner.address`."""

    def __init__(self, message: str, actor_id: str, owner: Any) -> None:
        super().__init__(message)
        self.actor_id = actor_id
        self.owner = owner


class NotOwner(ActorStopped):
    """A forwarded call reached a registry that does not own the actor (it went to sleep or was
    taken over there, or the registry is draining): nothing was written; the sender routes the
    call again."""


class ReservedName(ActorError):
    """User SQL touched a `_pagekv_` table, which the runtime reserves."""


STORAGE_ERRORS = (KvUnavailable, KvIndeterminate, FenceMismatch, apsw.IOError)
"""Failures of the store under an actor rather than of the actor's code: what failed is retried
(a schedule stays due, a workflow replays), never recorded as the code's failure. Not every
`KvError` is one: a `LimitError` or an `InvalidArgument` is the code's request refused, which a
retry would only repeat (a schedule would stay due forever)."""
