"""Connections over WebSocket: `/actors/{name}/connect?key=K[&mode=M][&encoding=json|cbor]`.

The frames are those of `pagekv.actor.realtime.connection`, as JSON text frames (the default) or
CBOR binary frames. The token travels in the `Authorization` header, or, for browsers (which cannot
set headers on a WebSocket), in the offered subprotocols as `pagekv.token.<token>` beside `pagekv`
(the one accepted, so the token is never echoed), or in the first frame (`{"t": "connect", "token":
...}`); never in the URL. Every refusal is a close with a code of `CloseCode` and a reason, after
the upgrade (a refused upgrade could carry no reason).

A socket holds an actor's connection for as long as it is open; the hub keeps it while the actor
sleeps (and the actor's lease with it, so it wakes here: `pagekv.actor.realtime.socket_leases`). A
server that drains takes no new socket: it closes it with `GOING_AWAY`, and the client connects
again, through its address, to a server that stays. A socket whose actor is found served elsewhere
(this server's hold on it ran out) gets a `not_owner` error frame for the frame that found it, which
did not run, and is closed with `MOVED`: its client reconnects to where the actor runs. No refusal
names another server. Frames from one socket run concurrently, at most `_IN_FLIGHT` at once: past it
the socket is not read until one ends, so a flood of frames is held up in TCP, not in memory. Frames
to the client wait in a buffer bounded by `ConnectionLimits.max_buffered_bytes` (`_Sender`)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import anyio
import cbor2
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as SocketClosed
from websockets.exceptions import InvalidHandshake

from pagekv.actor import ActorNotFound, NotOwner, OwnedElsewhere, UnknownActor
from pagekv.actor.directory.leases import Owner
from pagekv.actor.realtime.connection import (
    CloseCode,
    Connection,
    ConnectionLimits,
    Frame,
    MessageTooLarge,
    close_reason,
    encoded_size,
)
from pagekv.protocol import CBOR, JSON, BodyError, ErrorCode, decode, encode
from pagekv.server.app_state import Runtime
from pagekv.server.auth import header_token, token_matches
from pagekv.server.cluster.forward import FORWARDED_HEADER, forwarded
from pagekv.server.cluster.peer_auth import PEER_SCOPE_KEY, PROOF_HEADER, ProofError, call_target
from pagekv.server.http_errors import HttpError, classify
from pagekv.server.request_io import query_params
from pagekv.server.routes.gateway import MODES, log_failure

SUBPROTOCOL = "pagekv"
TOKEN_PREFIX = "pagekv.token."
_ROUTING = {"key": True, "mode": False, "encoding": False}
_IN_FLIGHT = 32
_CLOSE_GRACE_S = 1.0
_RELAY_CLOSE_S = 1.0
"""How long a relay waits for the owner's side of a close handshake: an owner that is stopped
(SIGSTOP) never answers, and websockets' default of 10 s kept a draining server that long."""
log = logging.getLogger("pagekv.server")


