"""Several `pagekv serve` processes on one store (real processes, loopback): every call of an
actor runs on its one owner wherever it arrives; an owner killed, stopped or shut down hands
its actors on within its lease without losing an acknowledged write or splitting an actor."""

from __future__ import annotations

import os
import random
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from server_helpers import TOKEN
from test_cli import ServeProcess, served_process

from pagekv.actor import ActorTakenOver
from pagekv.client import HttpClient, RemoteError, ServerUnreachable

pytestmark = pytest.mark.anyio
LEASE = "2"
ACTORS = [f"a{i}" for i in range(8)]


@asynccontextmanager
async def servers(store: str, count: int, *args: str) -> AsyncIterator[list[ServeProcess]]:
    if not store.startswith("file:"):  # a file: store's servers share one they generate
        args = (*args, "--cluster-secret", "the-placement-tests-cluster-secret")
    async with AsyncExitStack() as stack:
        started = [
            await stack.enter_async_context(served_process("--kv", store, *args))
            for _ in range(count)
        ]
        yield started


async def _metrics(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {TOKEN}"}
    ) as http:
        text = (await http.get("/metrics")).text
    found = re.findall(r"^pagekv_(\w+)_total (\d+)\.0$", text, re.MULTILINE)
    return {name: int(value) for name, value in found}


async def _totals(urls: list[str], *names: str) -> dict[str, int]:
    totals = dict.fromkeys(names, 0)
    for url in urls:
        metrics = await _metrics(url)
        for name in names:
            totals[name] += metrics.get(name, 0)
    return totals


