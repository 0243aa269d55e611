"""The client's side of a connection: actions over it, subscriptions, and its events.

`ActorConnection` is what both clients return from `handle.connect(params)`: the in-process one
(`LocalConnection`, straight to the hub) and `pagekv.client`'s over a WebSocket. Events arrive
in one bounded inbox, in the order they were sent; `events(name, ...)` iterates over those of the
names given (and skips the others), `next_event` takes one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import cbor2

from pagekv.actor.directory.leases import Owner
from pagekv.actor.errors import ActorError, ActorNotFound, OwnedElsewhere, UnknownActor
from pagekv.actor.handle_base import CallsByName
from pagekv.actor.realtime.connection import CloseCode, Connection, Frame

if TYPE_CHECKING:
    from pagekv.actor.realtime.hub import Hub


@dataclass(frozen=True)
class Event:
    name: str
    args: tuple[Any, ...]

    @property
    def payload(self) -> Any:
        """The event's one argument (`ctx.broadcast("message", {...})`); None without any, the
        tuple of them with several."""
        if not self.args:
            return None
        return self.args[0] if len(self.args) == 1 else self.args


class ConnectionClosed(ActorError):
    """The connection ended: `code` (a `CloseCode` value) and `reason` say why."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"connection closed ({code}): {reason}" if reason else f"closed ({code})")
        self.code = code
        self.reason = reason


