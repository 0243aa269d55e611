"""Every stop is bounded, and a call cycle through a transaction fails fast (#43 item 5).

A stop (sleep, destroy, the registry's end) waited for a call stuck in `ctx.db.transaction()`
with no bound: its state save queued on the transaction's lock. Now it waits `stop_grace`, cancels
the call (its transaction rolls back) and saves no part of it. An action that calls back into an
actor whose transaction on the same chain waits for it (A -> B -> A) waited for ever; now it is
refused with `CallCycle` and the actor serves on.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from pagekv.actor import ActorContext, ActorStopped, CallCycle, Registry, actor
from pagekv.actor.directory.records import actor_id
from pagekv.actor.realtime.connection import Connection
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio
GRACE = 0.5
BOUND = GRACE + 3.0
"""`stop_grace`, plus the stop's wait for cancelled work to unwind (`UNWIND_S`) and a margin."""


def stuck_actor(entered: anyio.Event) -> Any:
    """`commit(n)` commits n (state and a row); `stuck()` writes 999 in a transaction and then
    waits for ever inside it."""
    a = actor("stuck", state={"n": 0}, stop_grace=GRACE)

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        await ctx.db.execute("CREATE TABLE rows(n INTEGER)")

    @a.action
    async def commit(ctx: ActorContext, n: int) -> None:
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO rows VALUES (?)", (n,))
            ctx.state["n"] = n

    @a.action
    async def stuck(ctx: ActorContext) -> None:
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO rows VALUES (999)")
            ctx.state["n"] = 999
            entered.set()
            await anyio.sleep_forever()

    @a.action
    async def read(ctx: ActorContext) -> tuple[int, list[int]]:
        rows = await ctx.db.execute("SELECT n FROM rows ORDER BY n")
        return ctx.state["n"], [r[0] for r in rows]

    return a


@pytest.mark.parametrize("stop", ["sleep", "destroy"])
async def test_a_stop_cancels_a_call_stuck_in_a_transaction_after_stop_grace(stop: str) -> None:
    entered = anyio.Event()
    store = MemoryStore()
    outcomes: list[BaseException] = []
    with anyio.fail_after(BOUND + 5):  # on main: never ends
        async with Registry([stuck_actor(entered)], kv=store).run() as client:
            handle = client.get_or_create("stuck", "k")
            await handle.commit(5)

            async def call_stuck() -> None:
                try:
                    await handle.stuck()
                except ActorStopped as e:
                    outcomes.append(e)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call_stuck)
                await entered.wait()
                started = anyio.current_time()
                if stop == "destroy":
                    await client.destroy("stuck", "k")
                else:
                    await client.registry.drain()  # as SIGTERM does: every actor to sleep
                took = anyio.current_time() - started
    assert took < BOUND, f"the {stop} took {took:.1f} s"
    assert len(outcomes) == 1 and "stop_grace" in str(outcomes[0])
    async with Registry([stuck_actor(anyio.Event())], kv=store).run() as client:
        if stop == "destroy":
            assert not await client.registry.exists("stuck", "k")
        else:
            assert await client.get("stuck", "k").read() == (5, [5])


async def test_a_stop_hook_stuck_in_a_transaction_is_cut_off_at_stop_grace() -> None:
    entered = anyio.Event()
    a = stuck_actor(entered)

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        async with ctx.db.transaction():
            ctx.state["n"] = 777
            entered.set()
            await anyio.sleep_forever()

    store = MemoryStore()
    with anyio.fail_after(BOUND + 5):
        async with Registry([a], kv=store).run() as client:
            await client.get_or_create("stuck", "k").commit(5)
            started = anyio.current_time()
        took = anyio.current_time() - started
    assert entered.is_set() and took < BOUND
    async with Registry([stuck_actor(anyio.Event())], kv=store).run() as client:
        assert await client.get("stuck", "k").read() == (5, [5])