class _Sender:
    """A socket's `Transport`: frames are encoded as they are pushed (so the buffer counts
    bytes) and sent in order by `run`. Past its bound the buffer is dropped and the connection
    closed (`SLOW_CONSUMER`): a send stuck on a client that reads nothing is cancelled, and
    the close frame gets `_CLOSE_GRACE_S` to go out before the socket is given up. A frame
    this connection's encoding cannot carry (JSON has no set) closes this connection
    alone (`UNSENDABLE`), never the broadcast that sent it."""

    def __init__(self, websocket: WebSocket, media_type: str, limits: ConnectionLimits) -> None:
        self._websocket = websocket
        self._media_type = media_type
        self._limit = limits.max_buffered_bytes
        self._queue: deque[bytes] = deque()
        self._buffered = 0
        self._ready = anyio.Event()
        self._sending: anyio.CancelScope | None = None
        self.conn: Connection | None = None
        self.closing: tuple[int, str] | None = None
        self.farewell: bytes | None = None
        """A last frame, sent (within `_CLOSE_GRACE_S`) before the close frame."""

    def first(self, frame: Frame) -> None:
        """Send `frame` before anything pushed so far (the `init` frame, after the events
        `on_connect` may have sent)."""
        data = encode(frame, self._media_type)
        self._queue.appendleft(data)
        self._buffered += len(data)
        self._ready.set()

    def push(self, frame: Frame, size: int) -> None:
        if self.closing is not None:
            return
        try:
            data = encode(frame, self._media_type)
        except (TypeError, ValueError) as e:
            self._close_conn(CloseCode.UNSENDABLE, f"a frame this connection cannot carry: {e}")
            return
        if self._buffered + len(data) > self._limit:
            self._close_conn(
                CloseCode.SLOW_CONSUMER,
                f"the client reads too slowly: over {self._limit} bytes waiting to be sent",
            )
            return
        self._queue.append(data)
        self._buffered += len(data)
        self._ready.set()

    def _close_conn(self, code: CloseCode, reason: str) -> None:
        if self.conn is not None:
            self.conn.close(code, reason)  # which calls `close` below
        else:
            self.close(code, reason)

    def close(self, code: CloseCode, reason: str) -> None:
        if self.closing is None:
            self.closing = (int(code), close_reason(reason))
            self._queue.clear()
            self._buffered = 0
            self._ready.set()
            if self._sending is not None:
                self._sending.cancel()

    async def run(self) -> None:
        """Send until closed; then send the close frame."""
        while self.closing is None:
            if not self._queue:
                self._ready = anyio.Event()
                await self._ready.wait()
                continue
            data = self._queue.popleft()
            self._buffered -= len(data)
            with anyio.CancelScope() as self._sending:
                await self._send(data)
            self._sending = None
        code, reason = self.closing
        with anyio.move_on_after(_CLOSE_GRACE_S):
            if self.farewell is not None:
                await self._send(self.farewell)
            await self._websocket.close(code, reason)

    async def _send(self, data: bytes) -> None:
        if self._media_type == CBOR:
            await self._websocket.send_bytes(data)
        else:
            await self._websocket.send_text(data.decode())

    def close_with(self, frame: Frame, code: CloseCode, reason: str) -> None:
        """Close the connection, `frame` its last frame before the close."""
        if self.closing is None:
            self.farewell = encode(frame, self._media_type)
        self._close_conn(code, reason)


def _token_offered(websocket: WebSocket) -> bytes | None:
    """The token of the `Authorization` header, else of a `pagekv.token.` subprotocol."""
    given = header_token(websocket.scope)
    if given is not None:
        return given
    for protocol in websocket.scope.get("subprotocols", ()):
        if protocol.startswith(TOKEN_PREFIX):
            return protocol[len(TOKEN_PREFIX) :].encode()
    return None


