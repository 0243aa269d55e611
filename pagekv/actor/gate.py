"""The action gate: actions of one actor run together, a transaction runs alone.

Actions may interleave at `await` points, but a `ctx.db.transaction()` snapshots the actor's state
to restore it on rollback. If another action changed the state meanwhile, the restore would undo
an acknowledged change, so a transaction waits until no other action runs, and new actions wait
until it ends. The action that opens the transaction gives up its own share while it waits, so two
actions opening transactions at once cannot deadlock.

Nor can a call cycle (`call_chain.py`): a call made on behalf of a frame that holds this gate
alone, or a transaction opened on behalf of one that holds a share besides its own, could only
wait for that frame, which waits for it, and is refused (`CallCycle`). A call on behalf of a
frame holding a share goes in at once, ahead of a waiting transaction, which waits for that
share anyway.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from pagekv.actor import call_chain
from pagekv.actor.call_chain import Frame
from pagekv.actor.errors import CallCycle

_holding: contextvars.ContextVar[tuple[object, str] | None] = contextvars.ContextVar(
    "pagekv_actor_gate", default=None
)
"""The gate whose share this task's action holds, and the frame holding it."""


class Gate:
    """Shared for actions, exclusive for a transaction, and fair between them.

    New actions wait while a transaction waits, so a stream of actions cannot starve it. When a
    transaction ends, the actions that were already waiting go in before the next transaction, so
    a stream of transactions (a workflow's steps back to back) cannot starve them. Invariant: a
    transaction takes the gate only when no such senior action is still waiting.
    """

    def __init__(self, actor_id: str = "") -> None:
        self.actor_id = actor_id
        self._holders: Counter[str] = Counter()
        """The frames holding a share, by id."""
        self._exclusive_frame: str | None = None
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

    def refuse_cycle(self, chain: tuple[Frame, ...]) -> None:
        """`CallCycle` if a frame of `chain` holds this gate alone: whatever waits for the gate
        on its behalf waits for itself."""
        if self._exclusive and any(f.id == self._exclusive_frame for f in chain):
            raise CallCycle(
                f"call cycle: {call_chain.describe(chain)} -> {self.actor_id}, whose transaction "
                "on this chain waits for this call"
            )

    @asynccontextmanager
    async def shared(self, frame: Frame | None = None) -> AsyncIterator[None]:
        """Held for the whole of one action, `frame` of the chain."""
        frame = frame or Frame(self.actor_id, "")
        ancestors = tuple(f for f in call_chain.current() if f != frame)
        self.refuse_cycle(ancestors)
        reentrant = any(self._holders[f.id] for f in ancestors)
        arrived = self._ended
        self._shared_waiting += 1
        try:
            while self._exclusive or (
                not reentrant and self._exclusive_waiting and arrived == self._ended
            ):
                await self._wait()
                self.refuse_cycle(ancestors)
        finally:
            self._shared_waiting -= 1
            if arrived != self._ended:
                self._senior -= 1
                if not self._senior:
                    self._notify()
        self._shared += 1
        self._holders[frame.id] += 1
        token = _holding.set((self, frame.id))
        try:
            yield
        finally:
            _holding.reset(token)
            self._shared -= 1
            self._holders[frame.id] -= 1
            if not self._holders[frame.id]:
                del self._holders[frame.id]
            self._notify()

    @asynccontextmanager
    async def exclusive(self, frame: Frame | None = None) -> AsyncIterator[None]:
        """Held for a transaction, `frame` of the chain; the caller's own share (if any) is set
        aside meanwhile."""
        frame = frame or Frame(self.actor_id, "")
        holding = _holding.get()
        own_frame = holding[1] if holding is not None and holding[0] is self else None
        own = 0 if own_frame is None else 1
        ancestors = tuple(f for f in call_chain.current() if f != frame)
        self.refuse_cycle(ancestors)
        if any(f.id != own_frame and self._holders[f.id] for f in ancestors):
            raise CallCycle(
                f"call cycle: {call_chain.describe(ancestors)} -> {self.actor_id}: a "
                "transaction here would wait for the action of this actor on this chain, "
                "which waits for it"
            )
        self._shared -= own
        self._exclusive_waiting += 1
        self._notify()
        try:
            while self._exclusive or self._shared or self._senior:
                await self._wait()
        finally:
            self._exclusive_waiting -= 1
        self._exclusive, self._exclusive_frame = True, frame.id
        try:
            yield
        finally:
            self._exclusive, self._exclusive_frame = False, None
            self._shared += own
            self._ended += 1
            self._senior = self._shared_waiting
            self._notify()
