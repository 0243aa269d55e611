"""The protocols an actor's parts see the live instance through, so that imports run one way.

- `ContextHost`, `QueueHost`, `ScheduleHost`, `HoldsDb`: what an actor's parts (`ctx`,
  `ctx.queue`, `ctx.schedule`) need from the live instance that holds them; each part depends
  on these and not on `ActorInstance`, which creates the parts (instance -> parts -> ports).

Each has one implementation; they exist to break what would be an import circle, and state
exactly what crosses it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from pagekv.actor.async_db import ActorDb
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.realtime.connection import Connection


class HoldsDb(Protocol):
    """The instance's `ctx`, as far as a queue or a schedule reads it: its database."""

    @property
    def db(self) -> ActorDb: ...


class ContextHost(Protocol):
    """What `ctx` passes on: the actor's own requests to stop once its current work is done,
    its connections, and a client of the other actors."""

    def request_sleep(self) -> None: ...

    def request_destroy(self) -> None: ...

    def connections(self) -> list[Connection]: ...

    def broadcast(self, event: str, args: tuple[Any, ...]) -> int: ...

    def client(self) -> Any: ...


class QueueHost(Protocol):
    """What `ctx.queue` needs: the actor's id (for errors), its database (the messages' table),
    and a way to say it waits for a message (so the actor may sleep meanwhile)."""

    @property
    def actor_id(self) -> str: ...

    @property
    def ctx(self) -> HoldsDb: ...

    def waiting(self) -> AbstractContextManager[None]: ...


class ScheduleHost(Protocol):
    """What `ctx.schedule` needs: the actor's id (for errors), its definition (an action is
    refused when scheduled, not when due), its database (the schedules' table), and the wake
    time the instance publishes, announced before a schedule commits and refreshed after."""

    @property
    def actor_id(self) -> str: ...

    @property
    def definition(self) -> ActorDefinition: ...

    @property
    def ctx(self) -> HoldsDb: ...

    async def announce_wake(self, due: float) -> None: ...

    async def refresh_wake(self) -> None: ...
