"""An unauthenticated server (`pagekv serve --unauthenticated`, the README's first command) is
safe to run on a developer's machine: a page of another site, or of a name DNS-rebound to
loopback, cannot act on it.

It answers only requests whose `Host` is one of its own names (loopback, its address, the
`allowed_hosts`): 421 `host_not_allowed` otherwise, before any route runs. A state-changing
request or a WebSocket from a browser page of another origin (its `Origin` header) is refused
with 403 `origin_not_allowed`, and a body of any media type but JSON or CBOR is a 415, so a
cross-site "simple" request (a form, `text/plain`, a no-cors `fetch`) never reaches
an action, a create or a workflow change. Raw HTTP routes (`on_request`) are the app's own:
only the `Host` check applies to them. With a token, API clients see no change.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from server_defs import flow
from server_helpers import Served, serving
from starlette.responses import JSONResponse
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from pagekv.actor import ActorContext, actor
from pagekv.cli.serve import exposure_warning
from pagekv.kv import MemoryStore
from pagekv.server import ConfigError, ServerConfig

pytestmark = pytest.mark.anyio

hooked = actor("hooked", state={"hits": 0})


@hooked.on_request
async def _hook(ctx: ActorContext, request: Any) -> Any:
    ctx.state["hits"] += 1
    body = await request.body()
    return JSONResponse({"hits": ctx.state["hits"], "body": body.decode()})


@hooked.action
async def bump(ctx: ActorContext) -> int:
    """What a cross-site page would call: an action that needs no arguments."""
    ctx.state["hits"] += 1
    return int(ctx.state["hits"])


ACTORS = [flow, hooked]
FOREIGN = "http://127.0.0.1:1"
"""A page of another origin on the same machine (another port of loopback)."""


def _port(served: Served) -> int:
    return int(served.url.rsplit(":", 1)[1])


def _ws(served: Served, path: str = "/actors/hooked/connect?key=k") -> str:
    return served.url.replace("http://", "ws://") + path


async def _inspect(http: httpx.AsyncClient, path: str, key: str) -> httpx.Response:
    """An inspector read, again after a 503 `inspector_busy` (a retryable answer a loaded
    machine gives when the read gets no worker thread within the query timeout)."""
    for _ in range(5):
        answer = await http.get(path, params={"key": key})
        if answer.status_code != 503 or "inspector_busy" not in answer.text:
            return answer
    return answer


async def _hits(http: httpx.AsyncClient, key: str = "k") -> int | None:
    """`hooked`'s hits, read through the inspector (None: the actor does not exist)."""
    state = await _inspect(http, "/inspect/actors/hooked/state", key)
    if state.status_code == 404:
        return None
    assert state.status_code == 200, state.text
    return int(state.json()["state"]["hits"])


async def _socket_action(url: str, **connect: Any) -> Any:
    """Open a socket to `hooked`, call `bump()` over it, and return the answer frame."""
    async with ws_connect(url, subprotocols=["pagekv"], **connect) as socket_:  # type: ignore[list-item]
        await socket_.send(json.dumps({"t": "connect", "params": None}))
        assert json.loads(await socket_.recv())["t"] == "init"
        await socket_.send(json.dumps({"t": "action", "id": 1, "name": "bump", "args": []}))
        return json.loads(await socket_.recv())


def test_allowed_hosts_are_names_without_a_port() -> None:
    for bad in ("", "http://dev.example", "dev.example:8080", "dev example", "a/b"):
        with pytest.raises(ConfigError, match="allowed host"):
            ServerConfig(unauthenticated=True, allowed_hosts=(bad,))
    assert ServerConfig(unauthenticated=True, allowed_hosts=("Dev.Example", "::1", "*"))


