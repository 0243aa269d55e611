"""`StepContext`: the only way workflow code reaches actor data and side effects.

A step runs inside one database transaction; its state and SQL changes commit together with the
step's history entry, or not at all. The context is valid only while its step runs, so nothing can
change the actor outside a recorded step.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pagekv.actor.async_db import ActorDb
from pagekv.actor.context import ActorContext
from pagekv.actor.schedule import Schedule
from pagekv.actor.user_kv import UserKv
from pagekv.actor.workflow.errors import StepContextClosed

FailureKind = Literal["critical", "timeout", "exhausted"]


class _Sender:
    """`queue` of a step context: sending only (receiving is `wf.queue.next`, a recorded op)."""

    def __init__(self, step: StepContext) -> None:
        self._step = step

    async def send(self, name: str, body: Any) -> int:
        return await self._step._actor().queue.send(name, body)


class StepContext:
    """What a step's function is given: the actor's data and side effects for this one attempt,
    so that they commit with the step's result or roll back with it. It is valid only while its
    attempt runs; afterwards every use raises `StepContextClosed`, so that no write of a finished
    attempt can land outside it."""

    def __init__(self, ctx: ActorContext, step: str, attempt: int) -> None:
        self._ctx: ActorContext | None = ctx
        self.step = step
        self.attempt = attempt
        """1 for the first attempt of this step, then 2, 3, ... on retries."""

    def _actor(self) -> ActorContext:
        if self._ctx is None:
            raise StepContextClosed(
                f"the context of step {self.step!r} is only valid while that step runs"
            )
        return self._ctx

    def close(self) -> None:
        self._ctx = None

    @property
    def state(self) -> Any:
        return self._actor().state

    @state.setter
    def state(self, value: Any) -> None:
        self._actor().state = value

    @property
    def vars(self) -> Any:
        return self._actor().vars

    @property
    def db(self) -> ActorDb:
        """The actor's database; the step already runs in a transaction of it."""
        return self._actor().db

    @property
    def kv(self) -> UserKv:
        """The actor's own KV entries (not part of the step's transaction)."""
        return self._actor().kv

    @property
    def schedule(self) -> Schedule:
        return self._actor().schedule

    @property
    def queue(self) -> _Sender:
        self._actor()
        return _Sender(self)

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return self._actor().log

    @property
    def actor_id(self) -> str:
        return self._actor().actor_id


RollbackFn = Callable[[StepContext, Any], Awaitable[None]]
"""A step's rollback handler: given a context like its step's, and the step's output."""


@dataclass(frozen=True)
class StepFailure:
    kind: FailureKind
    step: str
    attempts: int
    error: str


@dataclass(frozen=True)
class StepResult:
    """What `try_step` returns: `value` if `ok`, else `failure`."""

    ok: bool
    value: Any = None
    failure: StepFailure | None = None
