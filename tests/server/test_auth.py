"""Auth fails closed and CORS is never reflected: every bypass attempt gets a 401 (or no CORS
headers), and no answer ever carries the token."""

from __future__ import annotations

import json
from unittest.mock import Mock

import httpx
import pytest
from server_helpers import TOKEN, Served, serving
from starlette.requests import Request

from pagekv.actor import Registry
from pagekv.client import RemoteError
from pagekv.kv import MemoryStore
from pagekv.server import ConfigError, ServerConfig
from pagekv.server.app import create_app, health

pytestmark = pytest.mark.anyio

PROTECTED = [
    ("POST", "/actors/ledger/actions/bump?key=k"),
    ("POST", "/actors/ledger?key=k"),
    ("DELETE", "/actors/ledger?key=k"),
    ("GET", "/inspect/actors"),
    ("GET", "/inspect/actors/ledger/state?key=k"),
    ("POST", "/inspect/actors/ledger/query?key=k"),
    ("GET", "/metrics"),
    ("GET", "/no/such/route"),
]


def test_the_server_config_fails_closed() -> None:
    with pytest.raises(ConfigError, match="--unauthenticated"):
        ServerConfig()
    with pytest.raises(ConfigError, match="contradict"):
        ServerConfig(token="t", unauthenticated=True)
    for bad in ("", "with space", "tab\there"):
        with pytest.raises(ConfigError):
            ServerConfig(token=bad)
    with pytest.raises(ConfigError, match="exact origin"):
        ServerConfig(token="t", cors_origins=("*",))
    assert ServerConfig(unauthenticated=True).token is None
    with pytest.raises(ConfigError, match="lease_s"):
        ServerConfig(unauthenticated=True, lease_s=0)


async def test_the_served_registry_takes_the_configured_lease() -> None:
    """`pagekv serve` passes the app's registry's lease this way."""
    config = ServerConfig(unauthenticated=True, lease_s=2.5)
    app = create_app(Registry([]).definitions.values(), kv=MemoryStore(), config=config)
    async with app.router.lifespan_context(app) as state:
        assert state["runtime"].registry.lease == 2.5


BAD_CREDENTIALS = [
    {},
    {"authorization": "Bearer wrong-token"},
    {"authorization": f"Bearer {TOKEN}x"},
    {"authorization": f"Bearer {TOKEN[:-1]}"},
    {"authorization": f"Basic {TOKEN}"},
    {"authorization": TOKEN},
    {"cookie": f"token={TOKEN}"},
    {"x-api-key": TOKEN},
]


async def test_requests_without_the_right_token_are_refused(served: Served) -> None:
    async with served.http(token=None) as http:
        for headers in BAD_CREDENTIALS:
            for method, path in PROTECTED:
                response = await http.request(method, path, headers=headers)
                assert response.status_code == 401, (headers, method, path, response.text)
                assert response.json()["error"]["code"] == "unauthorized"
                assert response.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in response.text
    assert served.store.namespace("ledger/k").generation() == 0  # nothing woke


async def test_a_token_in_the_query_string_authenticates_nothing(served: Served) -> None:
    async with served.http(token=None) as http:
        for name in ("token", "access_token", "authorization"):
            response = await http.get("/inspect/actors", params={name: TOKEN})
            assert response.status_code == 401
            response = await http.post(
                "/actors/ledger/actions/bump", params={"key": "k", name: f"Bearer {TOKEN}"}
            )
            assert response.status_code == 401


async def test_two_authorization_headers_are_refused(served: Served) -> None:
    async with served.http(token=None) as http:
        headers = httpx.Headers(
            [("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer other")]
        )
        response = await http.get("/inspect/actors", headers=headers)
    assert response.status_code == 401


async def test_the_right_token_opens_every_route_and_is_never_echoed(served: Served) -> None:
    async with served.client() as client:
        assert await client.get_or_create("ledger", "k").bump() == 1
    async with served.http() as http:
        answers = [
            await http.get("/inspect/actors"),
            await http.get("/inspect/actors/ledger", params={"key": "k"}),
            await http.get("/inspect/actors/ledger/state", params={"key": "k"}),
            await http.get("/metrics"),
            await http.post(
                "/actors/ledger/actions/fail", params={"key": "k"}, json={"args": ["boom"]}
            ),
        ]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 500]
    assert all(TOKEN not in a.text for a in answers)


async def test_health_is_open_and_says_nothing_else(served: Served) -> None:
    async with served.http(token=None) as http:
        response = await http.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_health_says_stopped_once_the_registry_is_not_running() -> None:
    """Without its registry a server can answer nothing but errors, so a load balancer must
    see it: the route's answer follows `Registry.running`."""
    registry = Registry([], kv=MemoryStore())
    request = Request(
        {"type": "http", "headers": [], "state": {"runtime": Mock(registry=registry)}}
    )
    response = await health(request)
    assert (response.status_code, json.loads(response.body)) == (503, {"status": "stopped"})
    async with registry.run():
        response = await health(request)
    assert (response.status_code, json.loads(response.body)) == (200, {"status": "ok"})


async def test_the_python_client_reports_a_wrong_token(served: Served) -> None:
    async with served.client(token="nope") as client:
        with pytest.raises(RemoteError) as error:
            await client.get_or_create("ledger", "k").bump()
    assert (error.value.status, error.value.code) == (401, "unauthorized")


PREFLIGHT = {
    "origin": "https://evil.example",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
    "cookie": "session=from-a-browser",  # what a credentialed cross-site request carries
}


async def test_no_cors_unless_configured(served: Served) -> None:
    async with served.http(token=None) as http:
        preflight = await http.options("/actors/ledger/actions/bump?key=k", headers=PREFLIGHT)
    async with served.http() as http:
        simple = await http.get("/inspect/actors", headers={"origin": "https://evil.example"})
        options = await http.options("/actors/ledger/actions/bump?key=k", headers=PREFLIGHT)
    assert preflight.status_code == 401
    assert simple.status_code == 200
    assert options.status_code == 405
    for response in (preflight, simple, options):
        assert not [h for h in response.headers if h.startswith("access-control-")]


async def test_configured_cors_allows_only_listed_origins_without_credentials() -> None:
    app = "https://app.example"
    async with serving(cors_origins=(app,)) as served, served.http(token=None) as http:
        allowed = await http.options(
            "/actors/ledger/actions/bump?key=k", headers={**PREFLIGHT, "origin": app}
        )
        evil = await http.options("/actors/ledger/actions/bump?key=k", headers=PREFLIGHT)
        to_metrics = await http.options("/metrics", headers={**PREFLIGHT, "origin": app})
        unauthenticated = await http.get("/inspect/actors", headers={"origin": app})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == app
    assert "access-control-allow-credentials" not in allowed.headers
    assert evil.status_code == 400
    assert "access-control-allow-origin" not in evil.headers
    assert to_metrics.status_code == 401  # server-to-server routes get no CORS answer
    assert "access-control-allow-origin" not in to_metrics.headers
    assert unauthenticated.status_code == 401  # CORS never replaces the token