@pytest.fixture(params=["file", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file:{tmp_path}/store"
    postgres = request.getfixturevalue("postgres_server")
    return postgres.store_url(f"placement-{os.getpid()}-{random.randrange(10**9)}")


@pytest.mark.parametrize("count", [2, 3])
async def test_calls_sent_anywhere_are_all_served_by_each_actors_one_owner(
    store_url: str, count: int
) -> None:
    """Round robin, then at random: no request fails, each actor's count is exactly the
    acknowledged calls, each actor wakes once, and nobody takes an actor over."""
    async with servers(store_url, count) as procs:
        urls = [await p.started() for p in procs]
        clients = [HttpClient(url, token=TOKEN) for url in urls]
        acknowledged = dict.fromkeys(ACTORS, 0)
        chooser = random.Random(count)
        calls = [(n % count, ACTORS[n % len(ACTORS)]) for n in range(48)]
        calls += [(chooser.randrange(count), chooser.choice(ACTORS)) for _ in range(48)]

        async def one(server: int, key: str) -> None:
            await clients[server].get_or_create("ledger", key).bump()
            acknowledged[key] += 1

        for part in (calls[:48], calls[48:]):
            async with anyio.create_task_group() as tg:
                for server, key in part:
                    tg.start_soon(one, server, key)
        counts = {key: await clients[0].get("ledger", key).bump() - 1 for key in ACTORS}
        for client in clients:
            await client.aclose()
        totals = await _totals(urls, "wakes", "takeovers", "forwarded")
    assert counts == acknowledged
    assert sum(client.retries for client in clients) == 0
    # Two first calls of an actor reaching two servers within the same few milliseconds may
    # both wake it (the later takes it over; nothing fails): rarely more than one wake each.
    assert len(ACTORS) <= totals["wakes"] <= len(ACTORS) * 3 // 2, totals
    assert totals["takeovers"] <= totals["wakes"] - len(ACTORS), totals
    assert totals["forwarded"] > 0, totals


async def _load(
    clients: list[HttpClient], key: str, stop: anyio.Event, outcomes: dict[str, int]
) -> None:
    """Bump `key` through `clients` in turn until `stop`; counts what happened."""
    n = 0
    while not stop.is_set():
        client = clients[n % len(clients)]
        n += 1
        try:
            await client.get_or_create("ledger", key).bump()
            outcomes["acknowledged"] += 1
        except ServerUnreachable as e:
            outcomes["unknown" if "may have run" in str(e) else "refused"] += 1
        except RemoteError as e:
            outcomes["unknown" if e.code == "owner_timeout" else f"failed {e.code}"] += 1
        except ActorTakenOver:
            outcomes["unknown"] += 1
        await anyio.sleep(0.005)


async def _wait_until(what: str, check: Callable[[], Any], timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.05)


async def test_a_killed_owner_s_actors_are_served_elsewhere_within_its_lease(
    store_url: str,
) -> None:
    """SIGKILL of the owner mid-load: calls through the survivor are refused (retryably) only
    until the dead owner's lease runs out, then served there; nothing acknowledged is lost; a
    schedule of another of the dead owner's actors runs on the survivor by itself."""
    async with servers(store_url, 2, "--lease", LEASE) as (owner, survivor):
        urls = [await owner.started(), await survivor.started()]
        async with HttpClient(urls[0], token=TOKEN) as direct:
            await direct.get_or_create("ledger", "hot").bump()
            await direct.get_or_create("ledger", "tick").bump()
            await direct.get("ledger", "tick").later(1.0)  # due after the kill
        clients = [HttpClient(url, token=TOKEN) for url in urls]
        outcomes = {"acknowledged": 0, "unknown": 0, "refused": 0}
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_load, clients, "hot", stop, outcomes)
            await anyio.sleep(0.5)
            owner.proc.send_signal(signal.SIGKILL)
            dead = clients.pop(0)  # as a load balancer does once the owner fails its checks
            before = outcomes["acknowledged"]

            async def served_after_kill() -> bool:
                return outcomes["acknowledged"] > before + 3

            await _wait_until("served elsewhere", served_after_kill)
            stop.set()

        async def woken_by_its_schedule() -> bool:
            return (await _metrics(urls[1])).get("wakes", 0) >= 2  # "hot", and "tick" unasked

        await _wait_until("the schedule woke its actor on the survivor", woken_by_its_schedule)
        async with HttpClient(urls[1], token=TOKEN) as after:
            final = (await after.get("ledger", "hot").read())["count"]
            ticked = (await after.get("ledger", "tick").read())["count"]
        for client in (dead, *clients):
            await client.aclose()
        assert owner.proc.wait() == -signal.SIGKILL
    low = 1 + outcomes["acknowledged"]
    assert low <= final <= low + outcomes["unknown"], (final, outcomes)
    assert set(outcomes) == {"acknowledged", "unknown", "refused"}, outcomes
    assert ticked == 2, "the scheduled bump ran once, on the survivor"


async def test_a_stopped_owner_is_fenced_once_its_lease_ran_out_and_never_writes_again(
    store_url: str,
) -> None:
    """SIGSTOP of the owner: while its lease lives the other server does not take the actor
    (calls wait, then fail retryably or as unknown); after it, the other serves it. Resumed,
    the stopped owner finds itself fenced: its calls are forwarded to the new owner, and the
    count is exactly what was acknowledged (no write from two owners)."""
    async with servers(store_url, 2, "--lease", LEASE) as (owner, other):
        urls = [await owner.started(), await other.started()]
        clients = [HttpClient(url, token=TOKEN) for url in urls]
        await clients[0].get_or_create("ledger", "held").bump()
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            outcomes = {"acknowledged": 0, "unknown": 0, "refused": 0}
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_load, clients[1:], "held", stop, outcomes)

                async def served() -> bool:
                    return outcomes["acknowledged"] >= 5

                await _wait_until("served by the other server", served)
                stop.set()
        finally:
            owner.proc.send_signal(signal.SIGCONT)
        for n in range(10):  # both servers again, the resumed one first
            await clients[n % 2].get_or_create("ledger", "held").bump()
        final = await clients[0].get("ledger", "held").bump() - 1
        totals = {url: await _metrics(url) for url in urls}
        for client in clients:
            await client.aclose()
    acknowledged = 1 + outcomes["acknowledged"] + 10
    assert acknowledged <= final <= acknowledged + outcomes["unknown"], (final, outcomes)
    assert totals[urls[1]]["wakes"] == 1, "the other server took the actor once"
    assert totals[urls[0]]["wakes"] == 1, "the resumed owner never took it back"
    assert totals[urls[0]]["forwarded"] >= 5, "the resumed owner forwards to the new owner"