async def test_an_unauthenticated_server_answers_only_its_own_host_names() -> None:
    """DNS rebinding: a page on `evil.example`, which resolves to 127.0.0.1, sends requests
    whose Host is `evil.example`; the server must not serve them, not even reads."""
    async with serving(ACTORS, token=None) as served, served.http() as http:
        port = _port(served)
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            headers = {"host": host}
            read = await http.get("/inspect/actors", headers=headers)
            call = await http.post(
                "/actors/hooked/actions/bump",
                params={"key": "k"},
                json={},
                headers=headers,
            )
            raw = await http.post("/actors/hooked/request/x", params={"key": "k"}, headers=headers)
            for refused in (read, call, raw):
                assert refused.status_code == 421, (host, refused.text)
                assert refused.json()["error"]["code"] == "host_not_allowed"
            rebound = _ws(served).replace(f"127.0.0.1:{port}", host)
            with pytest.raises(InvalidStatus) as ws:
                await _socket_action(rebound, host="127.0.0.1", port=port)
            assert ws.value.response.status_code == 421
        assert await _hits(http) is None  # nothing ran: the actor was never created
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"LocalHost:{port}",
            "app.localhost",
        ):
            served_ok = await http.post(
                "/actors/hooked/actions/bump",
                params={"key": "k"},
                json={},
                headers={"host": host},
            )
            assert served_ok.status_code == 200, (host, served_ok.text)
        assert await _hits(http) == 4


async def test_allowed_hosts_extend_the_own_names_and_star_allows_any() -> None:
    async with serving(ACTORS, token=None, allowed_hosts=("dev.example",)) as served:
        async with served.http() as http:
            listed = await http.get("/health", headers={"host": "dev.example:80"})
            other = await http.get("/health", headers={"host": "other.example"})
            own = await http.get("/health")
        assert (listed.status_code, other.status_code, own.status_code) == (200, 421, 200)
    async with serving(ACTORS, token=None, allowed_hosts=("*",)) as served, served.http() as http:
        assert (await http.get("/health", headers={"host": "any.example"})).status_code == 200


async def test_with_a_token_api_clients_see_no_change() -> None:
    """A forged Host or a foreign Origin gets nothing from a server with a token that it
    would not get anyway: the token is what it lacks."""
    async with serving(ACTORS) as served, served.http() as http:
        call = await http.post(
            "/actors/hooked/actions/bump",
            params={"key": "k"},
            json={},
            headers={"host": "evil.example", "origin": FOREIGN},
        )
        assert call.status_code == 200, call.text
        answer = await _socket_action(
            _ws(served),
            origin=FOREIGN,  # type: ignore[arg-type]
            additional_headers={"authorization": f"Bearer {served.token}"},
        )
        assert answer["t"] == "result"
        assert await _hits(http) == 2
    async with serving(ACTORS, allowed_hosts=("dev.example",)) as served, served.http() as http:
        listed = await http.get("/health", headers={"host": "dev.example"})
        other = await http.get("/health", headers={"host": "evil.example"})
        assert (listed.status_code, other.status_code) == (200, 421)  # given, the check runs


async def test_cross_site_state_changes_are_refused() -> None:
    """What a page of another origin can send without a preflight: an empty no-cors POST, a
    form, `text/plain`; each with the page's `Origin`, as browsers send it on every POST."""
    async with serving(ACTORS, token=None) as served, served.http() as http:
        same = {"origin": served.url}
        assert (
            await http.post("/actors/flow/actions/loads", params={"key": "f"}, headers=same)
        ).status_code == 200
        for origin in (FOREIGN, "null", served.url.replace("http://", "https://") + "0"):
            headers = {"origin": origin}
            attempts = [
                await http.post("/actors/hooked/actions/bump?key=k", headers=headers),
                await http.post("/actors/hooked?key=k", headers=headers),
                await http.post("/actors/hooked/queues/q?key=k", headers=headers),
                await http.delete("/actors/flow?key=f", headers=headers),
                await http.post("/inspect/actors/flow/workflow/cancel?key=f", headers=headers),
                await http.post("/inspect/actors/flow/workflow/replay?key=f", headers=headers),
                await http.post(
                    "/actors/hooked/actions/bump?key=k",
                    content=b"{}",
                    headers={**headers, "content-type": "text/plain"},
                ),
            ]
            for refused in attempts:
                assert refused.status_code == 403, (origin, refused.request.url, refused.text)
                assert refused.json()["error"]["code"] == "origin_not_allowed"
        assert await _hits(http) is None
        flow_state = await _inspect(http, "/inspect/actors/flow/workflow", "f")
        assert flow_state.status_code == 200, flow_state.text
        assert flow_state.json()["workflow"]["state"] != "cancelled"
        reads = await http.get("/inspect/actors", headers={"origin": FOREIGN})
        assert reads.status_code == 200  # a browser shows another origin no answer without CORS
        raw = await http.post("/actors/hooked/request/x?key=h", headers={"origin": FOREIGN})
        assert raw.status_code == 200 and raw.json()["hits"] == 1  # the app's own route


