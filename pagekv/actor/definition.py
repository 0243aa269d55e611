"""Defining actors in plain Python: `actor(name, state=...)` plus decorators for hooks, actions."""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pagekv.actor.errors import ActionNotFound, InvalidArguments

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[..., Awaitable[Any]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass
class ActorDefinition:
    """What an actor is: its name, default state, options, hooks and actions.

    `state` may be a value (deep-copied for every new actor, so instances never share it) or a
    zero-argument callable; `create_state(ctx, input)` overrides both.
    """

    name: str
    state: Any = None
    sleep_timeout: float = 30.0
    stop_grace: float = 15.0
    """How long sleep and destroy wait for in-flight actions before closing the database."""
    actions: dict[str, Hook] = field(default_factory=dict)
    hooks: dict[str, Hook] = field(default_factory=dict)
    workflow_fn: Hook | None = None
    """The durable workflow that is this actor's run handler (see `pagekv.actor.workflow`)."""

    HOOKS = (
        "on_migrate",
        "create_state",
        "on_create",
        "create_vars",
        "on_wake",
        "on_sleep",
        "on_destroy",
        "run",
    )

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"actor name {self.name!r} must be 1-64 letters, digits, '_', '.', '-' "
                "and start with a letter or '_'"
            )
        if self.sleep_timeout <= 0:
            raise ValueError(f"sleep_timeout must be > 0, got {self.sleep_timeout}")
        if self.stop_grace < 0:
            raise ValueError(f"stop_grace must be >= 0, got {self.stop_grace}")

    def initial_state(self) -> Any:
        return self.state() if callable(self.state) else copy.deepcopy(self.state)

    def resolve(self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hook:
        """The action to call with `args` and `kwargs` (after `ctx`): `ActionNotFound` if there
        is none, `InvalidArguments` if they do not bind to its signature. Callers check this
        before they wake or create the actor, so a call that cannot run changes nothing."""
        fn = self.actions.get(action)
        if fn is None:
            raise ActionNotFound(f"actor {self.name!r} has no action {action!r}")
        signature = _signature(fn)
        try:
            signature.bind(None, *args, **kwargs)
        except TypeError as e:
            params = list(signature.parameters.values())[1:]  # without ctx
            shown = signature.replace(
                parameters=[p.replace(annotation=p.empty) for p in params],
                return_annotation=signature.empty,
            )
            raise InvalidArguments(
                f"action {action!r} of actor {self.name!r} takes {shown}: {e}"
            ) from None
        return fn

    def action(self, fn: F) -> F:
        """Register `async def name(ctx, *args)` as an action callable by clients."""
        if fn.__name__ in self.actions:
            raise ValueError(f"actor {self.name!r} already has an action {fn.__name__!r}")
        self.actions[fn.__name__] = fn
        return fn

    def workflow(self, fn: F) -> F:
        """Register `async def name(wf)` as the actor's run handler, run as a durable workflow."""
        if "run" in self.hooks or self.workflow_fn is not None:
            raise ValueError(f"actor {self.name!r} already has a run handler")
        self.workflow_fn = fn
        return fn

    def _hook(self, name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            if name == "run" and self.workflow_fn is not None:
                raise ValueError(f"actor {self.name!r} already has a workflow as run handler")
            self.hooks[name] = fn
            return fn

        return register

    def __getattr__(self, name: str) -> Any:
        if name in ActorDefinition.HOOKS:
            return self._hook(name)
        raise AttributeError(name)


@functools.cache
def _signature(fn: Hook) -> inspect.Signature:
    """`inspect.signature` of an action, once: it costs more than the binding it serves."""
    return inspect.signature(fn)


def actor(
    name: str, *, state: Any = None, sleep_timeout: float = 30.0, stop_grace: float = 15.0
) -> ActorDefinition:
    """Define an actor; add actions with `@definition.action` and hooks with
    `@definition.on_wake` (and `on_migrate`, `create_state`, `on_create`, `create_vars`,
    `on_sleep`, `on_destroy`, `run`)."""
    return ActorDefinition(name, state=state, sleep_timeout=sleep_timeout, stop_grace=stop_grace)
