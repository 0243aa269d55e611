"""`ctx.queue`: the actor's durable FIFO mailbox, stored in `_pagekv_queue`.

A message is removed when received, unless received as *completable*: then it stays stored until
`complete()` (one commit), and a crash before that, or a failure of the action that received it,
redelivers it. A run handler waiting in `next()` does not keep the actor awake; a message sent to
a sleeping actor wakes it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import apsw
import cbor2

from pagekv.actor.errors import ActorError
from pagekv.actor.ports import QueueHost
from pagekv.actor.tables.sql import (
    QueueMessage,
    queue_append,
    queue_delete,
    queue_messages,
    queue_size,
)
from pagekv.actor.typed_values import cbor_dumps

MAX_MESSAGES = 1000
MAX_MESSAGE_BYTES = 64 * 1024
MAX_QUEUE_NAME_BYTES = 256


class QueueFull(ActorError):
    """The actor's queue holds `MAX_MESSAGES` messages already."""


class MessageTooLarge(ActorError, ValueError):
    """A message body encodes to more than `MAX_MESSAGE_BYTES`."""


class InvalidQueueName(ActorError, ValueError):
    """A queue name that is not 1 to `MAX_QUEUE_NAME_BYTES` bytes of UTF-8 text."""


@dataclass(frozen=True)
class Outgoing:
    """A message that passed `prepare_message`: its queue name and its encoded body."""

    name: str
    body: bytes


def prepare_message(name: Any, body: Any) -> Outgoing:
    """Check a message against the queue's limits and encode it.

    Senders from outside the actor call this before they wake (or create) it, so a message that
    is refused changes nothing.
    """
    if not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a string, got {type(name).__name__}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError as e:
        raise InvalidQueueName(f"queue name {name[:40]!r} is not UTF-8 text: {e.reason}") from None
    if not 1 <= size <= MAX_QUEUE_NAME_BYTES:
        raise InvalidQueueName(
            f"queue name must be 1 to {MAX_QUEUE_NAME_BYTES} bytes, got {size} bytes"
        )
    encoded = cbor_dumps(body)  # a dataclass or enum as its fields or value, as over HTTP
    if len(encoded) > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(
            f"message of {len(encoded)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"
        )
    return Outgoing(name, encoded)


@dataclass
class Message:
    id: int
    name: str
    body: Any
    created: float
    _complete: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def complete(self) -> None:
        """Remove a completable message for good (one commit)."""
        if self._complete is None:
            raise ActorError("this message was not received as completable, or is complete")
        complete, self._complete = self._complete, None
        await complete()


_received: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "pagekv_received", default=None
)


class Queue:
    def __init__(self, instance: QueueHost) -> None:
        self._instance = instance
        self._arrived = anyio.Event()
        self._in_flight: set[int] = set()

    @contextmanager
    def redeliver_on_failure(self) -> Iterator[None]:
        """Around an action: completable messages it received and did not complete go back to
        the queue if it fails (they are redelivered, as after a crash); if it succeeds they stay
        with it until `complete()`."""
        received: list[int] = []
        token = _received.set(received)
        try:
            yield
        except BaseException:
            self._in_flight.difference_update(received)
            self._notify()
            raise
        finally:
            _received.reset(token)

    def _notify(self) -> None:
        arrived, self._arrived = self._arrived, anyio.Event()
        arrived.set()

    def notify(self) -> None:
        """Wake the waiters: messages arrived other than by `append` (returned ones)."""
        self._notify()

    def arrival(self) -> anyio.Event:
        """An event set by the next `send`; take it before looking, so no message is missed."""
        return self._arrived

    async def send(self, name: str, body: Any) -> int:
        """Append a message; returns its id."""
        return await self.append(prepare_message(name, body))

    async def append(self, message: Outgoing) -> int:
        """Append a message checked by `prepare_message`; returns its id."""

        def insert(c: apsw.Connection) -> int:
            with c:
                count = queue_size(c)
                if count >= MAX_MESSAGES:
                    raise QueueFull(
                        f"queue of actor {self._instance.actor_id} holds {count} messages "
                        f"(limit {MAX_MESSAGES})"
                    )
                message_id = queue_append(c, message.name, message.body)
            return message_id

        message_id = await self._instance.ctx.db.locked(insert, internal=True)
        self._notify()
        return message_id

    async def next(
        self,
        names: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        completable: bool = False,
    ) -> Message | None:
        """The oldest message (of `names`, if given); waits up to `timeout` s (None: forever,
        0: only look)."""
        deadline = None if timeout is None else anyio.current_time() + timeout
        while True:
            arrival = self.arrival()
            message = await self._take(names, completable)
            if message is not None:
                return message
            remaining = None if deadline is None else deadline - anyio.current_time()
            if remaining is not None and remaining <= 0:
                return None
            # Only the wait itself lets the actor sleep: a sleep cancels the run handler, and
            # once a take has begun the message it removes must reach the code that asked.
            with self._instance.waiting(), anyio.move_on_after(remaining):
                await arrival.wait()

    async def _take(self, names: Sequence[str] | None, completable: bool) -> Message | None:
        skip = sorted(self._in_flight)

        def take(c: apsw.Connection) -> QueueMessage | None:
            row = next(queue_messages(c, limit=1, names=names, skip=skip), None)
            if row is not None and not completable:
                queue_delete(c, [row.id])
            return row

        row = await self._instance.ctx.db.locked(take, internal=True)
        if row is None:
            return None
        message = Message(row.id, row.name, cbor2.loads(row.body), row.created)
        if completable:
            self._in_flight.add(message.id)
            received = _received.get()
            if received is not None:
                received.append(message.id)
            message._complete = lambda: self._delete(message.id)
        return message

    async def _delete(self, message_id: int) -> None:
        await self._instance.ctx.db.locked(lambda c: queue_delete(c, [message_id]), internal=True)
        self._in_flight.discard(message_id)

    async def size(self) -> int:
        return await self._instance.ctx.db.locked(queue_size, internal=True)
