"""Single writer across registries, and crashes: two registries (in one process, or a second OS
process) share one `file:` store and take the same actor over in turn; a process killed with
SIGKILL loses nothing it acknowledged and leaves nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import anyio
import pytest
from actor_defs import ledger

from pagekv.actor import ActorContext, ActorNotFound, ActorTakenOver, Client, Registry, actor
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("actor_worker.py")


class Other(Protocol):
    """The other registry: `call` returns `{"ok": result}` or `{"error": "ExceptionType"}`."""

    async def call(self, action: str, key: str, *args: Any) -> dict[str, Any]: ...


class InProcess:
    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, action: str, key: str, *args: Any) -> dict[str, Any]:
        try:
            return {"ok": await self.client.get_or_create("ledger", key).call(action, *args)}
        except Exception as e:
            return {"error": type(e).__name__, "message": str(e)}


class Worker:
    """`actor_worker.py` in a subprocess, spoken to over its stdin and stdout."""

    def __init__(self, url: str, freshness_s: float | None = None) -> None:
        freshness = [] if freshness_s is None else [str(freshness_s)]
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, *freshness],
            cwd=WORKER.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with anyio.fail_after(30):
            line = await anyio.to_thread.run_sync(self.proc.stdout.readline, abandon_on_cancel=True)
        if not line:
            raise RuntimeError(f"the worker exited with {self.proc.wait()}")
        return json.loads(line)

    async def ready(self) -> None:
        assert await self._reply() == {"ready": True}

    def send(self, action: str, key: str, *args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([action, key, *args]) + "\n")
        self.proc.stdin.flush()

    async def call(self, action: str, key: str, *args: Any) -> dict[str, Any]:
        self.send(action, key, *args)
        return await self._reply()

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no on_sleep, no close, nothing flushed
        self.proc.wait()

    async def close(self) -> None:
        """A clean exit: EOF on stdin makes the worker sleep its actors and return."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            with anyio.fail_after(30):
                code = await anyio.to_thread.run_sync(self.proc.wait, abandon_on_cancel=True)
            assert code == 0


@asynccontextmanager
async def worker(url: str, freshness_s: float | None = None) -> AsyncIterator[Worker]:
    w = Worker(url, freshness_s)
    try:
        await w.ready()
        yield w
        await w.close()
    finally:
        if w.proc.poll() is None:
            w.kill()


@asynccontextmanager
async def other_registry(
    kind: str, url: str, freshness_s: float | None = None
) -> AsyncIterator[Other]:
    if kind == "process":
        async with worker(url, freshness_s) as w:
            yield w
    else:
        async with Registry([ledger], kv=url).run() as client:
            yield InProcess(client)