async def test_an_on_disconnect_cut_off_by_a_stop_is_logged_as_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection closes while a call is stuck in a transaction: its `on_disconnect` waits for
    the transaction, and the registry's drain cancels both after `stop_grace`. No user code
    failed: the cut-off `on_disconnect` is logged at INFO, without a traceback (on main: ERROR
    "on_disconnect of ... failed" with one), and only the call that had a transaction open is
    told one was rolled back."""
    entered = anyio.Event()
    a = stuck_actor(entered)
    disconnects: list[str] = []

    @a.on_connect
    async def on_connect(ctx: ActorContext, conn: Connection) -> None:
        pass

    @a.on_disconnect
    async def on_disconnect(ctx: ActorContext, conn: Connection) -> None:
        disconnects.append(conn.id)

    outcomes: list[BaseException] = []
    caplog.set_level(logging.INFO, logger="pagekv")
    with anyio.fail_after(BOUND + 5):
        async with Registry([a], kv=MemoryStore()).run() as client:
            handle = client.get_or_create("stuck", "k")
            await handle.commit(5)
            conn = await handle.connect().__aenter__()

            async def call_stuck() -> None:
                try:
                    await handle.stuck()
                except ActorStopped as e:
                    outcomes.append(e)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call_stuck)
                await entered.wait()
                tg.start_soon(conn.close)  # its on_disconnect waits for the transaction
                gate = client.registry.placement._instances[actor_id("stuck", "k")].gate
                while not gate._shared_waiting:
                    await anyio.sleep(0.01)
                await client.registry.drain()
    assert disconnects == []
    (stuck,) = outcomes
    assert "a transaction it had open was rolled back" in str(stuck)
    records = [r for r in caplog.records if "on_disconnect of" in r.getMessage()]
    assert records, caplog.text
    for record in records:
        assert record.levelno == logging.INFO and record.exc_info is None, caplog.text
        assert "cut off" in record.getMessage() and "rolled back" not in record.getMessage()


def cycle_actors() -> list[Any]:
    """`a.through(b_key, transaction)` calls `b.back(a_key)`, which calls `a.hello()`; `a.self_call`
    calls its own actor from inside a transaction; `a.reenter_transaction` calls `b`, which calls
    `a.write`, an action that opens a transaction."""
    a = actor("a", state={"n": 0})
    b = actor("b")

    @a.action
    async def through(ctx: ActorContext, b_key: str, transaction: bool) -> str:
        back = ctx.client.get_or_create("b", b_key).back
        if not transaction:
            return await back(ctx.key, "hello")
        async with ctx.db.transaction():
            ctx.state["n"] += 1
            return await back(ctx.key, "hello")

    @a.action
    async def reenter_transaction(ctx: ActorContext, b_key: str) -> str:
        return await ctx.client.get_or_create("b", b_key).back(ctx.key, "write")

    @a.action
    async def self_call(ctx: ActorContext) -> str:
        async with ctx.db.transaction():
            return await ctx.client.get("a", ctx.key).hello()

    @a.action
    async def hello(ctx: ActorContext) -> str:
        return f"hello from a/{ctx.key}"

    @a.action
    async def write(ctx: ActorContext) -> str:
        async with ctx.db.transaction():
            ctx.state["n"] += 10
        return "written"

    @a.action
    async def count(ctx: ActorContext) -> int:
        return ctx.state["n"]

    @b.action
    async def back(ctx: ActorContext, a_key: str, action: str) -> str:
        return await ctx.client.get("a", a_key).call(action)

    return [a, b]


async def test_a_call_cycle_through_a_transaction_fails_fast_and_the_actor_serves_on() -> None:
    with anyio.fail_after(10):  # on main: waits for ever
        async with Registry(cycle_actors(), kv="memory://").run() as client:
            a = client.get_or_create("a", "x")
            assert await a.through("y", False) == "hello from a/x", "no transaction: no cycle"
            with pytest.raises(CallCycle, match=r"a/x -> b/y -> a/x"):
                await a.through("y", True)
            with pytest.raises(CallCycle, match="a/x"):
                await a.self_call()
            with pytest.raises(CallCycle, match=r"a/x -> b/y"):
                await a.reenter_transaction("y")
            assert await a.hello() == "hello from a/x"
            assert await a.count() == 0, "the cycle's transaction rolled back"
            assert await a.write() == "written"


async def test_calls_that_only_share_an_actor_are_no_cycle() -> None:
    """Two unrelated calls of one actor, one in a transaction: the other waits for it, as
    before, rather than being refused."""
    release = anyio.Event()
    a = actor("a", state={"n": 0})

    @a.action
    async def hold(ctx: ActorContext) -> None:
        async with ctx.db.transaction():
            ctx.state["n"] += 1
            await release.wait()

    @a.action
    async def count(ctx: ActorContext) -> int:
        return ctx.state["n"]

    with anyio.fail_after(10):
        async with Registry([a], kv="memory://").run() as client:
            handle = client.get_or_create("a", "x")
            counted: list[int] = []

            async def count_later() -> None:
                counted.append(await handle.count())

            async with anyio.create_task_group() as tg:
                tg.start_soon(handle.hold)
                await anyio.sleep(0.1)
                tg.start_soon(count_later)
                await anyio.sleep(0.1)
                assert counted == []
                release.set()
            assert counted == [1]