async def test_a_page_of_the_server_it_called_is_served_by_the_actors_owner_elsewhere() -> None:
    """The page's own server forwards the call (and relays the socket) to the owner, whose
    Host differs from the page's origin: the check was made where the page's request arrived,
    and a forwarded request (`X-Pagekv-Forwarded`, a header no page can set) is not refused."""
    store = MemoryStore()
    async with (
        serving(ACTORS, kv=store, token=None, advertise=True) as owner,
        serving(ACTORS, kv=store, token=None, advertise=True) as other,
        owner.http() as http,
    ):
        assert (await http.post("/actors/hooked/actions/bump?key=k", json={})).status_code == 200
        async with other.http() as at_other:
            same = {"origin": other.url}
            call = await at_other.post("/actors/hooked/actions/bump?key=k", json={}, headers=same)
            assert call.status_code == 200, call.text
            refused = await at_other.post(
                "/actors/hooked/actions/bump?key=k", json={}, headers={"origin": FOREIGN}
            )
            assert refused.status_code == 403, refused.text
        assert (await _socket_action(_ws(other), origin=other.url))["t"] == "result"  # type: ignore[arg-type]
        assert await _hits(http) == 3
        assert owner.app.state.registry.counters["connections_relayed"] == 0
        assert other.app.state.registry.counters["connections_relayed"] == 1


async def test_listed_cors_origins_may_change_state() -> None:
    app = "http://127.0.0.1:5173"
    async with serving(ACTORS, token=None, cors_origins=(app,)) as served, served.http() as http:
        call = await http.post(
            "/actors/hooked/actions/bump?key=k", json={}, headers={"origin": app}
        )
        assert call.status_code == 200, call.text
        assert call.headers["access-control-allow-origin"] == app
        foreign = await http.post("/actors/hooked/actions/bump?key=k", headers={"origin": FOREIGN})
        assert foreign.status_code == 403
        assert (await _socket_action(_ws(served), origin=app))["t"] == "result"  # type: ignore[arg-type]
        assert await _hits(http) == 2


async def test_websockets_from_another_origin_are_refused() -> None:
    async with serving(ACTORS, token=None) as served, served.http() as http:
        for origin in (FOREIGN, "null"):
            with pytest.raises(InvalidStatus) as refused:
                await _socket_action(_ws(served), origin=origin)  # type: ignore[arg-type]
            assert refused.value.response.status_code == 403
            assert json.loads(refused.value.response.body or b"{}")["error"]["code"] == (
                "origin_not_allowed"
            )
        assert await _hits(http) is None
        assert (await _socket_action(_ws(served), origin=served.url))["t"] == "result"  # type: ignore[arg-type]
        assert (await _socket_action(_ws(served)))["t"] == "result"  # no Origin: not a browser
        assert await _hits(http) == 2


