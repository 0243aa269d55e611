"""The action gate: actions of one actor run together, a transaction runs alone.

Actions may interleave at `await` points, but a `ctx.db.transaction()` snapshots the actor's state
to restore it on rollback. If another action changed the state meanwhile, the restore would undo
an acknowledged change, so a transaction waits until no other action runs, and new actions wait
until it ends. The action that opens the transaction gives up its own share while it waits, so two
actions opening transactions at once cannot deadlock.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

_holding: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "pagekv_actor_gate", default=None
)


class Gate:
    """Shared for actions, exclusive for a transaction, and fair between them.

    New actions wait while a transaction waits, so a stream of actions cannot starve it. When a
    transaction ends, the actions that were already waiting go in before the next transaction, so
    a stream of transactions (a workflow's steps back to back) cannot starve them. Invariant: a
    transaction takes the gate only when no such senior action is still waiting.
    """

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0
        self._shared_waiting = 0
        self._ended = 0
        """Transactions ended so far: an action waiting since before the last end is senior."""
        self._senior = 0
        self._changed = anyio.Event()
        self._waiting = 0
        """Tasks in `_wait`: with none, a change needs no new event (the common case)."""

    async def _wait(self) -> None:
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1

    def _notify(self) -> None:
        if self._waiting:
            self._changed.set()
            self._changed = anyio.Event()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Held for the whole of one action."""
        arrived = self._ended
        self._shared_waiting += 1
        try:
            while self._exclusive or (self._exclusive_waiting and arrived == self._ended):
                await self._wait()
        finally:
            self._shared_waiting -= 1
            if arrived != self._ended:
                self._senior -= 1
                if not self._senior:
                    self._notify()
        self._shared += 1
        token = _holding.set(self)
        try:
            yield
        finally:
            _holding.reset(token)
            self._shared -= 1
            self._notify()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Held for a transaction; the caller's own share (if any) is set aside meanwhile."""
        own = 1 if _holding.get() is self else 0
        self._shared -= own
        self._exclusive_waiting += 1
        self._notify()
        try:
            while self._exclusive or self._shared or self._senior:
                await self._wait()
        finally:
            self._exclusive_waiting -= 1
        self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            self._shared += own
            self._ended += 1
            self._senior = self._shared_waiting
            self._notify()