@pytest.mark.parametrize("kind", ["registry", "process"])
async def test_alternating_takeovers_lose_no_acknowledged_write(
    kind: str, tmp_path: Path, wait_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here and there take the actor over in turn. Each side's first call after the other side
    wrote hits its stale instance: the fence refuses its write, nothing is written, the instance
    is torn down, and the call runs again on a fresh instance that sees every write (it failed
    with ActorTakenOver, though a retry was safe).

    Both sides trust their instances for an hour: with the default 50 ms, a slow machine lets
    the freshness check find the takeover first and send the call to a fresh instance without
    an error (the path `test_a_stale_instance_does_not_serve_reads_after_a_takeover` covers)."""
    trust = 3600.0
    monkeypatch.setattr("pagekv.actor.lifecycle.owner_check.FRESHNESS_S", trust)
    url = f"file://{tmp_path}/store"
    registry = Registry([ledger], kv=url)
    async with registry.run() as client, other_registry(kind, url, trust) as there:
        here = client.get_or_create("ledger", "k")
        acknowledged: list[int] = []

        assert (await here.add(1))["rows"] == [1]
        acknowledged.append(1)
        n = 2
        for _ in range(3):
            # There: the first call wakes the actor; later ones hit the stale instance first.
            reply = await there.call("add", "k", n)
            acknowledged.append(n)
            assert reply["ok"]["rows"] == acknowledged
            assert reply["ok"]["count"] == len(acknowledged)
            n += 1

            # Here: the instance is stale now.
            (stale,) = registry.live()
            takeovers = registry.metrics().get("takeovers", 0)
            view = await here.add(n)
            await wait_for(lambda s=stale: s.stopped.is_set(), what="the stale instance's teardown")
            assert stale not in registry.live()
            met_stale = registry.metrics().get("takeovers", 0) == takeovers + 1
            assert met_stale, "it met the stale instance"
            acknowledged.append(n)
            assert view == {
                "count": len(acknowledged),
                "total": sum(acknowledged),
                "rows": acknowledged,
            }
            n += 1

        # A read-only call on a stale instance may still answer from its stale state (it dies
        # only on its next write), so the last check writes.
        final = await there.call("add", "k", n)
        if "error" in final:
            assert final["error"] == "ActorTakenOver", final
            final = await there.call("add", "k", n)
        assert final["ok"]["rows"] == [*acknowledged, n]


async def test_a_takeover_sees_writes_of_an_instance_that_never_slept() -> None:
    """A registry that keeps its instance (no on_sleep, no close) is as good as crashed to the
    next one: a second registry on the same store takes over and sees every acknowledged
    write, state and SQL together."""
    store = MemoryStore()
    async with Registry([ledger], kv=store).run() as first:
        for n in (5, 6, 7):
            await first.get_or_create("ledger", "k").add(n)
        async with Registry([ledger], kv=store).run() as second:
            view = await second.get("ledger", "k").read()
    assert view == {"count": 3, "total": 18, "rows": [5, 6, 7]}


async def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    async with worker(url) as w:
        for n in range(1, 6):
            assert (await w.call("add", "k", n))["ok"]["count"] == n
        w.kill()
    async with Registry([ledger], kv=url).run() as client:
        view = await client.get("ledger", "k").read()
    assert view == {"count": 5, "total": 15, "rows": [1, 2, 3, 4, 5]}


async def test_sigkill_inside_a_transaction_leaves_neither_state_nor_sql(
    tmp_path: Path, wait_for
) -> None:
    url = f"file://{tmp_path}/store"
    marker = tmp_path / "inside-transaction"
    async with worker(url) as w:
        assert (await w.call("add", "k", 1))["ok"]["count"] == 1
        w.send("add_then_hang", "k", 100, str(marker))
        await wait_for(marker.exists, what="the worker inside its transaction")
        w.kill()
    async with Registry([ledger], kv=url).run() as client:
        handle = client.get("ledger", "k")
        assert await handle.read() == {"count": 1, "total": 1, "rows": [1]}
        assert (await handle.add(2))["rows"] == [1, 2]


async def test_ctx_kv_write_of_a_stale_instance_runs_again_on_a_fresh_one(attempt) -> None:
    """The fence refuses a stale instance's `ctx.kv` write: nothing is written, so the call is
    run again on a fresh instance (not failed with ActorTakenOver), and the stale one is gone."""
    a = actor("kv-user")

    @a.action
    async def put(ctx: ActorContext, value: bytes) -> None:
        await ctx.kv.put({b"k": value})

    @a.action
    async def get(ctx: ActorContext) -> bytes | None:
        return (await ctx.kv.get([b"k"]))[0]

    store = MemoryStore()
    first_registry = Registry([a], kv=store)
    async with first_registry.run() as first, Registry([a], kv=store).run() as second:
        await first.get_or_create("kv-user", "k").put(b"1")
        (stale,) = first_registry.live()
        await second.get("kv-user", "k").put(b"2")
        outcome = await attempt(first.get("kv-user", "k").put(b"3"))
        value = await first.get("kv-user", "k").get()
        takeovers = first_registry.metrics().get("takeovers", 0)
        live = first_registry.live()
    assert outcome is None and value == b"3"
    assert takeovers == 1 and stale not in live


async def test_destroy_through_a_registry_with_a_stale_instance(attempt) -> None:
    store = MemoryStore()
    first_registry = Registry([ledger], kv=store)
    async with first_registry.run() as first, Registry([ledger], kv=store).run() as second:
        await first.get_or_create("ledger", "k").add(1)
        await second.get("ledger", "k").add(2)
        destroyed = await attempt(first.destroy("ledger", "k"))
        live = first_registry.live()
        after = await attempt(first.get("ledger", "k").read())
    assert destroyed is None
    assert live == []
    assert isinstance(after, ActorNotFound)


async def test_a_stale_instance_does_not_serve_reads_after_a_takeover() -> None:
    """Registry one keeps its instance awake; registry two takes over and writes. A read through
    registry one at once (inside the window in which a call skips its check before the action)
    sees that write: the stale instance found the takeover before answering (one KV read), and
    a fresh one took the actor back and answered."""
    store = MemoryStore()
    async with Registry([ledger], kv=store).run() as first:
        await first.get_or_create("ledger", "k").add(1)
        async with Registry([ledger], kv=store).run() as second:
            await second.get("ledger", "k").add(2)
            view = await first.get("ledger", "k").read()
            takeovers = first.registry.metrics().get("takeovers", 0)
    assert view == {"count": 2, "total": 3, "rows": [1, 2]}
    assert takeovers == 1


def _setter() -> Any:
    """`v` in the state and in a one-row table; `set_state` and `set_sql` write it as no-ops
    when the instance's memory holds it already (nothing to commit)."""
    a = actor("setter", state={"v": 0})

    @a.on_migrate
    async def schema(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(v INTEGER)")
        if not await ctx.db.execute("SELECT 1 FROM t"):
            await ctx.db.execute("INSERT INTO t VALUES (0)")

    @a.action
    async def set_state(ctx: ActorContext, v: int) -> None:
        ctx.state["v"] = v

    @a.action
    async def set_sql(ctx: ActorContext, v: int) -> None:
        await ctx.db.execute("UPDATE t SET v = ? WHERE v != ?", (v, v))

    @a.action
    async def both(ctx: ActorContext) -> tuple[int, int]:
        return ctx.state["v"], (await ctx.db.execute("SELECT v FROM t"))[0][0]

    return a


@pytest.mark.parametrize("backend", ["memory", "file"])
async def test_a_stale_instance_never_acknowledges_a_write_it_did_not_make(
    tmp_path: Path, backend: str
) -> None:
    """Registry two takes the actor over from registry one and sets v=2; at once registry one
    (whose instance still holds v=1 in memory) is asked to set v=1, in the state and by SQL.
    Both writes are no-ops against its memory, so nothing reached the fence; they were
    acknowledged and lost (20 of 20). Each acknowledged call must now have taken effect."""
    setter = _setter()
    store: Any = MemoryStore() if backend == "memory" else f"file://{tmp_path}/store"
    async with (
        Registry([setter], kv=store).run() as first,
        Registry([setter], kv=store).run() as second,
    ):
        outcomes = []
        for trial in range(20):
            action = ("set_state", "set_sql")[trial % 2]
            await first.get_or_create("setter", "k").call(action, 1)
            await first.get("setter", "k").both()
            await second.get("setter", "k").call(action, 2)
            await first.get("setter", "k").call(action, 1)
            outcomes.append(await second.get("setter", "k").both())
        takeovers = first.registry.metrics().get("takeovers", 0)
    column = [(v if i % 2 == 0 else w) for i, (v, w) in enumerate(outcomes)]
    assert column == [1] * 20, outcomes
    assert takeovers >= 20, "registry one found its instance taken over each time"


async def test_sends_through_two_registries_used_in_turn_all_arrive() -> None:
    """A send that met its registry's stale instance failed with `ActorTakenOver` (38 of 40)
    where a call hands over to a fresh instance; now a send does the same."""
    store = MemoryStore()
    async with (
        Registry([ledger], kv=store).run() as first,
        Registry([ledger], kv=store).run() as second,
    ):
        sent = []
        for n in range(40):
            client = (first, second)[n % 2]
            sent.append(await client.get_or_create("ledger", "k").send("inbox", n))
        takeovers = sum(c.registry.metrics().get("takeovers", 0) for c in (first, second))
        queued = await client.get("ledger", "k").queued("inbox")  # the last one to send
    assert len(sent) == 40 and takeovers >= 20, takeovers
    assert queued == list(range(40))


async def test_a_call_whose_state_change_another_call_committed_is_not_run_twice() -> None:
    """`inc` changed the state and awaited; a concurrent read's save committed that change;
    then registry two took over. inc had committed nothing itself, so it was run again on a
    fresh instance: n == 2 for one acknowledged inc. Any commit on the instance while a call
    runs may hold its changes, so that call is now refused, never run again."""
    a = actor("cnt", state={"n": 0})
    runs: list[int] = []
    gate = anyio.Event()

    @a.action
    async def inc(ctx: ActorContext) -> int:
        runs.append(1)
        ctx.state["n"] += 1
        if len(runs) == 1:
            await gate.wait()
        return ctx.state["n"]

    @a.action
    async def peek(ctx: ActorContext) -> int:
        return ctx.state["n"]

    store = MemoryStore()
    async with Registry([a], kv=store).run() as first, Registry([a], kv=store).run() as second:
        await first.get_or_create("cnt", "k").peek()
        outcome: list[Any] = []

        async def do_inc() -> None:
            try:
                outcome.append(await first.get("cnt", "k").inc())
            except ActorTakenOver as e:
                outcome.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(do_inc)
            await anyio.sleep(0.05)
            assert await first.get("cnt", "k").peek() == 1  # its save commits inc's change
            assert await second.get("cnt", "k").peek() == 1  # the takeover
            gate.set()
        final = await second.get("cnt", "k").peek()
    assert final == 1 and len(runs) == 1, (final, runs, outcome)
    assert isinstance(outcome[0], ActorTakenOver), outcome


async def test_every_call_that_met_a_fenced_off_instance_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three calls on a stale instance: the fence refused each write, but only the first
    learnt of the takeover (the database hands its cause out once); the other two failed with
    ActorStopped instead of running again on a fresh instance. (The instance trusts itself
    for an hour, so the calls reach its database rather than its check before the action.)"""
    monkeypatch.setattr("pagekv.actor.lifecycle.owner_check.FRESHNESS_S", 3600.0)
    store = MemoryStore()
    async with (
        Registry([ledger], kv=store).run() as first,
        Registry([ledger], kv=store).run() as second,
    ):
        await first.get_or_create("ledger", "k").add(1)
        await second.get("ledger", "k").add(2)  # takes it over; first's instance is stale
        results: list[Any] = []

        async def add(n: int) -> None:
            results.append((await first.get("ledger", "k").add(n))["count"])

        async with anyio.create_task_group() as tg:
            for n in (3, 4, 5):
                tg.start_soon(add, n)
        view = await second.get("ledger", "k").read()
    assert sorted(results) == [3, 4, 5] and sorted(view["rows"]) == [1, 2, 3, 4, 5], results
