"""SIGTERM is bounded with user work stuck in a transaction, and a call cycle through a
transaction across servers fails fast (#43 item 5), on real `pagekv serve` processes; a call the
stop cancels is never said to have written nothing when what it wrote stands.

On main, SIGTERM never completed while an action waited inside `ctx.db.transaction()` (the stop's
state save queued on the transaction's lock), and an A -> B -> A call cycle through a transaction
wedged A for good.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from server_helpers import TOKEN, Served
from stops_app import STOP_GRACE
from test_cli import ServeProcess

from pagekv.actor import ActorStopped
from pagekv.actor.call_chain import HEADER
from pagekv.client import HttpClient

pytestmark = pytest.mark.anyio
APP = str(Path(__file__).with_name("stops_app.py"))
DRAIN_S = 2.0 + 0.25
"""A server that shares its store waits out the others' forwarders' keep-alive as it drains."""
MARGIN_S = 5.0
"""Process exit, the stop's unwinding of cancelled work, a loaded machine."""


async def _exit_time(server: ServeProcess) -> float:
    """Seconds from SIGTERM to the process's exit (it must exit within a minute)."""
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    with anyio.fail_after(60):
        while (code := server.proc.poll()) is None:
            await anyio.sleep(0.05)
    assert code in (0, -signal.SIGTERM), "".join(server.log)
    return time.monotonic() - started


