"""Concurrency: actions of one actor interleave at `await` points while database work stays
serialised, and a slow KV under one actor never holds up another actor.

Progress is judged by order (events, who finished first), never by wall-clock thresholds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from pagekv.actor import ActorContext, ActorDefinition, Registry, actor
from pagekv.actor.gate import Gate
from pagekv.kv import WRITE_OPS, ActorKv, MemoryStore
from pagekv.kv.wrappers import KvWrapper

pytestmark = pytest.mark.anyio


def journal(events: list[str], gates: dict[str, anyio.Event]) -> ActorDefinition:
    """`txn` holds a transaction open until its gate opens; `plain` writes outside one."""
    a = actor("journal", state={"log": [], "hits": 0})

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS rows(tag TEXT, step INTEGER)")

    @a.action
    async def txn(ctx: ActorContext, tag: str, *, fail: bool = False) -> None:
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO rows VALUES (?, 1)", (tag,))
            events.append(f"{tag}-in")
            ctx.state["log"].append(tag)
            await gates[tag].wait()
            await ctx.db.execute("INSERT INTO rows VALUES (?, 2)", (tag,))
            if fail:
                raise ValueError(f"{tag} failed")
        events.append(f"{tag}-out")

    @a.action
    async def plain(ctx: ActorContext, tag: str) -> None:
        await ctx.db.execute("INSERT INTO rows VALUES (?, 0)", (tag,))
        events.append(f"{tag}-done")

    @a.action
    async def hit(ctx: ActorContext) -> int:
        ctx.state["hits"] += 1
        return ctx.state["hits"]

    @a.action
    async def wait_for_gate(ctx: ActorContext, tag: str) -> str:
        events.append(f"{tag}-waiting")
        await gates[tag].wait()
        events.append(f"{tag}-released")
        return tag

    @a.action
    async def view(ctx: ActorContext) -> dict[str, Any]:
        rows = await ctx.db.execute("SELECT tag, step FROM rows ORDER BY tag, step")
        return {"rows": rows, "log": ctx.state["log"], "hits": ctx.state["hits"]}

    return a


async def test_actions_interleave_at_await_points(settle) -> None:
    events: list[str] = []
    gates = {"a": anyio.Event()}
    async with Registry([journal(events, gates)], kv="memory://").run() as client:
        handle = client.get_or_create("journal", "k")
        await handle.view()
        results: list[str] = []

        async def waiter() -> None:
            results.append(await handle.wait_for_gate("a"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await settle()
            assert events == ["a-waiting"]
            # Another action of the same actor runs to completion meanwhile.
            assert await handle.hit() == 1
            await handle.plain("b")
            gates["a"].set()
        assert events == ["a-waiting", "b-done", "a-released"]
        assert results == ["a"]


async def test_concurrent_transactions_and_statements_are_serialised(settle) -> None:
    """While one action holds a transaction open across `await`s, other actions' SQL waits
    (it must not land inside it); the failing transaction rolls back only its own work."""
    events: list[str] = []
    gates = {"a": anyio.Event(), "b": anyio.Event()}
    gates["b"].set()
    async with Registry([journal(events, gates)], kv="memory://").run() as client:
        handle = client.get_or_create("journal", "k")
        await handle.view()
        failures: list[str] = []

        async def failing() -> None:
            try:
                await handle.txn("a", fail=True)
            except ValueError as e:
                failures.append(str(e))

        async with anyio.create_task_group() as tg:
            tg.start_soon(failing)
            await settle()
            assert events == ["a-in"]
            tg.start_soon(handle.txn, "b")
            tg.start_soon(handle.plain, "c")
            await settle()
            assert events == ["a-in"], "other SQL ran while a transaction was open"
            gates["a"].set()
        assert failures == ["a failed"]
        assert set(events) == {"a-in", "b-in", "b-out", "c-done"}
        view = await handle.view()
        assert view["rows"] == [("b", 1), ("b", 2), ("c", 0)]
        assert view["log"] == ["b"]


async def test_rollback_keeps_other_actions_state_changes(settle) -> None:
    events: list[str] = []
    gates = {"a": anyio.Event()}
    async with Registry([journal(events, gates)], kv="memory://").run() as client:
        handle = client.get_or_create("journal", "k")
        await handle.view()

        async def failing() -> None:
            with pytest.raises(ValueError):
                await handle.txn("a", fail=True)

        acknowledged: list[int] = []

        async def hit() -> None:
            acknowledged.append(await handle.hit())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(failing)
                await settle()
                assert events == ["a-in"]
                tg.start_soon(hit)  # changes the state, then waits for the database to save it
                await settle()
                gates["a"].set()
        assert acknowledged == [1]
        view = await handle.view()
    assert view["hits"] == 1


class GatedKv(KvWrapper):
    """Blocks every write op in a worker thread while `armed`, until `release` is set."""

    def __init__(self, inner: ActorKv) -> None:
        super().__init__(inner)
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def _call(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.armed and op in WRITE_OPS:
            self.entered.set()
            if not self.release.wait(30):
                raise RuntimeError("the test never released the gate")
        return fn(*args, **kwargs)


class GatedStore:
    """A memory store that hands out `GatedKv` for the actor ids in `gated`."""

    def __init__(self, *gated: str) -> None:
        self.inner = MemoryStore()
        self.gates = {aid: GatedKv(self.inner.namespace(aid)) for aid in gated}

    def namespace(self, actor_id: str) -> ActorKv:
        return self.gates.get(actor_id) or self.inner.namespace(actor_id)

    def close(self) -> None:
        for gate in self.gates.values():
            gate.release.set()


async def test_a_stuck_kv_under_one_actor_does_not_block_other_actors(wait_for) -> None:
    store = GatedStore("journal/slow")
    gate = store.gates["journal/slow"]
    async with Registry([journal([], {})], kv=store).run() as client:
        slow = client.get_or_create("journal", "slow")
        assert await slow.hit() == 1
        gate.armed = True
        done: list[str] = []

        async def slow_call() -> None:
            await slow.hit()
            done.append("slow")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_call)
                await wait_for(gate.entered.is_set, what="the slow actor's write")
                # Existing and newly woken actors keep serving while the slow write hangs.
                for i in range(10):
                    assert await client.get_or_create("journal", "fast").hit() == i + 1
                    await client.get_or_create("journal", f"new-{i}").plain("x")
                done.append("fast")
                gate.release.set()
        finally:
            gate.release.set()
        assert done == ["fast", "slow"]
        assert await slow.hit() == 3


class ThreadRecordingStore:
    """Records every KV request (and `namespace()`) made on the event loop's own thread."""

    def __init__(self, loop_thread: int) -> None:
        self.inner = MemoryStore()
        self.loop_thread = loop_thread
        self.on_loop: list[str] = []
        self.started = False

    def namespace(self, actor_id: str) -> ActorKv:
        if self.started and threading.get_ident() == self.loop_thread:
            self.on_loop.append(f"namespace({actor_id})")
        store = self

        class Recording(KvWrapper):
            def _call(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                if threading.get_ident() == store.loop_thread:
                    store.on_loop.append(f"{actor_id}: {op}")
                return fn(*args, **kwargs)

        return Recording(self.inner.namespace(actor_id))

    def close(self) -> None:
        pass


async def test_waking_makes_no_kv_request_on_the_event_loop(wait_for) -> None:
    store = ThreadRecordingStore(threading.get_ident())
    registry = Registry([journal([], {})], kv=store)
    async with registry.run() as client:
        store.started = True  # opening the registry's own namespace at startup is fine
        await client.get_or_create("journal", "k").hit()
        await client.get("journal", "k").hit()
    assert store.on_loop == []


async def test_destroy_makes_no_kv_request_on_the_event_loop() -> None:
    store = ThreadRecordingStore(threading.get_ident())
    async with Registry([journal([], {})], kv=store).run() as client:
        await client.get_or_create("journal", "k").hit()
        store.on_loop.clear()  # see test_waking_makes_no_kv_request_on_the_event_loop
        await client.destroy("journal", "k")
    assert [call for call in store.on_loop if not call.startswith("namespace(")] == []


async def test_an_action_gets_in_between_back_to_back_transactions() -> None:
    """A task running transactions back to back (a workflow's steps) must not starve an action
    that arrives meanwhile: it goes in when the transaction it waited behind ends."""
    gate = Gate()
    order: list[str] = []
    proceed = anyio.Event()

    async def transactions() -> None:
        for i in range(20):
            async with gate.exclusive():
                order.append(f"txn{i}")
                if i == 0:
                    proceed.set()
                await anyio.sleep(0)

    async def action() -> None:
        await proceed.wait()
        async with gate.shared():
            order.append("action")

    async with anyio.create_task_group() as tg:
        tg.start_soon(transactions)
        tg.start_soon(action)
    assert order.index("action") <= 2, order


async def test_a_transaction_gets_in_between_a_stream_of_actions() -> None:
    """Actions arriving while a transaction waits go after it, so a stream of them cannot
    starve it; the action already in finishes first."""
    gate = Gate()
    order: list[str] = []
    first_in = anyio.Event()
    release = anyio.Event()

    async def first() -> None:
        async with gate.shared():
            first_in.set()
            await release.wait()
            order.append("first")

    async def transaction() -> None:
        async with gate.exclusive():
            order.append("txn")

    async def later(i: int) -> None:
        async with gate.shared():
            order.append(f"later{i}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await first_in.wait()
        tg.start_soon(transaction)
        await anyio.sleep(0.01)
        for i in range(3):
            tg.start_soon(later, i)
        await anyio.sleep(0.01)
        release.set()
    assert order[:2] == ["first", "txn"], order
    assert sorted(order[2:]) == ["later0", "later1", "later2"]


async def test_a_cancelled_waiting_action_does_not_block_the_next_transaction() -> None:
    """An action cancelled as the transaction it waited behind ends gives up its turn, so the
    next transaction still gets in. (The asyncio task is cancelled directly: anyio's own scope
    cancellation may be delivered only after the action got in.)"""
    gate = Gate()
    done: list[str] = []
    holding = anyio.Event()
    release = anyio.Event()
    tasks: list[asyncio.Task[Any]] = []

    async def hold() -> None:
        async with gate.exclusive():
            holding.set()
            await release.wait()
            tasks[0].cancel()

    async def action() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            async with gate.shared():
                done.append("action")
        except asyncio.CancelledError:
            done.append("cancelled")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await holding.wait()
            tg.start_soon(action)
            await anyio.sleep(0.01)
            release.set()
            async with gate.exclusive():
                done.append("txn")
    assert done == ["cancelled", "txn"]
