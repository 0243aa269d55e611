"""Connections: clients attached to an actor over a socket, with state, subscriptions and events.

A connection outlives the instance it attached to: the registry's hub (`realtime/hub.py`) keeps it,
and its transport (a WebSocket, or an in-process queue), while the actor sleeps, and the next
instance restores its state and subscriptions from the actor's database (`_pagekv_connections`).
Events are pushed, never persisted: one sent while a client is cut off is lost to it.

Every frame is a dict, the same over every transport (the server encodes it as JSON or CBOR):

    client -> actor   {"t": "connect", "params": ..., "token": ...}        (first, once)
                      {"t": "action", "id": N, "name": ..., "args": [...], "kwargs": {...}}
                      {"t": "sub" | "unsub", "id": N, "event": ...}
    actor -> client   {"t": "init", "conn": ID}
                      {"t": "result", "id": N, "result": ...}
                      {"t": "error", "id": N, "error": {"code": ..., "message": ...}}
                      {"t": "event", "name": ..., "args": [...]}
"""

from __future__ import annotations

import contextvars
import enum
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import cbor2

from pagekv.actor.typed_values import cbor_dumps

Frame = dict[str, Any]


class CloseCode(enum.IntEnum):
    """Why a connection ended, as WebSocket close codes. The client library reconnects by
    itself after the ones in `RECONNECT` (the actor went elsewhere, or the server stops or
    restarts, whoever closed the socket: pagekv, uvicorn at its exit, or a proxy)."""

    NORMAL = 1000
    """`conn.disconnect(reason)`, or the client closed it."""
    GOING_AWAY = 1001
    """The server shuts down, or drains and takes no new socket: connect again (elsewhere)."""
    MALFORMED = 1007
    """A frame that does not decode, or is not one of the frames above."""
    TOO_LARGE = 1009
    """A frame from the client beyond `ConnectionLimits.max_in_bytes`."""
    INTERNAL = 1011
    SERVICE_RESTART = 1012
    """The server restarts (uvicorn closes the sockets still open with it as it exits)."""
    TRY_AGAIN_LATER = 1013
    """An overloaded server or proxy: connect again later."""
    UNAUTHORIZED = 4001
    REFUSED = 4003
    """`on_before_connect` raised (its message is the reason), or the parameters are invalid."""
    NOT_FOUND = 4004
    """No such actor type, or (`mode=get`) no such actor, or it was destroyed."""
    UNSENDABLE = 4007
    """A frame for this connection that its encoding cannot carry (JSON has no set):
    connect with `encoding=cbor`."""
    SLOW_CONSUMER = 4008
    """The client read too slowly: its buffer of unsent frames passed `max_buffered_bytes`."""
    MOVED = 4009
    """The actor stopped serving here (taken over by another process, or its store failed):
    connect again, and the connection is served wherever the actor runs now."""


RECONNECT = frozenset(
    {
        CloseCode.GOING_AWAY,
        CloseCode.MOVED,
        CloseCode.INTERNAL,
        CloseCode.SERVICE_RESTART,
        CloseCode.TRY_AGAIN_LATER,
    }
)

_REASON_BYTES = 123
"""The most bytes a WebSocket close reason may hold."""


def close_reason(text: str) -> str:
    """`text` cut to fit a close frame (whole characters only)."""
    data = text.encode()
    if len(data) <= _REASON_BYTES:
        return text
    return data[: _REASON_BYTES - 3].decode(errors="ignore") + "..."


@dataclass(frozen=True)
class ConnectionLimits:
    """Sizes a connection may not pass; the server takes them from its config."""

    max_in_bytes: int = 64 * 1024
    """The largest frame a client may send (an action call with its arguments)."""
    max_out_bytes: int = 1 << 20
    """The largest frame sent to a client (an event, a result): a bigger event is refused to
    the code that sends it (`MessageTooLarge`), a bigger result answered with an error."""
    max_buffered_bytes: int = 4 << 20
    """Frames encoded but not yet taken by a client: past it, the connection is closed
    (`SLOW_CONSUMER`), so one slow reader never holds unbounded memory."""

    def __post_init__(self) -> None:
        for name in ("max_in_bytes", "max_out_bytes", "max_buffered_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_buffered_bytes < self.max_out_bytes:
            raise ValueError("max_buffered_bytes must be at least max_out_bytes")


class MessageTooLarge(ValueError):
    """An event or a result encodes to more than `ConnectionLimits.max_out_bytes`."""


class Transport(Protocol):
    """Where a connection's frames go: a socket's sender, or an in-process client's queue.
    `push` never blocks: a transport that cannot take a frame closes itself (`SLOW_CONSUMER`)."""

    def push(self, frame: Frame, size: int) -> None: ...

    def close(self, code: CloseCode, reason: str) -> None: ...


class _Unloaded:
    """A hibernated connection's state: in the database, not in memory."""

    def __repr__(self) -> str:
        return "<unloaded>"


UNLOADED: Any = _Unloaded()


@dataclass(eq=False)
class Connection:
    """One client attached to an actor. `state` is persisted (CBOR) with the actor's database;
    `params` are what the client sent as it connected; `subscriptions` the events it receives
    from `ctx.broadcast`."""

    name: str
    key: str
    params: Any
    transport: Transport = field(repr=False)
    limits: ConnectionLimits = field(repr=False)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    subscriptions: set[str] = field(default_factory=set)
    _state: Any = None
    saved: bytes | None = field(default=None, repr=False)
    """The state as the database holds it (None: no row yet)."""
    touched: bool = field(default=False, repr=False)
    """`state` was read or set since the last save: it may have changed."""
    close_code: CloseCode | None = None
    """Set once the connection is closed from this side (`close`)."""

    @property
    def closed(self) -> bool:
        return self.close_code is not None

    @property
    def state(self) -> Any:
        self.touched = True
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self.touched = True
        self._state = value

    def send(self, event: str, *args: Any) -> None:
        """Push `event` to this connection alone, subscribed or not."""
        frame = {"t": "event", "name": event, "args": list(args)}
        self.push(frame, encoded_size(frame, self.limits))

    def push(self, frame: Frame, size: int) -> None:
        if not self.closed:
            self.transport.push(frame, size)

    def disconnect(self, reason: str = "") -> None:
        """Close the connection; `on_disconnect` runs once the transport has closed."""
        self.close(CloseCode.NORMAL, reason)

    def close(self, code: CloseCode, reason: str) -> None:
        if self.close_code is None:
            self.close_code = code
            self.transport.close(code, close_reason(reason))


def encoded_size(frame: Frame, limits: ConnectionLimits) -> int:
    """The frame's size as CBOR (what the limits count); `MessageTooLarge` past `max_out_bytes`,
    `TypeError` for a value CBOR cannot hold."""
    try:
        size = len(cbor_dumps(frame))  # as the frame is sent: a dataclass result too
    except (cbor2.CBOREncodeError, ValueError, RecursionError) as e:  # a cyclic dataclass
        what = "an event" if frame.get("t") == "event" else "an answer"
        raise TypeError(f"{what} must be CBOR-serialisable: {e}") from e
    if size > limits.max_out_bytes:
        what = f"event {frame['name']!r}" if frame.get("t") == "event" else "answer"
        raise MessageTooLarge(
            f"{what} encodes to {size} bytes, more than the {limits.max_out_bytes} a connection "
            "may be sent (ConnectionLimits.max_out_bytes)"
        )
    return size


calling_connection: contextvars.ContextVar[Connection | None] = contextvars.ContextVar(
    "pagekv_calling_connection", default=None
)
"""The connection whose frame the current action serves (`ctx.conn`)."""
