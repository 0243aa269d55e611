"""`ctx`: what hooks and actions see of their actor."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pagekv.actor.database import ActorDb
from pagekv.actor.part_hosts import ContextHost
from pagekv.actor.queue import Queue
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

    def sleep(self) -> None:
        """Ask to sleep once the current work is done."""
        self._instance.request_sleep()

    def destroy(self) -> None:
        """Destroy the actor once the current work is done: `on_destroy`, then drop its data."""
        self._instance.request_destroy()
