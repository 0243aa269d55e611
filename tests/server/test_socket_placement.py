"""Sockets across several `pagekv serve` processes on one store (real processes, loopback, real
`websockets` clients): a hibernating actor's sockets get every event wherever its calls and
schedules arrive; a server stopped with SIGTERM loses no later event for the client library's
connections, which reconnect through a load balancer to the servers that stay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from server_defs import chat
from server_helpers import TOKEN, serving
from test_cli import APP, ServeProcess
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as SocketClosed

from pagekv.actor.realtime.connection import RECONNECT, CloseCode
from pagekv.client import HttpClient
from pagekv.client.websocket import RemoteConnection
from pagekv.kv import open_kv

pytestmark = pytest.mark.anyio
APP_CONNECTED = f"{APP}:connected"
LEASE = "2"


@asynccontextmanager
async def _servers(store: str, count: int) -> AsyncIterator[list[ServeProcess]]:
    processes = [
        ServeProcess("--kv", store, "--lease", LEASE, app=APP_CONNECTED) for _ in range(count)
    ]
    try:
        for process in processes:
            await process.started()
        yield processes
    finally:
        for process in processes:
            if process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()


async def _gauges(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {TOKEN}"}
    ) as http:
        text = (await http.get("/metrics")).text
    return {k: float(v) for k, v in re.findall(r"^pagekv_(\w+) ([\d.e+]+)$", text, re.M)}


async def _until(what: str, check: Any, timeout: float = 20.0) -> None:
    with anyio.move_on_after(timeout):
        while not await check():
            await anyio.sleep(0.05)
        return
    pytest.fail(f"timed out waiting for {what}")


async def _all_asleep(urls: list[str]) -> bool:
    return all([(await _gauges(url))["actors_live"] == 0 for url in urls])


async def _joined(url: str, key: str, name: str) -> ClientConnection:
    """A raw socket (JSON frames) connected to chat `key` as `name` and subscribed to `said`."""
    socket_ = await ws_connect(
        url.replace("http://", "ws://") + f"/actors/chat/connect?key={key}",
        subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
    )
    await socket_.send(json.dumps({"t": "connect", "params": {"name": name}}))
    assert json.loads(await socket_.recv())["t"] == "init"
    await socket_.send(json.dumps({"t": "sub", "id": 1, "event": "said"}))
    assert json.loads(await socket_.recv()) == {"t": "result", "id": 1, "result": None}
    return socket_


async def _said(socket_: ClientConnection, count: int) -> list[str]:
    """The next `count` `said` events of a raw socket (any other frame fails the test)."""
    texts = []
    with anyio.move_on_after(15):
        while len(texts) < count:
            frame = json.loads(await socket_.recv())
            assert frame["t"] == "event" and frame["name"] == "said", frame
            texts.append(frame["args"][0])
    return texts


@pytest.mark.parametrize("count", [1, 3])
async def test_hibernating_sockets_get_every_event_wherever_their_actor_is_called(
    tmp_path: Path, count: int
) -> None:
    """Two sockets at server A; their actor goes to sleep between calls sent to every server in
    turn, and between schedules that any server's poll may find due, then for two leases.
    Every event reaches both sockets, in order; an action over a socket is answered; no
    `on_disconnect` runs while they are open, and exactly one per socket once they close."""
    async with _servers(f"file:{tmp_path}/store", count) as processes:
        urls = [await process.started() for process in processes]
        sockets = [await _joined(urls[0], "room", name) for name in ("ada", "bob")]
        expected = []
        clients = [HttpClient(url, token=TOKEN) for url in urls]
        try:
            for i in range(6):
                await _until("the actor asleep", lambda: _all_asleep(urls))
                text = f"call {i} via server {i % count}"
                assert await clients[i % count].get("chat", "room").say(text) == 2
                expected.append(text)
            await _until("the actor asleep", lambda: _all_asleep(urls))
            for j in range(4):
                text = f"schedule {j}"
                await clients[-1].get("chat", "room").say_later(0.8 + 0.6 * j, text)
                expected.append(text)
            for socket_ in sockets:
                assert await _said(socket_, len(expected)) == expected
            await anyio.sleep(2 * float(LEASE))  # asleep past two leases: its hold renewed
            assert await clients[-1].get("chat", "room").say("after a long sleep") == 2
            for socket_ in sockets:
                assert await _said(socket_, 1) == ["after a long sleep"]
            await sockets[0].send(json.dumps({"t": "action", "id": 2, "name": "name"}))
            assert json.loads(await sockets[0].recv()) == {"t": "result", "id": 2, "result": "ada"}
            assert await clients[-1].get("chat", "room").gone() == {}
            for socket_ in sockets:
                await socket_.close()

            async def reaped() -> bool:
                gone = await clients[-1].get("chat", "room").gone()
                return sorted(gone.values()) == [1, 1]

            await _until("on_disconnect for both sockets", reaped)
            await anyio.sleep(1.0)  # more wakes and sleeps: never a second on_disconnect
            assert sorted((await clients[0].get("chat", "room").gone()).values()) == [1, 1]
        finally:
            for client in clients:
                await client.aclose()
        wakes_elsewhere = [(await _gauges(url)).get("wakes_total", 0) for url in urls[1:]]
        assert wakes_elsewhere == [0] * (count - 1), "it woke only where its sockets are"


async def test_a_socket_at_a_server_that_lost_its_actor_is_told_to_reconnect(
    tmp_path: Path,
) -> None:
    """Server A holds a socket of a sleeping actor, then is stopped (SIGSTOP) past its lease;
    B wakes the actor (A counts as dead: its member lease ran out too). Resumed, A finds the
    actor taken over, by its hold's late renewal or by the socket's next action: the socket is
    closed with a code the client library retries, any error frame says `not_owner`, nothing
    written, and nothing the client receives names a server's address."""
    async with _servers(f"file:{tmp_path}/store", 2) as (a, b):
        url_a, url_b = await a.started(), await b.started()
        socket_ = await _joined(url_a, "stale", "ada")
        await _until("the actor asleep", lambda: _all_asleep([url_a, url_b]))
        a.proc.send_signal(signal.SIGSTOP)
        try:
            await anyio.sleep(float(LEASE) + 1)
            async with HttpClient(url_b, token=TOKEN) as client:
                assert await client.get("chat", "stale").say("at b") == 0  # woken at b
        finally:
            a.proc.send_signal(signal.SIGCONT)
        await socket_.send(json.dumps({"t": "action", "id": 3, "name": "name"}))
        frames = []
        with anyio.move_on_after(5):
            with contextlib.suppress(SocketClosed):
                while True:
                    frames.append(await socket_.recv())
        assert socket_.close_code in RECONNECT, (socket_.close_code, frames)
        assert not any(re.search(r"127\.0\.0\.1|http", str(f)) for f in frames), frames
        assert re.search(r"127\.0\.0\.1|http", socket_.close_reason or "") is None
        for frame in map(json.loads, frames):
            if frame["t"] == "error":
                assert frame["error"]["code"] == "not_owner" and not frame["error"]["written"]


