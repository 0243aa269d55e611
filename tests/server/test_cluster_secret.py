"""Servers prove to each other that they are servers of the store (#43 item 6): a process that
binds a killed owner's port is sent no token and its answer never reaches a client; a
forwarded call without a valid proof changes nothing; servers with different secrets cannot
forward to each other."""

from __future__ import annotations

import json
import signal
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from server_helpers import TOKEN, serving
from test_cli import APP, ServeProcess, pagekv, served_process
from test_realtime import room
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as SocketClosed

from pagekv.actor.realtime.connection import CloseCode
from pagekv.client import RemoteError
from pagekv.kv import MemoryStore
from pagekv.server import ServerConfig
from pagekv.server.cluster.forward import FORWARDED_HEADER
from pagekv.server.cluster.peer_auth import ANY_SERVER, PROOF_HEADER, ClusterKey
from pagekv.server.config import ConfigError

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {TOKEN}"}


@contextmanager
def squatter(port: int) -> Iterator[tuple[int, list[bytes]]]:
    """An HTTP server on loopback `port` (0: any free one) answering every request 200
    `{"result": "fake"}`; yields its port and the requests it got, each as its request line,
    header block and body."""
    seen: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            seen.append(f"{self.requestline}\r\n{self.headers}".encode() + body)
            answer = json.dumps({"result": "fake"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


async def _add(url: str, n: int) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
        return await http.post(
            "/actors/ledger/actions/add", params={"key": "k"}, json={"args": [n]}
        )


async def test_a_process_on_a_killed_owners_port_gets_no_token_and_is_never_relayed(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    args = ("--kv", f"file:{store}", "--lease", "6")
    async with served_process(*args) as owner, served_process(*args) as survivor:
        urls = [await owner.started(), await survivor.started()]
        assert (await _add(urls[0], 1)).json()["result"]["count"] == 1
        relayed = await _add(urls[1], 2)  # forwarded to the owner, which proves itself
        assert relayed.json()["result"]["rows"] == [1, 2], relayed.text
        owner.proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(owner.proc.wait)
        with squatter(urlsplit(urls[0]).port or 0) as (_, seen):
            fooled = await _add(urls[1], 3)
            assert seen, "the survivor sent the call to whatever listened at the owner's address"
        assert fooled.status_code == 503, fooled.text
        assert fooled.json()["error"]["code"] == "owner_unreachable"
        assert fooled.json()["error"]["written"] is False
        assert "fake" not in fooled.text
        assert urls[0] not in fooled.text and "127.0.0.1" not in fooled.text  # no address
        secret = (store / "cluster-secret").read_text().strip()
        for request in seen:
            assert b"authorization" not in request.lower(), request
            assert TOKEN.encode() not in request and secret.encode() not in request
        with anyio.fail_after(30):
            while (served := await _add(urls[1], 4)).status_code != 200:
                assert served.json()["error"]["code"] == "owner_unreachable", served.text
                await anyio.sleep(0.5)
        assert served.json()["result"]["rows"] == [1, 2, 4], "served at the survivor at last"
        assert stat.S_IMODE((store / "cluster-secret").stat().st_mode) == 0o600
        assert len(secret) >= 32
        assert not [line for line in owner.log + survivor.log if secret in line]


def _signed(
    value: str, target: str, to: str, body: bytes, secret: str | None = None
) -> dict[str, str]:
    proof, _ = ClusterKey(secret).sign_request(to, value, "POST", target, body)
    return {FORWARDED_HEADER: value, PROOF_HEADER: proof}


async def test_a_forwarded_call_without_a_valid_proof_is_refused_and_changes_nothing() -> None:
    """Each forged call is refused for its own reason (each is signed for the body it is sent
    with, unless the body is what is wrong), with and without the token."""
    store = MemoryStore()
    async with serving(kv=store, advertise=True) as owner:
        target = "/actors/ledger/actions/add?key=k"
        me = owner.app.state.registry.id
        nine, two = b'{"args":[9]}', b'{"args":[2]}'
        assert (await _add(owner.url, 1)).status_code == 200
        headers: list[dict[str, str]] = [
            {FORWARDED_HEADER: "s o 1e12"},  # no proof
            {FORWARDED_HEADER: "s o 1e12", PROOF_HEADER: "1 2 3"},  # a made-up one
            _signed("s o 1e12", target, me, nine, "a-secret-of-another-cluster-0123"),
            {**_signed("s o 1e12", target, me, nine), FORWARDED_HEADER: "s o 2e12"},  # lease
            _signed("s o 1e12", "/actors/ledger/actions/add?key=other", me, nine),  # call
            _signed("s o 1e12", target, "another-registry", nine),  # for another server
            _signed("s o 1e12", target, ANY_SERVER, nine),  # "any server": only to ask who
            _signed("s o 1e12", target, me, two),  # another body
        ]
        replayed = _signed(f"s o {2e12}", target, me, two)
        json_type = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=owner.url, timeout=30) as http:
            first = await http.post(target, content=two, headers=replayed | json_type)
            assert first.status_code == 200, first.text
            proof = first.headers[PROOF_HEADER]
            assert proof.startswith(me + " ")
            attempts = [*((sent, nine) for sent in headers), (replayed, two)]  # last: a replay
            for sent, body in attempts:
                for auth in ({}, AUTH):
                    refused = await http.post(target, content=body, headers=sent | auth | json_type)
                    assert refused.status_code == 403, (sent, refused.text)
                    assert PROOF_HEADER not in refused.headers
            doubled = [
                *_signed("s o 3e12", target, me, nine).items(),
                (FORWARDED_HEADER, "s o 1e12"),
                *json_type.items(),
            ]
            twice = await http.post(target, content=nine, headers=doubled)
            assert twice.status_code == 403, twice.text
            count = await http.post(
                "/actors/ledger/actions/read", params={"key": "k"}, json={}, headers=AUTH
            )
        assert count.json()["result"]["rows"] == [1, 2]


async def test_servers_with_different_secrets_cannot_forward_to_each_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    async with (
        serving(kv=store, advertise=True, cluster_secret="the-first-cluster-secret") as owner,
        serving(kv=store, advertise=True, cluster_secret="the-other-cluster-secret") as other,
    ):
        assert (await _add(owner.url, 1)).status_code == 200
        refused = await _add(other.url, 2)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "owner_unreachable"
        assert (await _add(owner.url, 3)).json()["result"]["rows"] == [1, 3]
    logged = caplog.text
    assert "does not match this server's cluster secret" in logged
    assert "--cluster-secret" in logged
    assert "the-first-cluster-secret" not in logged and "the-other-cluster-secret" not in logged


async def test_calls_give_no_token_to_a_process_at_the_owners_address() -> None:
    """The owner's lease names an address where another process listens: a client's socket
    relayed there, and an actor's socket and call through `ctx.client`, give that process no
    token, and none of its answers is taken."""
    store = MemoryStore()
    with squatter(0) as (port, seen):
        async with (
            serving([room], kv=store, advertise_url=f"http://127.0.0.1:{port}") as owner,
            serving([room], kv=store, advertise=True) as caller,
            owner.client() as at_owner,
            caller.client() as at_caller,
        ):
            await at_owner.get_or_create("room", "callee").post("hi")
            relayed = f"{caller.url.replace('http', 'ws', 1)}/actors/room/connect?key=callee"
            async with ws_connect(
                relayed,
                additional_headers=AUTH,
                subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],  # type: ignore[list-item]
            ) as socket:
                await socket.send(
                    json.dumps({"t": "connect", "params": {"name": "eve"}, "token": TOKEN})
                )
                with pytest.raises(SocketClosed):
                    await socket.recv()
            assert socket.close_code == CloseCode.MOVED, socket.close_reason
            assert [b"upgrade: websocket" in r.lower() for r in seen] == [True]
            at_caller.retry_for = 0
            with pytest.raises(RemoteError):  # ctx.client's socket there
                await at_caller.get_or_create("room", "listener").listen("callee")
            assert [b"upgrade: websocket" in r.lower() for r in seen] == [True, True]
            with pytest.raises(RemoteError) as failed:
                await at_caller.get_or_create("room", "caller").ask("callee")
            assert len(seen) > 2, "the call went to the address the lease names"
            assert "fake" not in str(failed.value)
            assert f":{port}" not in str(failed.value) and "127.0.0.1" not in str(failed.value)
            assert caller.app.state.registry.counters["forwarded"] == 0
    for request in seen:
        assert b"authorization" not in request.lower(), request
        assert TOKEN.encode() not in request


async def test_a_process_with_another_secret_says_so_at_start(tmp_path: Path) -> None:
    store = f"file:{tmp_path}/store"
    async with served_process("--kv", store) as first:
        await first.started()
        other = ServeProcess("--kv", store, "--cluster-secret", "not-the-stored-secret-0123")
        try:
            await other.started()
            with anyio.fail_after(20):
                while "shares the store but not this process's cluster secret" not in "".join(
                    other.log
                ):
                    await anyio.sleep(0.1)
        finally:
            other.proc.kill()
            other.proc.wait()
    assert "not-the-stored-secret" not in "".join(other.log + first.log)


def test_a_secret_must_be_long_and_its_file_private(tmp_path: Path) -> None:
    for short in ("", "short", "sixteen chars ok"):
        with pytest.raises(ConfigError, match="at least 16 printable characters"):
            ServerConfig(token=TOKEN, cluster_secret=short)
    assert "the-secret-of-the-cluster" not in repr(
        ServerConfig(token=TOKEN, cluster_secret="the-secret-of-the-cluster")
    )
    env = {"PAGEKV_TOKEN": TOKEN, "PAGEKV_CLUSTER_SECRET": "short"}
    refused = pagekv("serve", APP, "--kv", f"file:{tmp_path}", env=env)
    assert refused.returncode == 2 and "the cluster secret must be at least 16" in refused.stderr
    path = tmp_path / "cluster-secret"
    path.write_text("a-secret-others-can-read-0123\n")
    path.chmod(0o644)
    shared = pagekv("serve", APP, "--kv", f"file:{tmp_path}", env={"PAGEKV_TOKEN": TOKEN})
    assert shared.returncode == 1, shared.stderr
    assert f"{path} is readable by other users: chmod 600 it" in shared.stderr
    assert "a-secret-others-can-read" not in shared.stderr
