"""The protocols across which an instance's parts see what holds them, so that imports run one
way (registry -> instance -> parts -> these):

- `InstanceHost`: what an instance and its parts need from the registry that hosts them; they
  depend on it and not on the registry, which creates and addresses instances.
- `CallsOwner`, `RunOwner`, `ScheduleOwner`: what the calls, the run handler and the
  schedule dispatcher need from their instance, which creates them.

Each has one implementation, and states exactly what crosses the boundary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition, Hook
from pagekv.actor.directory.leases import Ownership
from pagekv.actor.lifecycle.phase import Phase, Stop
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.worker_threads import Workers
from pagekv.actor.workflow.runner import Runner


class InstanceHost(Protocol):
    """What an instance needs from the registry that hosts it."""

    lease: float
    """Seconds an instance's lease on its actor runs from each renewal."""
    counters: Counter[str]
    ownership: Ownership
    workers: Workers
    """Where the instance's blocking work runs (its KV requests and SQLite work)."""
    hub: Hub
    """The process's open connections, which outlive instances (hibernation)."""

    def client(self) -> Any:
        """A client of the registry's actors (`ctx.client`)."""

    def holds_sockets(self, aid: str) -> bool:
        """Whether an instance of `aid` going to sleep keeps its lease, for the sockets this
        process holds (`realtime/holds.py`)."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the background; its failure is logged."""

    async def forget(self, instance: Any, *, how: str, destroyed: bool) -> None:
        """The instance stopped (`how`); `destroyed`: its data is gone."""


class RunOwner(Protocol):
    """What the run handler needs from its instance: its context and workflow (what it runs),
    whether it serves, its idle clock, and the instance's part when the handler failed or
    ended."""

    last_active: float
    """When the instance last did something (`time.monotonic()`)."""

    @property
    def ctx(self) -> ActorContext: ...

    @property
    def workflow(self) -> Runner | None: ...

    def serving(self) -> bool: ...

    async def run_failed(self) -> None:
        """The run handler failed by itself: publish the wake time without it."""

    async def run_ended(self) -> None:
        """The run handler ended: stop as requested, if no call runs."""


class ScheduleOwner(Protocol):
    """What the schedule dispatcher needs from its instance: its id, definition (to resolve a
    due action) and context (its schedules' table), a call as any other (unanswered), starting
    the run handler (a workflow's wake), and refreshing the wake time after the round."""

    @property
    def actor_id(self) -> str: ...

    @property
    def definition(self) -> ActorDefinition: ...

    @property
    def ctx(self) -> ActorContext: ...

    async def call(
        self, fn: Hook, args: tuple[Any, ...], kwargs: dict[str, Any], *, answered: bool = True
    ) -> Any: ...

    def start_run(self) -> None: ...

    async def refresh_wake(self) -> None: ...


class CallsOwner(Protocol):
    """What the calls need from their instance: its id, definition (the stop's grace) and
    context, whether it serves and where it is in its life (why not), its idle clock, and its
    stop (once the last call of a stop requested meanwhile ended)."""

    last_active: float
    """When the instance last did something (`time.monotonic()`)."""

    @property
    def actor_id(self) -> str: ...

    @property
    def definition(self) -> ActorDefinition: ...

    @property
    def ctx(self) -> ActorContext: ...

    @property
    def phase(self) -> Phase: ...

    def serving(self) -> bool: ...

    async def stop(self, how: Stop) -> Stop: ...