@pytest.mark.parametrize("token", [None, "t0ken"])
async def test_bodies_must_be_json_or_cbor(token: str | None) -> None:
    """Even without an Origin (a browser extension, a proxy that strips it): on an
    unauthenticated server a form or text body, one without a media type, or an empty one
    declared as a form, is a 415 naming the media types. With a token API clients keep the
    lenient reading (an empty body of any type is `{}`, one without a type is JSON); only a
    body of another media type is refused, as before."""
    async with serving(ACTORS, token=token) as served, served.http() as http:
        attempts = [
            ("/actors/hooked/actions/bump?key=k", b"", "application/x-www-form-urlencoded"),
            ("/actors/hooked/actions/bump?key=k", b"{}", "text/plain"),
            ("/actors/hooked/actions/bump?key=k", b"{}", None),
            ("/actors/hooked?key=k", b"", "multipart/form-data; boundary=x"),
            ("/inspect/actors/flow/workflow/cancel?key=f", b"", "text/plain"),
            (
                "/inspect/actors/flow/workflow/replay?key=f",
                b"",
                "application/x-www-form-urlencoded",
            ),
        ]
        for path, body, media_type in attempts:
            if token is not None and not (body and media_type):
                continue  # lenient with a token; checked below
            headers = {"content-type": media_type} if media_type else {}
            refused = await http.post(path, content=body, headers=headers)
            assert refused.status_code == 415, (path, media_type, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "unsupported_media_type"
            assert "application/json" in error["message"]
        if token is not None:
            untyped = await http.post("/actors/hooked/actions/bump?key=k", content=b"{}")
            assert untyped.status_code == 200, untyped.text
            empty_form = await http.post(
                "/actors/hooked/actions/bump?key=k",
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert empty_form.status_code == 200, empty_form.text
            assert await _hits(http) == 2
            return
        assert await _hits(http) is None
        with_charset = await http.post(
            "/actors/hooked/actions/bump?key=k",
            content=b"{}",
            headers={"content-type": "application/json; charset=utf-8"},
        )
        assert with_charset.status_code == 200, with_charset.text
        bare = await http.post("/actors/flow/actions/loads?key=f")  # no body, no media type
        assert bare.status_code == 200, bare.text
        raw = await http.put(
            "/actors/hooked/request/x?key=h", content=b"a=1", headers={"content-type": "text/plain"}
        )
        assert raw.status_code == 200 and raw.json()["body"] == "a=1"


async def test_serve_unauthenticated_beyond_loopback_warns_and_keeps_to_its_names(
    tmp_path: Path,
) -> None:
    """`--host 0.0.0.0` is told otherwise than loopback: the server says loudly what that
    exposes, still answers only its own names (loopback, this machine's hostname, which it
    advertises) and `--allowed-hosts`, and still passes its own advertise-address check."""
    app = str(Path(__file__).with_name("server_defs.py"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEKV_")}
    command = [sys.executable, "-m", "pagekv", "serve", app, "--unauthenticated"]
    options = ["--host", "0.0.0.0", "--port", "0", "--kv", f"file:{tmp_path}/s"]
    proc = subprocess.Popen(
        [*command, *options, "--allowed-hosts", "dev.example, 192.0.2.7"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    running = re.compile(r"Uvicorn running on http://0\.0\.0\.0:(\d+)")
    try:
        with anyio.fail_after(30):
            while not any(running.search(line) for line in lines):
                line = await anyio.to_thread.run_sync(proc.stderr.readline)
                assert line, "".join(lines)
                lines.append(line)
        port = next(m.group(1) for line in lines if (m := running.search(line)))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answers = {
                host: (await http.get("/health", headers={"host": host})).status_code
                for host in (
                    f"127.0.0.1:{port}",
                    f"{socket.gethostname()}:{port}",
                    "dev.example",
                    f"192.0.2.7:{port}",
                    f"evil.example:{port}",
                    f"192.0.2.8:{port}",
                )
            }
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = await anyio.to_thread.run_sync(proc.communicate)
    log = "".join(lines) + rest
    assert list(answers.values()) == [200, 200, 200, 200, 421, 421], answers
    warnings = [line for line in log.splitlines() if "WARNING: --unauthenticated" in line]
    assert len(warnings) == 1 and "0.0.0.0, not a loopback address" in warnings[0], log
    assert "does not reach" not in log and "could not check" not in log, log


def test_serve_unauthenticated_on_loopback_says_nothing_more() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert exposure_warning("serve", host, unauthenticated=True) is None, host
    assert exposure_warning("serve", "0.0.0.0", unauthenticated=False) is None
    for host in ("0.0.0.0", "::", "192.168.1.5", "dev.example"):
        assert exposure_warning("serve", host, unauthenticated=True) is not None, host