async def test_an_action_finding_its_actor_elsewhere_is_refused_unrun_and_the_socket_moved(
    tmp_path: Path,
) -> None:
    """The socket's action reaches a server that no longer holds its actor (as when the hold
    ran out while the process was stopped, and a call elsewhere woke the actor): an error frame
    `not_owner`, `written: false`, naming no server, then a close with `MOVED`."""
    url = f"file:{tmp_path / 'store'}"
    store_a, store_b = open_kv(url), open_kv(url)
    try:
        async with (
            serving([chat], kv=store_a, advertise=True) as a,
            serving([chat], kv=store_b, advertise=True) as b,
            b.client() as client_b,
        ):
            registry_a = a.app.state.registry
            socket_ = await _joined(a.url, "lost", "ada")
            await _until("the actor asleep", _asleep(registry_a))
            assert await registry_a.holds.renew("chat/lost", release=True)  # the hold ends
            assert await client_b.get("chat", "lost").say("at b") == 0
            await socket_.send(json.dumps({"t": "action", "id": 3, "name": "name"}))
            error = json.loads(await socket_.recv())
            with pytest.raises(SocketClosed):
                await socket_.recv()
            assert socket_.close_code == CloseCode.MOVED
            assert error["t"] == "error" and error["id"] == 3
            assert error["error"]["code"] == "not_owner" and error["error"]["written"] is False
            assert "127.0.0.1" not in json.dumps(error) + (socket_.close_reason or "")
    finally:
        store_a.close()
        store_b.close()


