"""`ctx`: what hooks and actions see of their actor."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pagekv.actor.async_db import ActorDb
from pagekv.actor.ports import ContextHost
from pagekv.actor.queue import Queue
from pagekv.actor.realtime.connection import Connection, calling_connection
from pagekv.actor.schedule import Schedule
from pagekv.actor.state import StateCell
from pagekv.actor.user_kv import UserKv


@dataclass
class ActorContext:
    """The actor as seen from its own code. `state` is durable, `vars` ephemeral (rebuilt on
    every wake), `db` the actor's SQLite database, `kv` its private KV entries."""

    actor_id: str
    name: str
    key: str
    db: ActorDb
    kv: UserKv
    log: logging.LoggerAdapter[logging.Logger]
    schedule: Schedule
    queue: Queue
    _cell: StateCell
    _instance: ContextHost
    vars: Any = None
    input: Any = field(default=None, repr=False)

    @property
    def state(self) -> Any:
        return self._cell.value

    @state.setter
    def state(self, value: Any) -> None:
        self._cell.value = value

    @property
    def conns(self) -> list[Connection]:
        """The actor's open connections (in this process, which holds all of them while it
        owns the actor)."""
        return self._instance.connections()

    @property
    def conn(self) -> Connection | None:
        """The connection whose frame the running action or hook serves; None for a call
        that came another way (HTTP, a schedule)."""
        return calling_connection.get()

    def broadcast(self, event: str, *args: Any) -> int:
        """Push `event` with `args` to every connection subscribed to it (fire and forget,
        never persisted); returns how many. `MessageTooLarge` past the connections' limit."""
        return self._instance.broadcast(event, args)

    @property
    def client(self) -> Any:
        """A client of the actors of this registry (and, through its server, of the others
        that share its store): `ctx.client.get_or_create("name", "key").action(...)`."""
        return self._instance.client()

    def sleep(self) -> None:
        """Ask to sleep once the current work is done."""
        self._instance.request_sleep()

    def destroy(self) -> None:
        """Destroy the actor once the current work is done: `on_destroy`, then drop its data."""
        self._instance.request_destroy()