class ActorConnection(CallsByName):
    """Subclasses say how frames travel: `_call`, `_subscribe` and `_close`."""

    def __init__(self, name: str, key: str, params: Any) -> None:
        self.name = name
        self.key = key
        self.params = params
        self.id: str | None = None
        """The connection's id, once connected."""
        self.subscriptions: set[str] = set()
        self.closed: ConnectionClosed | None = None
        self._inbox: deque[Event] = deque()
        self._arrived = anyio.Event()

    async def call(self, action: str, *args: Any, **kwargs: Any) -> Any:
        """Run `action` on the actor over this connection (`ctx.conn` is this connection)."""
        self._check_open()
        return await self._call(action, args, kwargs)

    async def subscribe(self, event: str) -> None:
        """Receive the actor's broadcasts of `event` (saved with the connection, so a
        hibernated actor still sends them once it wakes)."""
        self._check_open()
        await self._subscribe(event, True)
        self.subscriptions.add(event)

    async def unsubscribe(self, event: str) -> None:
        self._check_open()
        await self._subscribe(event, False)
        self.subscriptions.discard(event)

    async def next_event(self, *names: str) -> Event:
        """The next event (of one of `names`, if given); `ConnectionClosed` once the connection
        ended and nothing is left."""
        while True:
            while self._inbox:
                event = self._inbox.popleft()
                self._taken(event)
                if not names or event.name in names:
                    return event
            if self.closed is not None:
                raise self.closed
            self._arrived = anyio.Event()
            await self._arrived.wait()

    async def events(self, *names: str) -> AsyncIterator[Event]:
        """The events (of `names`, subscribed to first if not yet), until the connection
        ends for good."""
        for name in names:
            if name not in self.subscriptions:
                await self.subscribe(name)
        while True:
            try:
                yield await self.next_event(*names)
            except ConnectionClosed:
                return

    async def close(self) -> None:
        if self.closed is None:
            await self._close()
            self._ended(CloseCode.NORMAL, "closed by the client")

    async def __aenter__(self) -> ActorConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- for subclasses ---------------------------------------------------------------------

    def _deliver(self, event: Event) -> None:
        self._inbox.append(event)
        self._arrived.set()

    def _taken(self, event: Event) -> None:
        """An event left the inbox (for transports that count what is buffered)."""

    def _ended(self, code: int, reason: str) -> None:
        if self.closed is None:
            self.closed = ConnectionClosed(code, reason)
        self._arrived.set()

    def _check_open(self) -> None:
        if self.closed is not None:
            raise self.closed

    async def _call(self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def _subscribe(self, event: str, on: bool) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError


class Relay(Protocol):
    """How a registry reaches actors another registry owns (`Registry.remote`), as far as a
    connection needs it."""

    def connection(
        self,
        owner: Owner,
        name: str,
        key: str,
        params: Any,
        *,
        create: bool,
        input: Any,
        sink: ActorConnection,
    ) -> ActorConnection: ...


class LocalConnection(ActorConnection):
    """A connection of the in-process client: frames go straight to the hub; events are copied
    through CBOR (as over a socket, so they never share objects with the actor) into an inbox
    bounded like a socket's buffer."""

    def __init__(
        self,
        hub: Hub,
        name: str,
        key: str,
        params: Any,
        *,
        create: bool,
        input: Any,
        relay: Relay | None = None,
    ) -> None:
        super().__init__(name, key, params)
        self._hub = hub
        self._relay = relay
        self._remote: ActorConnection | None = None
        """The connection to the owner's server, when another registry owns the actor."""
        self._create = create
        self._input = input
        self._transport = _LocalTransport(self, hub.limits.max_buffered_bytes)
        self._conn: Connection | None = None

    async def open(self) -> LocalConnection:
        """Connect; a refusal is a `ConnectionClosed` with the code a socket would close with
        (the cause chained)."""
        try:
            self._conn = await self._hub.connect(
                self.name,
                self.key,
                self.params,
                self._transport,
                create=self._create,
                input=self._input,
            )
        except (UnknownActor, ActorNotFound) as e:
            raise ConnectionClosed(CloseCode.NOT_FOUND, str(e)) from e
        except OwnedElsewhere as e:
            if self._relay is None:
                raise ConnectionClosed(CloseCode.MOVED, str(e)) from e
            remote = self._relay.connection(
                e.owner,
                self.name,
                self.key,
                self.params,
                create=self._create,
                input=self._input,
                sink=self,
            )
            await remote.__aenter__()
            self._remote, self.id = remote, remote.id
            return self
        except Exception as e:
            raise ConnectionClosed(CloseCode.REFUSED, f"{type(e).__name__}: {e}") from e
        self.id = self._conn.id
        return self

    async def __aenter__(self) -> LocalConnection:
        return await self.open() if self._conn is None and self._remote is None else self

    def _taken(self, event: Event) -> None:
        self._transport.taken(event)

    def _closed_by_actor(self, code: CloseCode, reason: str) -> None:
        self._ended(code, reason)
        conn, self._conn = self._conn, None
        if conn is not None:
            self._hub.spawn_disconnected(conn)

    async def _call(self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._remote is not None:
            return await self._remote.call(action, *args, **kwargs)
        assert self._conn is not None, "open the connection first (async with)"
        return await self._hub.action(self._conn, action, args, kwargs)

    async def _subscribe(self, event: str, on: bool) -> None:
        if self._remote is not None:
            await (self._remote.subscribe(event) if on else self._remote.unsubscribe(event))
            return
        assert self._conn is not None, "open the connection first (async with)"
        await self._hub.subscribe(self._conn, event, on)

    async def _close(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.__aexit__(None, None, None)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close_code = CloseCode.NORMAL
            await self._hub.disconnected(conn)


class _LocalTransport:
    """The hub's side of a `LocalConnection` (a `Transport`)."""

    def __init__(self, connection: LocalConnection, limit: int) -> None:
        self._connection = connection
        self._limit = limit
        self._buffered = 0
        self._sizes: dict[int, int] = {}

    def push(self, frame: Frame, size: int) -> None:
        if self._buffered + size > self._limit:
            conn = self._connection._conn
            reason = f"more than {self._limit} bytes of events unread"
            if conn is not None:
                conn.close(CloseCode.SLOW_CONSUMER, reason)
            return
        copy = cbor2.loads(cbor2.dumps(frame))
        event = Event(copy["name"], tuple(copy["args"]))
        self._buffered += size
        self._sizes[id(event)] = size
        self._connection._deliver(event)

    def taken(self, event: Event) -> None:
        self._buffered -= self._sizes.pop(id(event), 0)

    def close(self, code: CloseCode, reason: str) -> None:
        self._connection._closed_by_actor(code, reason)