async def test_a_socket_whose_actor_owner_is_dead_is_moved_without_internal_detail(
    tmp_path: Path,
) -> None:
    """Server A holds a socket of the actor (so its lease), then dies (SIGKILL) with the lease
    live; a socket opened at B is relayed to A, which cannot be reached: it is closed with
    `MOVED` (the client library reconnects) and a reason that names no address and no OS error
    (on main: "[Errno 111] Connect call failed ('127.0.0.1', port)"); B logs the detail."""
    store = f"file:{tmp_path}/store"
    a = ServeProcess("--kv", store, "--lease", "10", app=APP_CONNECTED)
    b = ServeProcess("--kv", store, "--lease", "10", app=APP_CONNECTED)
    try:
        url_a, url_b = await a.started(), await b.started()
        held = await _joined(url_a, "dead", "ada")
        a.proc.kill()
        a.proc.wait()
        socket_ = await ws_connect(
            url_b.replace("http://", "ws://") + "/actors/chat/connect?key=dead",
            subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],
        )
        await socket_.send(json.dumps({"t": "connect", "params": {"name": "bob"}}))
        with anyio.fail_after(30), pytest.raises(SocketClosed):
            await socket_.recv()
        assert socket_.close_code == CloseCode.MOVED, socket_.close_reason
        reason = socket_.close_reason or ""
        assert "could not be reached" in reason, reason
        assert re.search(r"127\.0\.0\.1|Errno|http|:\d+", reason) is None, reason
        assert any("WARNING" in line and "could not be reached" in line for line in b.log), b.log
        with contextlib.suppress(Exception):
            await held.close()
    finally:
        for process in (a, b):
            if process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()


def _asleep(registry: Any) -> Any:
    async def check() -> bool:
        return registry.metrics()["live"] == 0

    return check


class _Balancer:
    """A TCP load balancer on loopback: each connection goes to the next backend in turn that
    takes it (one whose process exited is skipped, as a balancer's health check would)."""

    def __init__(self, urls: list[str]) -> None:
        self._backends = [url.removeprefix("http://").rsplit(":", 1) for url in urls]
        self._turn = 0
        self.url = ""

    async def __aenter__(self) -> _Balancer:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in self._backends:
            host, port = self._backends[self._turn % len(self._backends)]
            self._turn += 1
            try:
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                continue
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            return
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


async def _events(conn: RemoteConnection, prefix: str, count: int) -> list[str]:
    texts: list[str] = []
    with anyio.move_on_after(15):
        while len(texts) < count:
            event = await conn.next_event("said")
            if event.payload.startswith(prefix):
                texts.append(event.payload)
    return texts


async def _draining(url: str) -> bool:
    async with httpx.AsyncClient(base_url=url) as http:
        answer = await http.get("/health")
    return answer.status_code == 503 and answer.json()["status"] == "draining"


async def _all_back(chat: Any, conns: list[RemoteConnection]) -> bool:
    """Whether a broadcast reaches every connection (each probe an event they skip)."""
    return await chat.say("probe") == len(conns)


async def test_sigterm_loses_no_later_event_for_client_library_sockets(tmp_path: Path) -> None:
    """Six client-library connections through a load balancer in front of three servers: one
    server holds them all (the actor's), the others relay theirs to it. SIGTERM of a relaying
    server, then of the holding one, with three connections more opened as each drains: every
    connection reconnects or connects (retrying the codes of a server going away, and the
    draining server's refusals) and gets every event sent after, through the last server;
    none ends."""
    async with _servers(f"file:{tmp_path}/store", 3) as processes:
        urls = [await process.started() for process in processes]
        async with _Balancer(urls) as balancer, HttpClient(balancer.url, token=TOKEN) as client:
            handle = client.get_or_create("chat", "hall")
            conns = [handle.connect({"name": f"c{i}"}) for i in range(6)]
            async with AsyncExitStack() as stack:
                for conn in conns:
                    await stack.enter_async_context(conn)
                    await conn.subscribe("said")
                held = [(await _gauges(url))["connections_open"] for url in urls]
                holder = held.index(6)
                relaying = (holder + 1) % 3
                survivor = 3 - holder - relaying
                first = list(conns)
                for round_, victim in enumerate((relaying, holder)):
                    processes[victim].proc.send_signal(signal.SIGTERM)
                    await _until("it drains", partial(_draining, urls[victim]))
                    for i in range(3):  # one at least sent to it, refused there, retried
                        late = handle.connect({"name": f"late {round_}.{i}"})
                        await stack.enter_async_context(late)
                        await late.subscribe("said")
                        conns.append(late)
                    exited = await anyio.to_thread.run_sync(processes[victim].proc.wait)
                    assert exited in (0, -signal.SIGTERM)
                    async with HttpClient(urls[survivor], token=TOKEN) as direct:
                        chat = direct.get("chat", "hall")
                        await _until("every connection back", partial(_all_back, chat, conns))
                        sent = [f"after {round_}.{i}" for i in range(5)]
                        for text in sent:
                            assert await chat.say(text) == len(conns)
                    for conn in conns:
                        assert await _events(conn, f"after {round_}.", 5) == sent
                        assert conn.closed is None
                assert all(conn.reconnects >= 1 for conn in first)