async def _receive(websocket: WebSocket, limits: ConnectionLimits, media_type: str) -> Any:
    """The next frame, decoded; `_Refused` for one too large or malformed."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    data = message.get("bytes")
    if data is None:
        data = (message.get("text") or "").encode()
    if len(data) > limits.max_in_bytes:
        raise _Refused(
            CloseCode.TOO_LARGE, f"a frame of {len(data)} bytes; the limit is {limits.max_in_bytes}"
        )
    try:
        frame = decode(data, media_type)
    except BodyError as e:
        raise _Refused(CloseCode.MALFORMED, str(e)) from None
    if not isinstance(frame, dict) or not isinstance(frame.get("t"), str):
        raise _Refused(CloseCode.MALFORMED, 'a frame must be an object with a "t" field')
    if media_type == CBOR:
        try:  # CBOR can share values: a cyclic frame could be stored or answered nowhere
            cbor2.dumps(frame)
        except (cbor2.CBOREncodeError, ValueError, TypeError, RecursionError) as e:
            why = f"a frame that cannot be encoded again: {e}"
            raise _Refused(CloseCode.MALFORMED, why) from None
    return frame


class _Refused(Exception):
    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


async def connect(websocket: WebSocket) -> None:
    rt: Runtime = websocket.state.runtime
    offered = websocket.scope.get("subprotocols", ())
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    try:
        await _serve(websocket, rt)
    except _Refused as e:
        await websocket.close(int(e.code), close_reason(e.reason))
    except WebSocketDisconnect:
        pass


@dataclass(frozen=True)
class _Target:
    """What a socket's URL asks for: the actor, whether to create it, the frames' encoding."""

    name: str
    key: str
    create: bool
    media_type: str


async def _serve(websocket: WebSocket, rt: Runtime) -> None:
    """Refuse, relay or hold one socket: its URL read, its client authenticated, its `connect`
    frame received, then its connection opened here (or relayed to the actor's owner) and held
    until it closes."""
    if rt.registry.draining or not rt.registry.running:
        raise _Refused(CloseCode.GOING_AWAY, "the server is shutting down; connect again")
    target = _target(websocket)
    limits = rt.registry.hub.limits
    hello = await _authenticated_hello(websocket, rt, target.media_type, limits)
    sender = _Sender(websocket, target.media_type, limits)
    try:
        conn = await _open(websocket, rt, target, hello, sender)
    except OwnedElsewhere as e:
        relayed = encode({k: v for k, v in hello.items() if k != "token"}, target.media_type)
        await _relay(websocket, rt, e.owner, relayed, target.media_type)
        return
    await _hold(websocket, rt, conn, sender, target.media_type, limits)


def _target(websocket: WebSocket) -> _Target:
    """The socket's actor and settings from its path and query; `_Refused` for a query this
    route does not take."""
    try:
        params = query_params(websocket, _ROUTING)  # type: ignore[arg-type]
    except HttpError as e:
        raise _Refused(CloseCode.REFUSED, e.message) from None
    mode = params.get("mode", "get_or_create")
    encoding = params.get("encoding", "json")
    if mode not in MODES or encoding not in ("json", "cbor"):
        raise _Refused(
            CloseCode.REFUSED, f"mode must be one of {list(MODES)}, encoding json or cbor"
        )
    return _Target(
        websocket.path_params["name"],
        websocket.query_params["key"],
        create=mode == "get_or_create",
        media_type=CBOR if encoding == "cbor" else JSON,
    )


async def _authenticated_hello(
    websocket: WebSocket, rt: Runtime, media_type: str, limits: ConnectionLimits
) -> Frame:
    """The `connect` frame, from a client with the server's token: a token offered with the
    upgrade is checked before the frame is waited for; without one, the frame must carry it."""
    expected = _expected_token(websocket, rt)
    offered = _token_offered(websocket)
    if expected is not None and offered is not None and not token_matches(offered, expected):
        raise _Refused(CloseCode.UNAUTHORIZED, "wrong token")
    hello = await _hello(websocket, rt, media_type, limits)
    if expected is not None and offered is None and not token_matches(_token_in(hello), expected):
        raise _Refused(
            CloseCode.UNAUTHORIZED,
            "missing or wrong token: send it as Authorization: Bearer, as a "
            f"{TOKEN_PREFIX}<token> subprotocol, or in the connect frame",
        )
    return hello


def _expected_token(websocket: WebSocket, rt: Runtime) -> bytes | None:
    """The token a client must give; None on a server without one, and for a socket relayed
    by a server that proved the cluster secret."""
    if rt.config.token is None or PEER_SCOPE_KEY in websocket.scope:
        return None
    return rt.config.token.encode()


async def _hello(
    websocket: WebSocket, rt: Runtime, media_type: str, limits: ConnectionLimits
) -> Frame:
    """The first frame, which must be a `connect` frame and come within the header timeout."""
    with anyio.move_on_after(rt.config.header_timeout_s) as waited:
        hello: Frame = await _receive(websocket, limits, media_type)
    if waited.cancelled_caught:
        raise _Refused(CloseCode.REFUSED, "no connect frame in time")
    if hello["t"] != "connect" or not set(hello) <= {"t", "params", "token", "input"}:
        raise _Refused(
            CloseCode.MALFORMED, 'the first frame must be {"t": "connect", "params": ...}'
        )
    return hello


def _token_in(hello: Frame) -> bytes:
    """The token a `connect` frame carries; empty if it carries none."""
    token = hello.get("token")
    return token.encode() if isinstance(token, str) else b""


async def _open(
    websocket: WebSocket, rt: Runtime, target: _Target, hello: Frame, sender: _Sender
) -> Connection:
    """The actor's connection for this socket, from the hub; `OwnedElsewhere` for an actor
    another server owns, `_Refused` for any other failure."""
    try:
        via = forwarded(websocket)  # type: ignore[arg-type]
    except HttpError as e:
        raise _Refused(CloseCode.REFUSED, e.message) from None
    try:
        return await rt.registry.hub.connect(
            target.name,
            target.key,
            hello.get("params"),
            sender,
            create=target.create,
            input=hello.get("input"),
            via=via,
        )
    except OwnedElsewhere:
        raise  # `_serve` relays the socket to the owner
    except Exception as e:
        raise _refusal(e) from None


def _refusal(error: Exception) -> _Refused:
    """How a socket is closed when the hub could not connect it to its actor."""
    match error:
        case UnknownActor() | ActorNotFound():
            return _Refused(CloseCode.NOT_FOUND, str(error))
        case NotOwner():  # relayed here, for an actor that left: the relaying server routes again
            return _Refused(CloseCode.MOVED, "the actor is not served here; reconnect")
    failure = classify(error, in_action=True)
    runtime_failure = failure.status >= 500 and failure.code != ErrorCode.ACTION_ERROR
    return _Refused(CloseCode.INTERNAL if runtime_failure else CloseCode.REFUSED, failure.message)


async def _hold(
    websocket: WebSocket,
    rt: Runtime,
    conn: Connection,
    sender: _Sender,
    media_type: str,
    limits: ConnectionLimits,
) -> None:
    """Serve an open connection: its `init` frame first, then frames both ways until either
    side closes; the hub is told once it is over, whatever ended it."""
    sender.conn = conn
    sender.first({"t": "init", "conn": conn.id})
    try:
        # the actions a socket started run to their end even when it closes under them (as
        # an HTTP call does when its client hangs up): only the reading and sending stop
        async with anyio.create_task_group() as actions, anyio.create_task_group() as io:
            io.start_soon(_send_then_stop, sender, io.cancel_scope)
            await _read(websocket, rt, conn, sender, media_type, limits, actions)
            io.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await rt.registry.hub.disconnected(conn)


async def _relay(
    websocket: WebSocket, rt: Runtime, owner: Owner, hello: bytes, media_type: str
) -> None:
    """Another server owns the actor: carry the socket's frames to it and back, so a socket
    opened at any server reaches the actor's one instance. The token stays here (the relay
    proves the cluster secret instead, and goes on only once the owner proved it too: see
    `cluster/peer_auth.py`); the owner serves the connection as forwarded: if it no longer owns the
    actor it refuses, and the client reconnects (`RECONNECT`)."""
    assert owner.address is not None, "the registry forwards only to owners with an address"
    target = owner.address.rstrip("/").replace("http", "ws", 1) + websocket.url.path
    forwarding = f"{rt.registry.id} {owner.registry} {owner.until!r}"
    proof, nonce = rt.forwarder.key.sign_request(
        owner.registry, forwarding, "GET", call_target(websocket.scope)
    )
    headers = {FORWARDED_HEADER: forwarding, PROOF_HEADER: proof}
    offered = [
        p for p in websocket.scope.get("subprotocols", ()) if not p.startswith(TOKEN_PREFIX)
    ] or None
    try:
        upstream = await ws_connect(
            f"{target}?{websocket.url.query}",
            additional_headers=headers,
            subprotocols=offered,  # type: ignore[arg-type]
            max_size=None,
            compression=None,
            open_timeout=rt.config.forward_connect_s,
            close_timeout=_RELAY_CLOSE_S,
        )
    except (OSError, TimeoutError, InvalidHandshake) as e:
        # the cause names the owner's address: it goes to the log, not to the client
        log.warning("relay to %s: the owner could not be reached: %r", owner.address, e)
        raise _Refused(CloseCode.MOVED, "the actor's owner could not be reached") from None
    try:
        assert upstream.response is not None
        rt.forwarder.key.check_answer(upstream.response.headers.get(PROOF_HEADER), nonce, 101)
    except ProofError as e:
        await upstream.close()
        log.warning("relay to %s: not relayed: %s", owner.address, e)
        raise _Refused(CloseCode.MOVED, "the actor's owner could not be reached") from None
    rt.registry.counters["connections_relayed"] += 1
    async with upstream, anyio.create_task_group() as tg:
        tg.start_soon(_upstream_to_client, websocket, upstream, media_type, tg.cancel_scope)
        await upstream.send(hello if media_type == CBOR else hello.decode())
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                tg.cancel_scope.cancel()
                return
            raw = message.get("bytes")
            data = raw if raw is not None else message["text"]
            try:
                await upstream.send(data)
            except SocketClosed:
                return


async def _upstream_to_client(
    websocket: WebSocket, upstream: Any, media_type: str, scope: anyio.CancelScope
) -> None:
    try:
        async for data in upstream:
            if isinstance(data, bytes):
                await websocket.send_bytes(data)
            else:
                await websocket.send_text(data)
        code, reason = upstream.close_code or CloseCode.NORMAL, upstream.close_reason or ""
    except SocketClosed as e:
        code, reason = (e.rcvd.code, e.rcvd.reason) if e.rcvd else (CloseCode.MOVED, "")
    await websocket.close(code, reason)
    scope.cancel()


async def _send_then_stop(sender: _Sender, scope: anyio.CancelScope) -> None:
    try:
        await sender.run()
    finally:
        scope.cancel()


async def _read(
    websocket: WebSocket,
    rt: Runtime,
    conn: Connection,
    sender: _Sender,
    media_type: str,
    limits: ConnectionLimits,
    tg: Any,
) -> None:
    slots = anyio.Semaphore(_IN_FLIGHT)
    while sender.closing is None:
        try:
            frame = await _receive(websocket, limits, media_type)
        except _Refused as e:
            conn.close(e.code, e.reason)
            return
        except WebSocketDisconnect:
            if conn.close_code is None:  # the client closed it, or its socket died
                conn.close_code = CloseCode.NORMAL
            return
        await slots.acquire()
        tg.start_soon(_answer, rt, conn, sender, frame, slots)


async def _answer(
    rt: Runtime, conn: Connection, sender: _Sender, frame: Frame, slots: anyio.Semaphore
) -> None:
    hub = rt.registry.hub
    try:
        request = frame.get("id")
        try:
            match frame["t"]:
                case "action":
                    args, kwargs = frame.get("args", []), frame.get("kwargs", {})
                    name = frame.get("name")
                    if not (isinstance(name, str) and isinstance(args, list)) or not (
                        isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)
                    ):
                        raise _Refused(
                            CloseCode.MALFORMED,
                            'an action frame needs "name", "args" (a list), "kwargs" (an object)',
                        )
                    result = await hub.action(conn, name, tuple(args), kwargs)
                case "sub" | "unsub":
                    await hub.subscribe(conn, frame.get("event"), frame["t"] == "sub")
                    result = None
                case other:
                    raise _Refused(CloseCode.MALFORMED, f"unknown frame type {other!r}")
        except _Refused as e:
            conn.close(e.code, e.reason)
            return
        except OwnedElsewhere:  # found before it ran: the client sends it again once reconnected
            moved = "the actor is served by another server now; reconnect and send it again"
            error = {"code": ErrorCode.NOT_OWNER, "message": moved, "written": False}
            sender.close_with({"t": "error", "id": request, "error": error}, CloseCode.MOVED, moved)
            return
        except Exception as e:
            failure = classify(e, in_action=frame["t"] == "action")
            if frame["t"] == "action":
                log_failure("action", str(frame.get("name")), conn.name, conn.key, e, failure)
            _push_error(conn, request, failure.body()["error"])
            return
        answer = {"t": "result", "id": request, "result": result}
        try:
            conn.push(answer, encoded_size(answer, conn.limits))
        except MessageTooLarge as e:
            _push_error(conn, request, {"code": ErrorCode.ANSWER_TOO_LARGE, "message": str(e)})
        except TypeError as e:
            error = {"code": ErrorCode.UNENCODABLE_RESULT, "message": f"unsendable result: {e}"}
            _push_error(conn, request, error)
    finally:
        slots.release()


def _push_error(conn: Connection, request: Any, error: dict[str, Any]) -> None:
    """An error frame, its message cut (and saying so) to fit the outgoing limit."""
    room = conn.limits.max_out_bytes - 256
    message = str(error.get("message", ""))
    if len(message.encode()) > room:
        cut = message.encode()[: max(room, 0)].decode(errors="ignore")
        error = {**error, "message": f"{cut}... (cut to fit {conn.limits.max_out_bytes} bytes)"}
    conn.push({"t": "error", "id": request, "error": error}, 0)


ROUTES = [WebSocketRoute("/actors/{name}/connect", connect)]
