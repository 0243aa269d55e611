"""Errors of the actor runtime."""

from __future__ import annotations

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


class ActorTakenOver(ActorError):
    """Another instance (another process or host) took this actor over; this one was torn down.

    The action may or may not have been applied; nothing acknowledged is lost. Retry it: the next
    call wakes a fresh instance that sees every acknowledged write.
    """


class ActorStopped(ActorError):
    """The instance stopped (slept, was destroyed or crashed) while the call was in flight."""


class ReservedName(ActorError):
    """User SQL touched a `_pagekv_` table, which the runtime reserves."""


STORAGE_ERRORS = (KvUnavailable, KvIndeterminate, FenceMismatch, apsw.IOError)
"""Failures of the store under an actor rather than of the actor's code: what failed is retried
(a schedule stays due, a workflow replays), never recorded as the code's failure. Not every
`KvError` is one: a `LimitError` or an `InvalidArgument` is the code's request refused, which a
retry would only repeat (a schedule would stay due forever)."""
