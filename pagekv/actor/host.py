"""What an actor instance needs from the registry that hosts it, as a protocol, so that the
instance depends on this and not on the registry (which creates and addresses instances)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pagekv.actor.hub import Hub
from pagekv.actor.ownership import Ownership
from pagekv.actor.workers import Workers


class InstanceHost(Protocol):
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
        process holds (`holds.py`)."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the background; its failure is logged."""

    async def forget(self, instance: Any, *, how: str, destroyed: bool) -> None:
        """The instance stopped (`how`); `destroyed`: its data is gone."""