async def test_a_server_shut_down_hands_its_actors_on_at_once(store_url: str) -> None:
    """SIGTERM puts the owner's actors to sleep, which releases their leases: the next call
    through another server is served there at once, without a retry."""
    async with servers(store_url, 2, "--lease", "30") as (owner, other):
        urls = [await owner.started(), await other.started()]
        async with HttpClient(urls[0], token=TOKEN) as first:
            for key in ACTORS[:3]:
                await first.get_or_create("ledger", key).bump()
        assert await owner.stop() in (0, -signal.SIGTERM)
        async with HttpClient(urls[1], token=TOKEN, retry_for=0) as second:
            counts = [await second.get("ledger", key).bump() for key in ACTORS[:3]]
        totals = await _metrics(urls[1])
    assert counts == [2, 2, 2]
    assert totals["wakes"] == 3 and totals.get("forwarded", 0) == 0


async def test_a_call_given_up_at_a_stopped_owner_does_not_run_when_it_resumes(
    tmp_path: Path,
) -> None:
    """The owner is stopped; a call forwarded to it waits out its lease and fails as unknown
    (`owner_timeout`). The client reads (not applied) and retries, successfully. Resumed, the
    old owner reads the abandoned call from its socket: it must refuse it, not wake the actor
    again and apply the call a second time."""
    store = f"file:{tmp_path}/store"
    async with servers(store, 2, "--lease", LEASE) as (owner, other):
        urls = [await owner.started(), await other.started()]
        async with HttpClient(urls[0], token=TOKEN) as first:
            assert await first.get_or_create("napper", "x").bump() == 1
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            async with HttpClient(urls[1], token=TOKEN) as second:
                handle = second.get("napper", "x")
                with pytest.raises(RemoteError) as given_up:
                    await handle.bump()
                assert given_up.value.code == "owner_timeout"
                assert await handle.count() == 1, "not applied: the client retries"
                assert await handle.bump() == 2
                await anyio.sleep(0.6)  # napper sleeps after 0.2 s: the other lets it go
        finally:
            owner.proc.send_signal(signal.SIGCONT)
        async with HttpClient(urls[0], token=TOKEN) as first:
            await first.get("napper", "x").later(60)  # anything the resumed owner serves
        async with HttpClient(urls[1], token=TOKEN) as second:
            assert await second.get("napper", "x").count() == 2


async def test_a_server_shut_down_under_load_fails_no_call(tmp_path: Path) -> None:
    """20 clients call an actor through the server that does not own it while its owner gets
    SIGTERM: the owner drains first (its actors' leases released, its answers closing their
    connections, for longer than the forwarders keep a connection), so no forwarded call is
    sent on a connection it closes: every call succeeds, and counts once."""
    async with servers(f"file:{tmp_path}/store", 2, "--lease", "5") as (owner, other):
        urls = [await owner.started(), await other.started()]
        async with HttpClient(urls[0], token=TOKEN) as first:
            await first.get_or_create("ledger", "hot").bump()
        acknowledged, stop = 1, anyio.Event()
        async with HttpClient(urls[1], token=TOKEN) as client:

            async def load() -> None:
                nonlocal acknowledged
                while not stop.is_set():
                    await client.get("ledger", "hot").bump()
                    acknowledged += 1

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(load)
                await anyio.sleep(0.5)
                assert await owner.stop() in (0, -signal.SIGTERM)
                await anyio.sleep(0.5)
                stop.set()
            final = await client.get("ledger", "hot").count()
        totals = await _metrics(urls[1])
    assert final == acknowledged
    assert totals["forwarded"] > 0 and totals["wakes"] == 1
    assert client.retries == 0, "handed on at once: not one call waited for a lease"