@asynccontextmanager
async def served_process(*args: str, app: str) -> AsyncIterator[ServeProcess]:
    server = ServeProcess(*args, app=app)
    try:
        await server.started()
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@asynccontextmanager
async def _http(url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        yield http


async def _call(http: httpx.AsyncClient, name: str, key: str, action: str, *args: Any) -> Any:
    return await http.post(
        f"/actors/{name}/actions/{action}", params={"key": key}, json={"args": list(args)}
    )


async def test_sigterm_exits_in_bound_with_an_action_stuck_in_a_transaction(
    tmp_path: Path,
) -> None:
    """The stuck call is cancelled after `stop_grace` and told `actor_stopped` with nothing
    written; the server exits within stop_grace + drain; after a restart the state and the rows
    are the last committed ones (the stuck transaction's 999 is nowhere)."""
    store = f"file:{tmp_path}/store"
    async with served_process("--kv", store, app=APP) as server:
        url = await server.started()
        async with HttpClient(url, token=TOKEN) as client:
            await client.get_or_create("stuck", "k").commit(5)
        answers: list[httpx.Response] = []
        async with _http(url) as http, anyio.create_task_group() as tg:

            async def wedge() -> None:
                answers.append(await _call(http, "stuck", "k", "wedge"))

            tg.start_soon(wedge)
            with anyio.fail_after(20):
                while not (await _call(http, "probe", "p", "entered")).json()["result"]:
                    await anyio.sleep(0.05)
            took = await _exit_time(server)
    assert took < STOP_GRACE + DRAIN_S + MARGIN_S, f"SIGTERM took {took:.1f} s"
    (answer,) = answers
    error = answer.json()["error"]
    assert answer.status_code == 503 and error["code"] == "actor_stopped", answer.text
    assert error["written"] is False and "stop_grace" in error["message"]
    async with (
        served_process("--kv", store, app=APP) as restarted,
        HttpClient(await restarted.started(), token=TOKEN) as client,
    ):
        assert await client.get("stuck", "k").read() == [5, [5]]


async def _until_bumped(http: httpx.AsyncClient) -> None:
    """Until `a.bump_then_wait` of the server `http` reaches has changed the state and waits."""
    with anyio.fail_after(20):
        while not (await _call(http, "probe", "p", "bumped")).json()["result"]:
            await anyio.sleep(0.05)


@asynccontextmanager
async def _two_servers(store: str) -> AsyncIterator[list[ServeProcess]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(served_process("--kv", store, app=APP))
            for _ in range(2)
        ]


async def test_a_call_cut_off_by_sigterm_after_a_state_change_is_not_said_to_have_written_nothing(
    tmp_path: Path,
) -> None:
    """a/x, owned by the first of two servers on one store, adds 1 to its state outside a
    transaction and waits past stop_grace; SIGTERM of that server cancels it, and the stop saves
    the state, the 1 with it. The answer is `actor_stopped` whose `written` is not false (on main:
    false, with "a transaction it had open was rolled back" though none was open, and the write
    stood), so nothing retries it as unwritten."""
    async with _two_servers(f"file:{tmp_path}/store") as (first, last):
        async with _http(await first.started()) as http:
            assert (await _call(http, "a", "x", "hello")).json() == {"result": ["x", 0]}
            answers: list[httpx.Response] = []
            async with anyio.create_task_group() as tg:

                async def bump() -> None:
                    answers.append(await _call(http, "a", "x", "bump_then_wait", 30))

                tg.start_soon(bump)
                await _until_bumped(http)
                took = await _exit_time(first)
        async with _http(await last.started()) as http:
            n = (await _call(http, "a", "x", "hello")).json()["result"][1]
    assert took < STOP_GRACE + DRAIN_S + MARGIN_S, f"SIGTERM took {took:.1f} s"
    (answer,) = answers
    error = answer.json()["error"]
    assert answer.status_code == 503 and error["code"] == "actor_stopped", answer.text
    assert n == 0 or error["written"] is not False, (n, error)
    assert "rolled back" not in error["message"], error
    assert n == 1  # the stop saved the state: the answer must not invite a retry


async def test_the_client_library_applies_a_call_cut_off_by_sigterm_once(tmp_path: Path) -> None:
    """The same call made with the client library through the second server, which forwards it
    to the owner: whatever it raises or returns, n went up by exactly one (on main: the library
    retried the `written: false` answer, and the call's one increment was applied twice)."""
    async with (
        _two_servers(f"file:{tmp_path}/store") as (first, last),
        _http(await first.started()) as http,
        HttpClient(await last.started(), token=TOKEN) as client,
    ):
        assert (await _call(http, "a", "x", "hello")).json() == {"result": ["x", 0]}
        outcomes: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def bump() -> None:
                try:
                    outcomes.append(await client.get("a", "x").bump_then_wait(4))
                except ActorStopped as e:
                    outcomes.append(e)

            tg.start_soon(bump)
            await _until_bumped(http)
            await _exit_time(first)
        assert await client.get("a", "x").hello() == ["x", 1], outcomes


@pytest.mark.parametrize("count", [1, 2])
async def test_a_call_cycle_through_a_transaction_fails_fast_and_sigterm_stays_bounded(
    tmp_path: Path, count: int
) -> None:
    """a/x (in a transaction, owned by the first server) calls b/y (owned by the last one),
    which calls a/x back: the answer is 409 `call_cycle` naming the chain, promptly (on main:
    never, or the forward timeout); a/x serves other calls, its transaction rolled back; then
    SIGTERM of the first server exits within its bound."""
    store = f"file:{tmp_path}/store"
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(served_process("--kv", store, app=APP))
            for _ in range(count)
        ]
        urls = [await s.started() for s in servers]
        async with _http(urls[-1]) as last, _http(urls[0]) as first:
            assert (await _call(last, "b", "y", "ping")).json() == {"result": "pong"}
            assert (await _call(first, "a", "x", "hello")).json() == {"result": ["x", 0]}
            with anyio.fail_after(10):
                cycle = await _call(first, "a", "x", "through", "y")
            error = cycle.json()["error"]
            assert cycle.status_code == 409 and error["code"] == "call_cycle", cycle.text
            assert "a/x -> b/y -> a/x" in error["message"]
            assert error["written"] is False
            with anyio.fail_after(10):
                for http in (first, last):
                    answer = await _call(http, "a", "x", "hello")
                    assert answer.json() == {"result": ["x", 0]}, answer.text
        took = await _exit_time(servers[0])
    assert took < STOP_GRACE + DRAIN_S + MARGIN_S, f"SIGTERM took {took:.1f} s"


async def test_the_call_chain_header_is_checked_and_a_foreign_chain_refuses_nothing(
    served: Served,
) -> None:
    """A malformed `Pagekv-Call-Chain` is a 400 naming the header; a well-formed one whose frames
    hold nothing on this server (a client that made them up) changes nothing."""
    async with _http(served.url) as http:
        path, params = "/actors/ledger/actions/add", {"key": "k"}
        for bad in ["nonsense", "0123456789abcdef@", ",".join(["0123456789abcdef@a/b"] * 65)]:
            answer = await http.post(path, params=params, json={"args": [1]}, headers={HEADER: bad})
            assert answer.status_code == 400 and HEADER in answer.text, answer.text
        made_up = "0123456789abcdef@ledger/k,fedcba9876543210@other/x"
        answer = await http.post(path, params=params, json={"args": [2]}, headers={HEADER: made_up})
        assert answer.status_code == 200, answer.text
