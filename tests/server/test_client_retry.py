"""`HttpClient` sends a call again only while the answer says it did not run: a 503 with
`written: false` and a code documented as nothing-written, uvicorn's refusal beyond
`--max-connections`, a connection that could not be opened. Faults come from real servers where
one can make them (a store that fails a commit, connections held open, a closed port) and from
an `httpx.MockTransport` otherwise; the client's clock and sleep are replaced wherever a test
looks at the waits, so every assertion is on counts and waits asked for, never on elapsed time.
A WebSocket connection's reconnects (tenacity's loop) are bounded and spread the same way.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import anyio
import cbor2
import httpx
import pytest
import tenacity
from server_defs import member
from server_helpers import serving

from pagekv.actor import ActorTakenOver
from pagekv.actor.directory.leases import LEASE_S
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.realtime.client_connection import ConnectionClosed
from pagekv.actor.realtime.connection import CloseCode
from pagekv.client import (
    RETRIED_CODES,
    RETRY_FOR_S,
    HttpClient,
    RemoteError,
    ServerUnreachable,
    websocket,
)
from pagekv.kv import FaultKind, FaultyStore, MemoryStore
from pagekv.protocol import CBOR

pytestmark = pytest.mark.anyio

ABSENT: Any = object()
OK = httpx.Response(200, content=cbor2.dumps({"result": "done"}), headers={"content-type": CBOR})


def error(
    code: str, written: Any = False, status: int = 503, headers: dict[str, str] | None = None
) -> httpx.Response:
    """An error answer as the gateway writes it (`written` left out when ABSENT)."""
    body: dict[str, Any] = {"code": str(code), "message": f"{code} (injected)"}
    if written is not ABSENT:
        body["written"] = written
    return httpx.Response(
        status,
        content=cbor2.dumps({"error": body}),
        headers={"content-type": CBOR, **(headers or {})},
    )


class Clock:
    """The client's clock and sleep: time moves only by the waits the client asks for."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def scripted(
    *answers: httpx.Response | Exception, retry_for: float = RETRY_FOR_S
) -> tuple[HttpClient, Clock, list[httpx.Request]]:
    """A client whose requests get `answers` in turn (the last one again once they run out; each
    a fresh copy), on a fake clock; the requests it sent are recorded."""
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        answer = answers[min(len(sent), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    client = HttpClient(
        "http://pagekv.test", retry_for=retry_for, transport=httpx.MockTransport(handle)
    )
    clock = Clock()
    client._clock, client._sleep = clock, clock.sleep
    return client, clock, sent


@pytest.mark.parametrize("code", sorted(RETRIED_CODES))
async def test_a_503_that_wrote_nothing_is_sent_again_until_it_succeeds(code: str) -> None:
    client, clock, sent = scripted(error(code), error(code), OK)
    async with client:
        assert await client.get_or_create("ledger", "k").add(2) == "done"
    assert client.retries == 2 and len(sent) == 3
    assert len({(r.url, r.content) for r in sent}) == 1  # the same call each time
    first, second = clock.waits
    assert 0.05 <= first <= 0.1 and 0.1 <= second <= 0.2


NOT_RETRIED = [
    (error("actor_taken_over", True), ActorTakenOver),  # it committed something
    (error("storage_unavailable", None), RemoteError),  # a commit's outcome is unknown
    (error("owner_timeout", None), RemoteError),  # the owner may have run it
    (error("owner_timeout", False), RemoteError),  # ... whatever the forwarder wrote itself
    (error("inspector_busy", ABSENT), RemoteError),  # says nothing of what was written
    (error("action_error", False, status=500), RemoteError),  # it ran, and raised
    (error("queue_full", False, status=429), RemoteError),  # refused for good
    (httpx.Response(503, text="upstream reset"), RemoteError),  # a proxy's: may have forwarded it
]


@pytest.mark.parametrize(("answer", "raised"), NOT_RETRIED)
async def test_an_answer_that_does_not_say_nothing_ran_is_not_retried(
    answer: httpx.Response, raised: type[Exception]
) -> None:
    client, clock, sent = scripted(answer, OK)
    async with client:
        with pytest.raises(raised):
            await client.get("ledger", "k").add(2)
    assert (client.retries, len(sent), clock.waits) == (0, 1, [])


@pytest.mark.parametrize(
    "fault", [httpx.ReadTimeout("read timed out"), httpx.RemoteProtocolError("disconnected")]
)
async def test_a_failure_after_the_request_went_out_is_not_retried(fault: Exception) -> None:
    client, _, sent = scripted(fault, OK)
    async with client:
        with pytest.raises(ServerUnreachable, match="the call may have run"):
            await client.get("ledger", "k").add(2)
    assert (client.retries, len(sent)) == (0, 1)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_closed_port_is_retried_until_the_budget_then_is_unreachable() -> None:
    async with HttpClient(f"http://127.0.0.1:{closed_port()}", retry_for=0.3) as client:
        with pytest.raises(ServerUnreachable, match="nothing was sent"):
            await client.get("ledger", "k").add(2)
    assert client.retries >= 1


async def test_the_waits_double_up_to_a_cap_and_the_last_ends_at_the_budget() -> None:
    client, clock, sent = scripted(httpx.ConnectError("refused"), retry_for=5.0)
    async with client:
        with pytest.raises(ServerUnreachable, match="nothing was sent"):
            await client.get("ledger", "k").add(2)
    assert client.retries == len(clock.waits) == len(sent) - 1
    assert sum(clock.waits) == pytest.approx(5.0)
    for n, wait in enumerate(clock.waits[:-1]):
        longest = min(1.0, 0.1 * 2**n)
        assert longest / 2 <= wait <= longest, (n, clock.waits)


@pytest.mark.parametrize("fault", [error("not_owner"), httpx.ConnectError("refused")])
async def test_a_budget_of_zero_never_retries(fault: httpx.Response | Exception) -> None:
    client, clock, sent = scripted(fault, OK, retry_for=0)
    async with client:
        with pytest.raises((RemoteError, ServerUnreachable)):
            await client.get("ledger", "k").add(2)
    assert (client.retries, len(sent), clock.waits) == (0, 1, [])


def within(low: float, high: float) -> Callable[[float], bool]:
    return lambda wait: low <= wait <= high


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [
        ("3", within(3.0, 3.0)),  # the server's wait
        ("0", within(0.05, 0.1)),  # the least wait: the client's own backoff still applies
        ("Wed, 21 Oct 2015 07:28:00 GMT", within(0.05, 0.1)),  # a date: the client's backoff
    ],
)
async def test_retry_after_is_the_least_wait(
    retry_after: str, waited: Callable[[float], bool]
) -> None:
    client, clock, _ = scripted(
        error("owner_unreachable", headers={"retry-after": retry_after}), OK
    )
    async with client:
        assert await client.get("ledger", "k").add(2) == "done"
    assert client.retries == 1 and len(clock.waits) == 1 and waited(clock.waits[0]), clock.waits


async def test_a_retry_after_past_the_budget_ends_the_retries_at_once() -> None:
    refused = error("owner_unreachable", headers={"retry-after": "30"})
    client, clock, sent = scripted(refused, OK, retry_for=15.0)
    async with client:
        with pytest.raises(RemoteError, match="owner_unreachable"):
            await client.get("ledger", "k").add(2)
    assert (client.retries, len(sent), clock.waits) == (0, 1, [])


def test_the_default_budget_rides_out_a_lease() -> None:
    assert RETRY_FOR_S > LEASE_S
    with pytest.raises(ValueError, match="retry_for"):
        HttpClient("http://pagekv.test", retry_for=-1)


async def test_a_commit_the_store_refused_is_retried_against_a_real_server_and_applied_once() -> (
    None
):
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    async with serving(kv=store) as served, served.client() as client:
        ledger = client.get_or_create("ledger", "k")
        await ledger.add(1)
        store.faulty["ledger/k"].arm(FaultKind.FAIL_BEFORE)
        answer = await ledger.add(2)
    assert store.faulty["ledger/k"].fired_count() == 1
    assert client.retries == 1 and answer["rows"] == [1, 2]


async def test_uvicorns_refusal_beyond_max_connections_is_retried() -> None:
    """uvicorn answers it in place of the app (plain text, no pagekv body), so the client knows
    it by its exact bytes: this pins them against a real server."""
    async with serving(max_connections=2, header_timeout_s=30, token=None) as served:
        address = served.url.removeprefix("http://").split(":")
        held = [socket.create_connection((address[0], int(address[1]))) for _ in range(2)]

        async def release_then_sleep(seconds: float) -> None:
            for sock in held:
                sock.close()
            await anyio.sleep(seconds)

        try:
            for sock in held:  # each holds a connection, its headers unfinished
                sock.sendall(b"POST /actors/ledger/actions/read?key=k HTTP/1.1\r\n")
            await anyio.sleep(0.2)  # the server has taken them in
            async with served.client() as client:
                client._sleep = release_then_sleep
                answer = await client.get_or_create("ledger", "k").read()
        finally:
            for sock in held:
                sock.close()
    assert client.retries >= 1 and answer["rows"] == []


def test_websocket_waits_double_with_equal_jitter_up_to_a_cap() -> None:
    """Between reconnect attempts: at least half of a doubling wait (50 ms, 100 ms, ... up to
    1 s), the other half random, so clients sent away together spread out even at the cap."""
    retrying = websocket._retrying(websocket._worth_another_try)
    for n in range(1, 9):
        state = tenacity.RetryCallState(retrying, None, (), {})
        state.attempt_number = n
        longest = min(1.0, 0.05 * 2 ** (n - 1))
        waits = [websocket._BACK_OFF(state) for _ in range(200)]
        assert all(longest / 2 <= w <= longest for w in waits), (n, min(waits), max(waits))
        assert max(waits) - min(waits) > longest / 4, n  # drawn, not fixed


async def test_websocket_reconnects_stop_after_the_attempts_and_other_closes_at_once() -> None:
    tries: list[int] = []

    async def refused(code: int) -> None:
        tries.append(code)
        raise ConnectionClosed(code, "refused (injected)")

    for code, attempts in ((CloseCode.GOING_AWAY, websocket._ATTEMPTS), (CloseCode.REFUSED, 1)):
        tries.clear()
        clock = Clock()
        retrying = websocket._retrying(websocket._worth_another_try).copy(sleep=clock.sleep)
        with pytest.raises(ConnectionClosed) as raised:
            async for attempt in retrying:
                with attempt:
                    await refused(code)
        assert raised.value.code == code  # the last failure itself, not a wrapper
        assert len(tries) == attempts and len(clock.waits) == attempts - 1, code


async def test_a_connection_closed_while_reconnecting_stays_closed() -> None:
    """The server restarts under a connection, which reconnects to it; it stops again, and the
    client closes the connection while it reconnects: once the server is back, no socket is
    opened for it (one was: the closed connection came back, running `on_connect` again, and
    held a socket nobody could use until its `async with` ended)."""
    store = MemoryStore()
    async with serving([member], kv=store, token=None) as first, first.client() as client:
        conn = client.get_or_create("member", "m").connect({"name": "ada"})
        await conn.__aenter__()
    port = int(first.url.rsplit(":", 1)[1])
    try:
        async with serving([member], kv=store, token=None, port=port):
            with anyio.fail_after(20):
                while conn.reconnects == 0:
                    await anyio.sleep(0.01)
            assert conn.closed is None
        await anyio.sleep(0.2)  # the server is gone again: reconnecting
        with anyio.fail_after(5):
            await conn.close()
        async with serving([member], kv=store, token=None, port=port) as third:
            await anyio.sleep(2)  # past several attempts' waits
            async with third.client() as other:
                report = await other.get_or_create("member", "m").report()
    finally:
        with anyio.fail_after(5):
            await conn.__aexit__(None, None, None)
    assert (conn.reconnects, report["joined"], report["open"]) == (1, 2, 0), report
