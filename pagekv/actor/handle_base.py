"""`handle.increment(5)` for `handle.call("increment", 5)`: the base every actor handle and
connection (in process or over the network) shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class CallsByName:
    """Any attribute not starting with `_` is an action: calling it calls `self.call`."""

    async def call(self, action: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, action: str) -> Callable[..., Awaitable[Any]]:
        if action.startswith("_"):
            raise AttributeError(action)

        async def invoke(*args: Any, **kwargs: Any) -> Any:
            return await self.call(action, *args, **kwargs)

        return invoke
