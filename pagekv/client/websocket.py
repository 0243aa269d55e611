"""A connection to an actor over WebSocket, for `HttpClient`: `handle.connect(params)`.

It reconnects by itself when the server closes the socket with a code of `RECONNECT` (the actor
moved to another process, or the server stops, drains or restarts: 1001, 1011, 1012, 1013, 4009) or
the socket drops, through the URL it was given (a load balancer's sends it to a server that stays),
waiting longer each time: a new connection with the same params, and the same subscriptions, which
are in place again before `reconnects` counts it, so every event sent from then on arrives (those
sent meanwhile are lost: events are never persisted). Calls under way when the socket drops raise
`ConnectionClosed`: they may have run. Any other close (refused, destroyed, disconnected by the
actor) ends it for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import cbor2
import tenacity
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as SocketClosed
from websockets.exceptions import InvalidHandshake
from websockets.typing import Data, Subprotocol

from pagekv.actor.realtime.client_connection import ActorConnection, ConnectionClosed, Event
from pagekv.actor.realtime.connection import RECONNECT, CloseCode
from pagekv.protocol import CBOR, encode

_ATTEMPTS = 20
_FIRST_WAIT_S = 0.05
_MAX_WAIT_S = 1.0
_BACK_OFF = tenacity.wait_exponential(
    multiplier=_FIRST_WAIT_S / 2, max=_MAX_WAIT_S / 2
) + tenacity.wait_random_exponential(multiplier=_FIRST_WAIT_S / 2, max=_MAX_WAIT_S / 2)
"""The wait after the n-th failed attempt: doubling from `_FIRST_WAIT_S` up to `_MAX_WAIT_S`,
of which the first half is fixed and the second drawn at random ("equal jitter"), so clients
sent away together do not come back together, even once their waits reach the cap."""


Prove = Callable[[str], tuple[dict[str, str], Callable[[Mapping[str, str]], None]]]
"""Given a socket's path and query: the headers to open it with, and a check of the handshake's
answer headers that raises `ValueError` unless the server proved itself (then the socket is
closed and counted as refused with `MOVED`, which is retried)."""


class RemoteConnection(ActorConnection):
    def __init__(
        self,
        url: str,
        token: str | None,
        name: str,
        key: str,
        params: Any,
        *,
        create: bool,
        input: Any,
        raise_error: Any,
        sink: ActorConnection | None = None,
        prove: Prove | None = None,
    ) -> None:
        """`sink`: where events and the connection's end are delivered, if not to this one (a
        connection of an actor's `ctx.client` relayed to the server that owns its actor).
        `prove`: how a server opening it proves itself instead of with a token (`Prove`)."""
        super().__init__(name, key, params)
        self._sink: ActorConnection = sink if sink is not None else self
        query = urlencode(
            {"key": key, "mode": "get_or_create" if create else "get", "encoding": "cbor"}
        )
        base = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1).rstrip("/")
        self._url = f"{base}/actors/{quote(name, safe='')}/connect?{query}"
        self._target = f"/actors/{name}/connect?{query}"
        self._token = token
        self._prove = prove
        self._input = input if create else None
        self._raise_error = raise_error
        self._socket: ClientConnection | None = None
        self._pending: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._settled = anyio.Event()
        """Set while a socket is open, or once the connection ended; not while reconnecting."""
        self.reconnects = 0

    async def __aenter__(self) -> RemoteConnection:
        await self._first_open()
        # websockets runs on asyncio alone; the reader is a task of its own, so connections
        # may be opened and closed in any order
        self._reader = asyncio.get_running_loop().create_task(self._read_forever())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _open(self) -> None:
        """Open a socket and send the connect frame; `ConnectionClosed` if refused."""
        protocols = [Subprotocol("pagekv")] + (
            [Subprotocol(f"pagekv.token.{self._token}")] if self._token else []
        )
        headers, check = self._prove(self._target) if self._prove is not None else ({}, None)
        socket = await connect(
            self._url,
            additional_headers=headers,
            subprotocols=protocols,
            max_size=None,
            compression=None,  # type: ignore[arg-type]
        )
        if check is not None:
            assert socket.response is not None, "an open socket had its handshake's answer"
            try:
                check(socket.response.headers)
            except ValueError as e:
                await socket.close()
                raise ConnectionClosed(CloseCode.MOVED, f"the server is not trusted: {e}") from None
        hello: dict[str, Any] = {"t": "connect", "params": self.params}
        if self._input is not None:
            hello["input"] = self._input
        try:
            await socket.send(cbor2.dumps(hello))
            while (frame := _decode(await socket.recv())).get("t") != "init":
                self._dispatch(frame)
        except SocketClosed as e:
            raise _closed(e) from None
        except BaseException:
            await socket.close()
            raise
        try:
            await self._subscribe_again(socket)
        except BaseException:
            await socket.close()
            raise
        if self.closed is not None:  # closed by the client while this socket opened: not kept
            await socket.close()
            return
        self.id = frame["conn"]
        self._socket = socket
        self._settled.set()

    async def _subscribe_again(self, socket: ClientConnection) -> None:
        """After a reconnect: subscribe to the events subscribed to before, and wait for each
        answer (delivering events that come meanwhile); `ConnectionClosed` (`MOVED`, which is
        retried) if one is refused."""
        asked = {}
        for event in sorted(self.subscriptions):
            request = next(self._ids)
            asked[request] = event
            await socket.send(cbor2.dumps({"t": "sub", "id": request, "event": event}))
        try:
            while asked:
                frame = _decode(await socket.recv())
                if frame.get("t") in ("result", "error") and frame.get("id") in asked:
                    event = asked.pop(frame["id"])
                    if frame["t"] == "error":
                        message = frame["error"].get("message", "")
                        raise ConnectionClosed(
                            CloseCode.MOVED, f"subscribing to {event!r} again failed: {message}"
                        )
                else:
                    self._dispatch(frame)
        except SocketClosed as e:
            raise _closed(e) from None

    async def _read_forever(self) -> None:
        while True:
            socket = self._socket
            if socket is None:  # closed before this task began
                return
            try:
                async for data in socket:
                    self._dispatch(_decode(data))
                error = _closed_of(socket)
            except SocketClosed as e:
                error = _closed(e)
            self._socket = None
            self._settled = anyio.Event()
            self._fail_pending(error)
            if self.closed is not None:
                return
            if error.code not in RECONNECT and error.code != 1006:
                self._finish(error.code, error.reason)
                return
            if not await self._reconnect(error):
                return

    async def _first_open(self) -> None:
        """`_open`, again after a refusal of `RECONNECT` (a draining server's, say), as a
        reconnect would; any other failure, or the last refusal, is raised."""
        async for attempt in _retrying(_sent_away):
            with attempt:
                await self._open()

    async def _reconnect(self, error: ConnectionClosed) -> bool:
        """A new socket after `error` (the server sent this one away, or it dropped), after a
        first wait as between attempts; False once the connection has ended for good, as it
        has once the client closes it meanwhile (no attempt is made after that, and a socket
        that opens after it is closed at once: a closed connection never comes back)."""
        retrying = _retrying(_worth_another_try)
        await anyio.sleep(_BACK_OFF(tenacity.RetryCallState(retrying, None, (), {})))
        try:
            async for attempt in retrying:
                with attempt:
                    if self.closed is not None:
                        return False
                    await self._open()
        except ConnectionClosed as refused:
            if refused.code not in RECONNECT:
                self._finish(refused.code, refused.reason)
                return False
            self._finish(error.code, f"{error.reason} (reconnecting failed {_ATTEMPTS} times)")
            return False
        except (OSError, InvalidHandshake, TimeoutError):
            self._finish(error.code, f"{error.reason} (reconnecting failed {_ATTEMPTS} times)")
            return False
        if self.closed is not None:
            return False
        self.reconnects += 1
        return True

    def _finish(self, code: int, reason: str) -> None:
        self._ended(code, reason)
        self._settled.set()
        if self._sink is not self:
            self._sink._ended(code, reason)

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("t")
        if kind == "event":
            self._sink._deliver(Event(frame["name"], tuple(frame.get("args", ()))))
        elif kind in ("result", "error"):
            waiter = self._pending.pop(frame["id"], None) if "id" in frame else None
            if waiter is not None:
                self._answers[frame["id"]] = frame
                waiter.set()

    def _fail_pending(self, error: ConnectionClosed) -> None:
        for request, waiter in list(self._pending.items()):
            self._answers[request] = {"t": "closed", "error": error}
            waiter.set()
        self._pending.clear()

    async def _request(self, frame: dict[str, Any]) -> Any:
        socket = self._socket
        if socket is None:
            raise ConnectionClosed(CloseCode.MOVED, "reconnecting; the call was not sent")
        request = next(self._ids)
        # as an HTTP call's body is: a dataclass argument as its fields, an enum as its value
        data = encode({**frame, "id": request}, CBOR)
        waiter = self._pending[request] = anyio.Event()
        try:
            await socket.send(data)
        except SocketClosed as e:
            self._pending.pop(request, None)
            raise ConnectionClosed(e.rcvd.code if e.rcvd else 1006, "the call was not sent") from e
        await waiter.wait()
        answer = self._answers.pop(request)
        if answer["t"] == "closed":
            raise ConnectionClosed(
                answer["error"].code, f"{answer['error'].reason}; it may have run"
            )
        if answer["t"] == "error":
            self._raise_error(answer["error"])
        return answer.get("result")

    async def _call(self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._request(
            {"t": "action", "name": action, "args": list(args), "kwargs": kwargs}
        )

    async def _subscribe(self, event: str, on: bool) -> None:
        """Sent again once reconnected if the socket drops first (a subscription is the same
        however often it is sent); `ConnectionClosed` once the connection ended for good."""
        while True:
            try:
                await self._request({"t": "sub" if on else "unsub", "event": event})
                return
            except ConnectionClosed:
                await self._settled.wait()
                self._check_open()

    async def _close(self) -> None:
        self._ended(CloseCode.NORMAL, "closed by the client")
        self._settled.set()
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.close()


def _sent_away(error: BaseException) -> bool:
    """A close whose code says to come back (`RECONNECT`): the server stops, drains or moved
    the actor."""
    return isinstance(error, ConnectionClosed) and error.code in RECONNECT


def _worth_another_try(error: BaseException) -> bool:
    """While reconnecting: a server that sent the socket away, or none that answered (refused,
    a failed handshake, a timeout). Any other close ends the connection."""
    return _sent_away(error) or isinstance(error, (OSError, InvalidHandshake, TimeoutError))


def _retrying(worth_it: Callable[[BaseException], bool]) -> tenacity.AsyncRetrying:
    """Up to `_ATTEMPTS` attempts, `_BACK_OFF` apart (on anyio's sleep, so it runs on any of
    its event loops), while the failure is `worth_it`; then the last failure is raised."""
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(worth_it),
        stop=tenacity.stop_after_attempt(_ATTEMPTS),
        wait=_BACK_OFF,
        sleep=anyio.sleep,
        reraise=True,
    )


def _decode(data: Data) -> Any:
    """A frame of the server's, which sends CBOR in binary frames only."""
    assert isinstance(data, bytes), "the server sends binary frames only"
    return cbor2.loads(data)


def _closed(e: SocketClosed) -> ConnectionClosed:
    if e.rcvd is not None:
        return ConnectionClosed(e.rcvd.code, e.rcvd.reason)
    return ConnectionClosed(1006, "the connection dropped")


def _closed_of(socket: ClientConnection) -> ConnectionClosed:
    code = socket.close_code if socket.close_code is not None else 1006
    return ConnectionClosed(code, socket.close_reason or "")
