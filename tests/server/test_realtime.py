"""Connections over real WebSockets on loopback: connect and refuse, state, broadcast, send,
disconnect hooks, hibernation, takeover and reconnect, limits, auth, slow consumers, shutdown,
raw HTTP, and actor-to-actor calls."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import cbor2
import pytest
from server_helpers import TOKEN, serving
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse
from test_cli import APP, ServeProcess
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as SocketClosed

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.realtime.client_connection import ConnectionClosed
from pagekv.actor.realtime.connection import UNLOADED, CloseCode
from pagekv.client import HttpClient
from pagekv.kv import MemoryStore, open_kv

pytestmark = pytest.mark.anyio

room = actor("room", state={"posts": 0}, sleep_timeout=0.3)
seen: list[tuple[str, Any]] = []


@room.on_before_connect
async def _check(ctx: ActorContext, params: Any) -> None:
    if not isinstance(params, dict) or params.get("name") == "mallory":
        raise ValueError("mallory may not join")


@room.on_connect
async def _joined(ctx: ActorContext, conn: Any) -> None:
    conn.state = {"name": conn.params["name"], "said": 0}
    seen.append(("connect", conn.params["name"]))


@room.on_disconnect
async def _left(ctx: ActorContext, conn: Any) -> None:
    seen.append(("disconnect", conn.state))


@room.action
async def post(ctx: ActorContext, text: str) -> int:
    ctx.state["posts"] += 1
    if ctx.conn is not None:
        ctx.conn.state["said"] += 1
    ctx.broadcast("message", {"text": text})
    return len(ctx.conns)


@room.action
async def me(ctx: ActorContext) -> Any:
    return ctx.conn.state if ctx.conn is not None else None


@room.action
async def whisper(ctx: ActorContext, name: str, text: str) -> int:
    targets = [c for c in ctx.conns if c.state["name"] == name]
    for conn in targets:
        conn.send("whisper", text)
    return len(targets)


@room.action
async def kick(ctx: ActorContext, name: str) -> None:
    for conn in ctx.conns:
        if conn.state["name"] == name:
            conn.disconnect("kicked")


@room.action
async def flood(ctx: ActorContext, count: int, size: int) -> None:
    for _ in range(count):
        ctx.broadcast("message", "x" * size)


@room.action
async def listen(ctx: ActorContext, key: str) -> Any:
    async with ctx.client.get_or_create("room", key).connect({"name": "an actor"}) as conn:
        await conn.subscribe("message")
        await conn.post("heard at b")
        return (await conn.next_event("message")).payload


@room.action
async def later(ctx: ActorContext, seconds: float, text: str) -> None:
    await ctx.schedule.after(seconds, "post", text)


@room.action
async def ask(ctx: ActorContext, key: str) -> Any:
    return await ctx.client.get_or_create("room", key).post("from another actor")


@room.on_request
async def _http(ctx: ActorContext, request: Any) -> Any:
    if request.url.path == "/wrong":
        return {"not": "a response"}
    body = await request.body()
    return JSONResponse(
        {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.query_params),
            "body": body.decode(),
            "posts": ctx.state["posts"],
        }
    )


lobby = actor("lobby", state={"debit": 0, "credit": 0}, sleep_timeout=0.3)
woke_with: list[Any] = []


@lobby.on_connect
async def _welcome(ctx: ActorContext, conn: Any) -> None:
    conn.state = {"name": conn.params["name"]}
    conn.send("welcome", conn.params["name"])  # before the client has its init frame


@lobby.on_wake
async def _woke(ctx: ActorContext) -> None:
    woke_with.append(sorted(c.state["name"] for c in ctx.conns))


@lobby.on_disconnect
async def _lobby_left(ctx: ActorContext, conn: Any) -> None:
    seen.append(("lobby disconnect", conn.state))
    raise RuntimeError("a hook that fails still runs once")


@lobby.action
async def transfer(ctx: ActorContext) -> None:
    ctx.state["debit"] += 1
    await anyio.sleep(0.5)
    ctx.state["credit"] += 1


@lobby.action
async def balance(ctx: ActorContext) -> dict[str, int]:
    return ctx.state


@lobby.action
async def stamp(ctx: ActorContext) -> int:
    return ctx.broadcast("stamp", {"a"})  # a set: CBOR holds it, JSON does not


@lobby.action
async def spoil(ctx: ActorContext) -> None:
    assert ctx.conn is not None
    ctx.conn.state = {"fn": print}


@lobby.action
async def whoami(ctx: ActorContext) -> Any:
    return ctx.conn.state if ctx.conn is not None else None


@lobby.action
async def shout(ctx: ActorContext, size: int) -> None:
    raise ValueError("y" * size)


@lobby.on_request
async def _teapot(ctx: ActorContext, request: Any) -> Any:
    if request.url.path == "/teapot":
        raise HTTPException(418, "short and stout")
    return PlainTextResponse(request.scope["query_string"].decode())


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    woke_with.clear()
    seen.clear()


def _ws_url(url: str, key: str, **query: str) -> str:
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return url.replace("http://", "ws://") + f"/actors/room/connect?key={key}{extra}"


async def _raw(
    url: str, key: str, *, token: str | None = TOKEN, query: dict[str, str] | None = None
) -> Any:
    """A raw socket, connected as `ada` (JSON frames), with the token in a subprotocol."""
    protocols = ["pagekv"] + ([f"pagekv.token.{token}"] if token else [])
    socket_ = await ws_connect(_ws_url(url, key, **(query or {})), subprotocols=protocols)
    with contextlib.suppress(SocketClosed):  # a wrong token is refused before the frame
        await socket_.send(json.dumps({"t": "connect", "params": {"name": "ada"}}))
    return socket_


async def _closed_with(socket_: Any) -> tuple[int, str]:
    with anyio.fail_after(10):
        try:
            while True:
                await socket_.recv()
        except SocketClosed as e:
            assert e.rcvd is not None, e
            return e.rcvd.code, e.rcvd.reason


async def test_connections_share_broadcasts_keep_state_and_run_hooks() -> None:
    async with serving([room]) as s, s.client() as client:
        handle = client.get_or_create("room", "r1")
        async with handle.connect({"name": "ada"}) as ada, handle.connect({"name": "bob"}) as bob:
            await ada.subscribe("message")
            await bob.subscribe("message")
            assert await ada.post("hello") == 2
            for conn in (ada, bob):
                event = await conn.next_event("message")
                assert (event.name, event.payload) == ("message", {"text": "hello"})
            assert await ada.me() == {"name": "ada", "said": 1}
            assert await bob.me() == {"name": "bob", "said": 0}
            assert await bob.whisper("ada", "psst") == 1
            assert (await ada.next_event("whisper")).payload == "psst"
            await bob.unsubscribe("message")
            await handle.post("over http")  # an HTTP call broadcasts too; ctx.conn is None
            assert (await ada.next_event("message")).payload == {"text": "over http"}
            assert not bob._inbox
        assert ("connect", "ada") in seen and ("connect", "bob") in seen
        await _eventually(lambda: len([e for e in seen if e[0] == "disconnect"]) == 2)
        assert ("disconnect", {"name": "ada", "said": 1}) in seen


async def test_broadcast_reaches_many_connections() -> None:
    async with serving([room]) as s, s.client() as client:
        handle = client.get_or_create("room", "many")
        conns = [handle.connect({"name": f"u{i}"}) for i in range(50)]
        for conn in conns:
            await conn.__aenter__()
            await conn.subscribe("message")
        assert await handle.post("all") == 50
        for conn in conns:
            assert (await conn.next_event()).payload == {"text": "all"}
        for conn in conns:
            await conn.__aexit__(None, None, None)


async def test_refusals_close_with_a_code_and_a_reason() -> None:
    async with serving([room]) as s, s.client() as client:
        with pytest.raises(ConnectionClosed) as refused:
            async with client.get_or_create("room", "r").connect({"name": "mallory"}):
                pass
        assert refused.value.code == CloseCode.REFUSED
        assert "mallory may not join" in refused.value.reason
        with pytest.raises(ConnectionClosed) as missing:
            async with client.get("room", "never-made").connect({"name": "ada"}):
                pass
        assert missing.value.code == CloseCode.NOT_FOUND
        async with s.http() as http:  # refused before anything was created
            answer = await http.post("/actors/room/actions/me?key=never-made&mode=get")
            assert answer.status_code == 404
        unknown = await ws_connect(
            s.url.replace("http://", "ws://") + "/actors/nope/connect?key=k",
            subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
        )
        await unknown.send(json.dumps({"t": "connect", "params": {}}))
        code, reason = await _closed_with(unknown)
        assert code == CloseCode.NOT_FOUND and "nope" in reason


async def test_auth_is_required_and_never_taken_from_the_url() -> None:
    async with serving([room]) as s:
        for attempt in (None, "wrong-token"):
            socket_ = await _raw(s.url, "auth", token=attempt)
            code, reason = await _closed_with(socket_)
            assert code == CloseCode.UNAUTHORIZED, (attempt, code, reason)
        in_url = await _raw(s.url, "auth", token=None, query={"token": TOKEN})
        assert (await _closed_with(in_url))[0] == CloseCode.REFUSED
        two = await ws_connect(  # the right token, and a second header: refused, as over HTTP
            _ws_url(s.url, "auth"),
            additional_headers=[("authorization", f"Bearer {TOKEN}"), ("authorization", "x")],
        )
        assert (await _closed_with(two))[0] == CloseCode.UNAUTHORIZED
        header = await ws_connect(
            _ws_url(s.url, "auth"), additional_headers={"authorization": f"Bearer {TOKEN}"}
        )
        await header.send(json.dumps({"t": "connect", "params": {"name": "ada"}}))
        assert json.loads(await header.recv())["t"] == "init"
        await header.close()
        in_frame = await ws_connect(_ws_url(s.url, "auth"), subprotocols=["pagekv"])
        assert in_frame.subprotocol == "pagekv"  # the token is never echoed
        await in_frame.send(json.dumps({"t": "connect", "params": {"name": "a"}, "token": TOKEN}))
        assert json.loads(await in_frame.recv())["t"] == "init"
        await in_frame.close()
        async with s.http() as http:  # nothing was created by the refused attempts' frames
            assert (await http.post("/actors/room/actions/me?key=auth&mode=get")).status_code == 200


async def test_malformed_oversize_and_unknown_frames() -> None:
    async with serving([room], ws_max_in_bytes=1024) as s:
        socket_ = await _raw(s.url, "bad")
        assert json.loads(await socket_.recv())["t"] == "init"
        await socket_.send(json.dumps({"t": "action", "id": 1, "name": "nope", "args": []}))
        error = json.loads(await socket_.recv())
        assert error["t"] == "error" and error["id"] == 1
        assert error["error"]["code"] == "unknown_action"
        await socket_.send(json.dumps({"t": "action", "id": 2, "name": "post", "args": [3]}))
        assert json.loads(await socket_.recv())["error"]["code"] == "invalid_arguments"
        await socket_.send(json.dumps({"t": "action", "id": 3, "name": "me", "args": []}))
        assert json.loads(await socket_.recv()) == {
            "t": "result",
            "id": 3,
            "result": {"name": "ada", "said": 0},
        }
        await socket_.send("{not json")
        assert (await _closed_with(socket_))[0] == CloseCode.MALFORMED
        big = await _raw(s.url, "bad")
        await big.recv()
        await big.send(json.dumps({"t": "action", "id": 1, "name": "post", "args": ["x" * 4096]}))
        assert (await _closed_with(big))[0] == CloseCode.TOO_LARGE
        odd = await _raw(s.url, "bad")
        await odd.recv()
        await odd.send(json.dumps({"t": "teleport"}))
        code, reason = await _closed_with(odd)
        assert code == CloseCode.MALFORMED and "teleport" in reason


async def test_an_event_beyond_the_outgoing_limit_is_refused_to_the_sender() -> None:
    async with serving([room], ws_max_out_bytes=2048) as s, s.client() as client:
        handle = client.get_or_create("room", "out")
        async with handle.connect({"name": "ada"}) as conn:
            await conn.subscribe("message")
            with pytest.raises(Exception, match="max_out_bytes"):
                await conn.flood(1, 4096)
            await conn.flood(1, 100)
            assert (await conn.next_event()).payload == "x" * 100


async def test_the_actor_hibernates_with_sockets_open_and_restores_them() -> None:
    async with serving([room]) as s, s.client() as client:
        registry = s.app.state.registry
        handle = client.get_or_create("room", "sleepy")
        async with handle.connect({"name": "ada"}) as ada, handle.connect({"name": "bob"}) as bob:
            await ada.subscribe("message")
            await ada.post("one")
            await _eventually(lambda: registry.metrics()["live"] == 0)
            assert registry.metrics()["connections"] == 2
            async with s.http() as http:
                exposition = (await http.get("/metrics")).text
            assert "pagekv_connections_open 2.0" in exposition
            assert "pagekv_actors_live 0.0" in exposition
            hibernated = registry.hub.connections("room/sleepy")
            assert all(c._state is UNLOADED for c in hibernated)  # in the database only
            sleeps = registry.counters["sleeps"]
            assert await bob.post("two") == 2  # a frame wakes it
            assert registry.counters["wakes"] == 2 and sleeps == 1
            assert await ada.me() == {"name": "ada", "said": 1}  # restored from the database
            assert [e.payload for e in [await ada.next_event(), await ada.next_event()]] == [
                {"text": "one"},
                {"text": "two"},
            ]
        await _eventually(lambda: len([e for e in seen if e[0] == "disconnect"]) == 2)


async def test_a_kick_closes_one_connection_and_runs_its_hook() -> None:
    async with serving([room]) as s, s.client() as client:
        handle = client.get_or_create("room", "kick")
        async with handle.connect({"name": "ada"}) as ada, handle.connect({"name": "bob"}) as bob:
            await ada.kick("bob")
            with pytest.raises(ConnectionClosed) as closed:
                await bob.next_event()
            assert (closed.value.code, closed.value.reason) == (CloseCode.NORMAL, "kicked")
            await _eventually(lambda: ("disconnect", {"name": "bob", "said": 0}) in seen)
            assert await ada.me() == {"name": "ada", "said": 0}


async def test_a_slow_consumer_is_cut_off_and_memory_stays_bounded() -> None:
    async with serving([room], ws_buffer_bytes=256 * 1024, ws_max_out_bytes=64 * 1024) as s:
        lazy = await _raw(s.url, "slow")
        await lazy.recv()
        await lazy.send(json.dumps({"t": "sub", "id": 1, "event": "message"}))
        await lazy.recv()
        lazy.transport.pause_reading()  # it stops reading: TCP fills, then the buffer
        async with s.client() as client:
            handle = client.get("room", "slow")
            for _ in range(40):
                await handle.flood(20, 30_000)
                if s.app.state.registry.hub.count() == 0:
                    break
        assert s.app.state.registry.hub.count() == 0
        await _eventually(lambda: any(e[0] == "disconnect" for e in seen))
        lazy.transport.resume_reading()
        code, reason = await _closed_with(lazy)
        assert code == CloseCode.SLOW_CONSUMER and "too slowly" in reason


async def test_a_dead_socket_is_reaped_by_pings() -> None:
    async with serving([room], ws_ping_interval_s=0.2, ws_ping_timeout_s=0.2) as s:
        port = int(s.url.rsplit(":", 1)[1])
        raw = socket.create_connection(("127.0.0.1", port))
        raw.sendall(
            b"GET /actors/room/connect?key=dead HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: pagekv, pagekv.token."
            + TOKEN.encode()
            + b"\r\n\r\n"
        )
        raw.settimeout(5)  # the server runs in this event loop: read on a thread
        assert (await anyio.to_thread.run_sync(raw.recv, 4096)).startswith(b"HTTP/1.1 101 ")
        hello = json.dumps({"t": "connect", "params": {"name": "ghost"}}).encode()
        mask = b"\x00\x00\x00\x00"
        raw.sendall(bytes([0x81, 0x80 | len(hello)]) + mask + hello)  # then never answers
        await _eventually(lambda: ("connect", "ghost") in seen)
        await _eventually(lambda: ("disconnect", {"name": "ghost", "said": 0}) in seen)
        raw.close()


async def test_shutdown_closes_sockets_with_going_away_and_the_next_wake_reaps_them() -> None:
    store = MemoryStore()
    async with serving([room], kv=store) as s:
        socket_ = await _raw(s.url, "bye")
        await socket_.recv()
        # the server stops (its lifespan ends) with the socket open
    code, reason = await _closed_with(socket_)
    assert code == CloseCode.GOING_AWAY and "shutting down" in reason
    assert not [e for e in seen if e[0] == "disconnect"]  # reaped at the next wake instead
    async with serving([room], kv=store) as s, s.client() as client:
        await client.get("room", "bye").me()
        assert seen.count(("disconnect", {"name": "ada", "said": 0})) == 1


async def test_a_due_schedule_wakes_a_hibernated_actor_whose_broadcast_reaches_its_sockets() -> (
    None
):
    async with serving([room]) as s, s.client() as client:
        handle = client.get_or_create("room", "timer")
        async with handle.connect({"name": "ada"}) as ada:
            await ada.subscribe("message")
            await ada.later(0.8, "from a schedule")
            await _eventually(lambda: s.app.state.registry.metrics()["live"] == 0)
            event = await ada.next_event("message")
            assert event.payload == {"text": "from a schedule"}
            assert s.app.state.registry.counters["wakes"] == 2


async def test_takeover_closes_stale_sockets_and_the_client_reconnects(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    store_a, store_b = open_kv(url), open_kv(url)
    try:
        async with (
            serving([room], kv=store_a) as a,
            serving([room], kv=store_b) as b,
            a.client() as client_a,
            b.client() as client_b,
        ):
            if True:
                handle = client_a.get_or_create("room", "moving")
                async with handle.connect({"name": "ada"}) as conn:
                    await conn.subscribe("message")
                    first = conn.id
                    await client_b.get("room", "moving").post("taken at b")  # b takes it over
                    await client_a.get("room", "moving").post("back at a")  # a finds out
                    await _eventually(lambda: conn.reconnects == 1)
                    assert conn.id != first
                    assert await conn.post("after") >= 1
                    payloads = []
                    while (event := await conn.next_event()).payload != {"text": "after"}:
                        payloads.append(event.payload)
                    assert await conn.me() == {"name": "ada", "said": 1}  # a new connection
        # the old connection reaped once (by the wake at b), the new one closed at the end
        await _eventually(lambda: len([e for e in seen if e[0] == "disconnect"]) == 2)
        assert [e[1]["said"] for e in seen if e[0] == "disconnect"] == [0, 1]
    finally:
        store_a.close()
        store_b.close()


async def test_a_socket_opened_at_another_server_reaches_the_owner(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    store_a, store_b = open_kv(url), open_kv(url)
    try:
        async with (
            serving([room], kv=store_a, advertise=True) as a,
            serving([room], kv=store_b, advertise=True) as b,
            a.client() as client_a,
            b.client() as client_b,
        ):
            at_a = client_a.get_or_create("room", "placed").connect({"name": "ada"})
            at_b = client_b.get_or_create("room", "placed").connect({"name": "bob"})
            async with at_a as ada, at_b as bob:
                await ada.subscribe("message")
                await bob.subscribe("message")
                assert await bob.post("via b") == 2  # both connections on a's one instance
                assert (await ada.next_event()).payload == {"text": "via b"}
                assert (await bob.next_event()).payload == {"text": "via b"}
                assert await bob.me() == {"name": "bob", "said": 1}
                registry_a, registry_b = a.app.state.registry, b.app.state.registry
                assert registry_a.hub.count() == 2 and registry_b.hub.count() == 0
                assert registry_b.counters["connections_relayed"] == 1
                # ctx.client at b reaches the actor a owns, through a's server
                assert await client_b.get_or_create("room", "caller-at-b").ask("placed") == 2
                assert (await ada.next_event()).payload == {"text": "from another actor"}
                # ... and connects to it too: over a socket to a, events and all
                listened = await client_b.get_or_create("room", "b2").listen("placed")
                assert listened == {"text": "heard at b"}
                assert (await ada.next_event()).payload == {"text": "heard at b"}
                await _eventually(lambda: registry_a.hub.count() == 2)  # closed as it ended
            # ada, bob and the actor's connection
            await _eventually(lambda: len([e for e in seen if e[0] == "disconnect"]) == 3)
    finally:
        store_a.close()
        store_b.close()


async def test_raw_http_reaches_the_actor() -> None:
    async with serving([room]) as s:
        async with s.http() as http:
            answer = await http.put("/actors/room/request/a/b?key=raw&x=1&y=2", content=b"hi")
            assert answer.status_code == 200
            assert answer.json() == {
                "method": "PUT",
                "path": "/a/b",
                "query": {"x": "1", "y": "2"},
                "body": "hi",
                "posts": 0,
            }
            wrong = await http.get("/actors/room/request/wrong?key=raw")
            assert wrong.status_code == 500 and "must return a starlette Response" in wrong.text
            assert (await http.get("/actors/room/request/a")).status_code == 400  # no key
            assert (await http.get("/actors/ghost/request/a?key=k")).status_code == 404
        async with s.http(token=None) as anonymous:
            assert (await anonymous.get("/actors/room/request/a?key=raw")).status_code == 401


async def test_actors_call_each_other_through_ctx_client() -> None:
    async with serving([room]) as s, s.client() as client:
        assert await client.get_or_create("room", "caller").ask("callee") == 0
        async with s.http() as http:
            answer = await http.get("/actors/room/request/?key=callee&mode=get")
            assert answer.json()["posts"] == 1


async def test_the_in_process_client_connects_too() -> None:
    async with Registry([room], "memory://").run() as client:
        handle = client.get_or_create("room", "local")
        async with handle.connect({"name": "ada"}) as conn:
            await conn.subscribe("message")
            assert await conn.post("hi") == 1
            assert (await conn.next_event()).payload == {"text": "hi"}
            assert await conn.me() == {"name": "ada", "said": 1}
        await _eventually(lambda: ("disconnect", {"name": "ada", "said": 1}) in seen)


async def test_cbor_frames_carry_bytes() -> None:
    async with serving([room]) as s:
        socket_ = await ws_connect(
            _ws_url(s.url, "cbor", encoding="cbor"),
            subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
        )
        await socket_.send(cbor2.dumps({"t": "connect", "params": {"name": b"\x00\xff"}}))
        assert cbor2.loads(await socket_.recv())["t"] == "init"
        await socket_.send(cbor2.dumps({"t": "action", "id": 7, "name": "me", "args": []}))
        answer = cbor2.loads(await socket_.recv())
        assert answer == {"t": "result", "id": 7, "result": {"name": b"\x00\xff", "said": 0}}
        await socket_.close()


async def _eventually(check: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


async def _lobby_socket(url: str, key: str, name: str, encoding: str = "json") -> Any:
    socket_ = await ws_connect(
        url.replace("http://", "ws://") + f"/actors/lobby/connect?key={key}&encoding={encoding}",
        subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
    )
    hello = {"t": "connect", "params": {"name": name}}
    await socket_.send(cbor2.dumps(hello) if encoding == "cbor" else json.dumps(hello))
    return socket_


def _frame(data: str | bytes) -> Any:
    return cbor2.loads(data) if isinstance(data, bytes) else json.loads(data)


async def test_init_comes_first_even_when_on_connect_sends_at_once() -> None:
    async with serving([lobby]) as s:
        raw = await _lobby_socket(s.url, "hello", "ada")
        assert _frame(await raw.recv())["t"] == "init"
        assert _frame(await raw.recv()) == {"t": "event", "name": "welcome", "args": ["ada"]}
        await raw.close()
        async with (
            s.client() as client,
            client.get_or_create("lobby", "hello").connect({"name": "bob"}) as bob,
        ):
            assert (await bob.next_event("welcome")).payload == "bob"


async def test_wake_hooks_see_the_connections_restored() -> None:
    async with serving([lobby]) as s, s.client() as client:
        handle = client.get_or_create("lobby", "wake")
        async with handle.connect({"name": "ada"}) as ada, handle.connect({"name": "bob"}):
            await _eventually(lambda: s.app.state.registry.metrics()["live"] == 0)
            assert await ada.whoami() == {"name": "ada"}  # woken by the frame
            assert woke_with == [[], ["ada", "bob"]]


async def test_a_socket_closed_under_a_running_action_lets_it_finish() -> None:
    async with serving([lobby]) as s, s.client() as client:
        raw = await _lobby_socket(s.url, "bank", "ada")
        await raw.recv()
        await raw.send(json.dumps({"t": "action", "id": 1, "name": "transfer", "args": []}))
        await anyio.sleep(0.1)
        await raw.close()  # mid-action
        await anyio.sleep(0.7)
        assert await client.get("lobby", "bank").balance() == {"debit": 1, "credit": 1}


async def test_ctx_conn_does_not_leak_into_actors_called_through_ctx_client() -> None:
    async with (
        serving([room]) as s,
        s.client() as client,
        client.get_or_create("room", "asker").connect({"name": "ada"}) as ada,
    ):
        assert await ada.ask("asked") == 0
        assert await ada.me() == {"name": "ada", "said": 0}  # the callee's post saw no conn


async def test_a_frame_json_cannot_carry_closes_that_connection_alone() -> None:
    async with serving([lobby]) as s, s.client() as client:
        json_socket = await _lobby_socket(s.url, "mixed", "js")
        cbor_socket = await _lobby_socket(s.url, "mixed", "cb", encoding="cbor")
        for socket_ in (json_socket, cbor_socket):
            await socket_.recv()
            await socket_.recv()
            sub = {"t": "sub", "id": 1, "event": "stamp"}
            await socket_.send(cbor2.dumps(sub) if socket_ is cbor_socket else json.dumps(sub))
            assert _frame(await socket_.recv())["t"] == "result"
        assert await client.get("lobby", "mixed").stamp() == 2  # the action is unaffected
        event = _frame(await cbor_socket.recv())
        assert event["args"][0] == {"a"}
        code, reason = await _closed_with(json_socket)
        assert code == CloseCode.UNSENDABLE and "a set cannot be sent as JSON" in reason
        await cbor_socket.close()


async def test_cyclic_cbor_frames_are_malformed() -> None:
    async with serving([lobby]) as s:
        raw = await _lobby_socket(s.url, "cycle", "ada", encoding="cbor")
        await raw.recv()
        await raw.recv()
        cyclic = b"\xa2atfactionbid\xd8\x1c\x81\xd8\x1d\x00"  # {"t": "action", "id": [<self>]}
        await raw.send(cyclic)
        code, reason = await _closed_with(raw)
        assert code == CloseCode.MALFORMED and "cyclic" in reason


async def test_errors_are_cut_to_the_outgoing_limit_and_say_so() -> None:
    async with serving([lobby], ws_max_out_bytes=16 * 1024) as s:
        raw = await _lobby_socket(s.url, "loud", "ada")
        await raw.recv()
        await raw.recv()
        await raw.send(json.dumps({"t": "action", "id": 1, "name": "shout", "args": [100_000]}))
        data = await raw.recv()
        error = _frame(data)["error"]
        assert len(data) <= 16 * 1024 and error["code"] == "action_error"
        assert error["message"].endswith("(cut to fit 16384 bytes)")
        await raw.close()


async def test_subscriptions_per_connection_are_bounded() -> None:
    async with (
        serving([room]) as s,
        s.client() as client,
        client.get_or_create("room", "subs").connect({"name": "ada"}) as ada,
    ):
        for i in range(256):
            await ada.subscribe(f"e{i}")
        with pytest.raises(Exception, match="at most 256 events"):
            await ada.subscribe("one too many")
        await ada.subscribe("e0")  # again: no new subscription


async def test_an_unstorable_connection_state_is_refused_and_put_back() -> None:
    async with (
        serving([lobby]) as s,
        s.client() as client,
        client.get_or_create("lobby", "spoilt").connect({"name": "ada"}) as ada,
    ):
        with pytest.raises(Exception, match="CBOR-serialisable"):
            await ada.spoil()
        assert await ada.whoami() == {"name": "ada"}


async def test_a_failing_on_disconnect_runs_once_and_its_row_goes() -> None:
    async with serving([lobby]) as s, s.client() as client:
        handle = client.get_or_create("lobby", "failing")
        async with handle.connect({"name": "ada"}):
            pass
        await _eventually(lambda: ("lobby disconnect", {"name": "ada"}) in seen)
        await _eventually(lambda: s.app.state.registry.metrics()["live"] == 0)
        await handle.balance()  # a wake: nothing left to reap
        assert seen.count(("lobby disconnect", {"name": "ada"})) == 1


async def test_the_in_process_client_is_refused_as_a_socket_is() -> None:
    async with Registry([room], "memory://").run() as client:
        with pytest.raises(ConnectionClosed) as refused:
            async with client.get_or_create("room", "r").connect({"name": "mallory"}):
                pass
        assert refused.value.code == CloseCode.REFUSED and "mallory" in refused.value.reason
        with pytest.raises(ConnectionClosed) as missing:
            async with client.get("room", "never").connect({"name": "ada"}):
                pass
        assert missing.value.code == CloseCode.NOT_FOUND


async def test_raw_http_keeps_the_query_as_sent_and_the_handler_s_http_errors() -> None:
    async with serving([lobby]) as s, s.http() as http:
        answer = await http.get("/actors/lobby/request/q?y=%20&key=raw&x=a+b&sig=%2Fz")
        assert answer.text == "y=%20&x=a+b&sig=%2Fz"
        teapot = await http.get("/actors/lobby/request/teapot?key=raw")
        assert teapot.status_code == 418 and "short and stout" in teapot.text


async def test_an_action_changing_state_and_conn_state_commits_once() -> None:
    async with (
        serving([room]) as s,
        s.client() as client,
        client.get_or_create("room", "one-commit").connect({"name": "ada"}) as ada,
    ):
        (instance,) = s.app.state.registry.live()
        before = instance.ctx.db.database.commits
        assert await ada.post("hi") == 1  # ctx.state["posts"] and conn.state["said"] change
        assert instance.ctx.db.database.commits == before + 1
        assert await ada.me() == {"name": "ada", "said": 1}  # a read: no commit
        assert instance.ctx.db.database.commits == before + 1


async def test_a_killed_server_s_connections_are_reaped_once_at_the_next_wake(
    tmp_path: Path,
) -> None:
    store, app = f"file:{tmp_path / 'store'}", f"{APP}:connected"
    killed = ServeProcess("--kv", store, "--lease", "1", app=app)
    url = await killed.started()
    sockets = []
    for name in ("ada", "bob", "cy"):
        socket_ = await ws_connect(
            url.replace("http://", "ws://") + "/actors/member/connect?key=k",
            subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
        )
        await socket_.send(json.dumps({"t": "connect", "params": {"name": name}}))
        assert json.loads(await socket_.recv())["t"] == "init"
        sockets.append(socket_)
    killed.proc.send_signal(signal.SIGKILL)
    assert await anyio.to_thread.run_sync(killed.proc.wait) == -signal.SIGKILL
    for socket_ in sockets:
        socket_.transport.abort()
    restarted = ServeProcess("--kv", store, "--lease", "1", app=app)
    try:
        async with HttpClient(await restarted.started(), token=TOKEN) as client:
            report = await client.get("member", "k").report()  # retried past the dead lease
            assert report["joined"] == 3 and report["rows"] == 0 and report["open"] == 0
            assert sorted(report["gone"].values()) == [1, 1, 1], report
            again = await client.get("member", "k").report()
            assert again["gone"] == report["gone"]  # reaped once, not at every wake
    finally:
        assert await restarted.stop() in (0, -signal.SIGTERM)
