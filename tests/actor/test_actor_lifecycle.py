"""Lifecycle of one actor: hook order, sleep and wake, the run handler, crashes in hooks, destroy.

Every test defines its actors inside the test (a fresh `ActorDefinition` each time) and records
what the hooks saw in a local list, so tests share nothing.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import anyio
import pytest

from pagekv.actor import (
    ActionNotFound,
    ActorContext,
    ActorDefinition,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    InvalidArguments,
    Registry,
    actor,
)
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.registry import actor_id
from pagekv.kv import WRITE_OPS, Fault, FaultKind, FaultyStore, KeyTooLarge, MemoryStore

pytestmark = pytest.mark.anyio


def hooked(events: list[Any], *, create_state: bool = False) -> ActorDefinition:
    """An actor with every hook, each appending its name (and input) to `events`.

    Without `create_state` the static default state is used and `on_create` records the input.
    """
    a = actor("hooked", state={"n": 0})

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        events.append("on_migrate")
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(x)")

    if create_state:

        @a.create_state
        async def create_state_(ctx: ActorContext, input: Any) -> Any:
            events.append(("create_state", input))
            return {"n": 0, "input": input}

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        events.append(("on_create", input))
        ctx.state["input"] = input
        ctx.state["created"] = True

    @a.create_vars
    async def create_vars(ctx: ActorContext) -> Any:
        events.append("create_vars")
        return {"wakes": 0}

    @a.on_wake
    async def on_wake(ctx: ActorContext) -> None:
        events.append("on_wake")
        ctx.vars["wakes"] += 1

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        events.append("on_sleep")

    @a.on_destroy
    async def on_destroy(ctx: ActorContext) -> None:
        events.append("on_destroy")

    @a.run
    async def run(ctx: ActorContext) -> None:
        events.append("run")

    @a.action
    async def ping(ctx: ActorContext) -> dict[str, Any]:
        events.append("ping")
        return {"state": ctx.state, "vars": ctx.vars}

    @a.action
    async def nap(ctx: ActorContext) -> str:
        ctx.sleep()
        return "zzz"

    return a


async def test_hook_order_on_create_and_on_wake(wait_for) -> None:
    events: list[Any] = []
    registry = Registry([hooked(events)], kv="memory://")
    async with registry.run() as client:
        first = await client.get_or_create("hooked", "k", input="hello").ping()
        await wait_for(lambda: "run" in events, what="the run handler")
        assert events[:4] == ["on_migrate", ("on_create", "hello"), "create_vars", "on_wake"]
        assert sorted(map(str, events[4:])) == ["ping", "run"]
        assert first["state"] == {"n": 0, "input": "hello", "created": True}
        assert first["vars"] == {"wakes": 1}

        events.clear()
        assert await client.get("hooked", "k").nap() == "zzz"
        await wait_for(lambda: not registry.live(), what="sleep")
        assert events == ["on_sleep"]

        events.clear()
        again = await client.get_or_create("hooked", "k", input="ignored").ping()
        await wait_for(lambda: "run" in events, what="the run handler")
        # A wake runs no create hooks, and `input` is only for creation.
        assert events[:3] == ["on_migrate", "create_vars", "on_wake"]
        assert sorted(map(str, events[3:])) == ["ping", "run"]
        assert again == first

        events.clear()
        await client.destroy("hooked", "k")
        assert events == ["on_destroy"]
        assert registry.live() == []


async def test_create_state_hook_runs_between_on_migrate_and_on_create(attempt) -> None:
    events: list[Any] = []
    registry = Registry([hooked(events, create_state=True)], kv="memory://")
    async with registry.run() as client:
        first = await attempt(client.get_or_create("hooked", "k", input="hello").ping())
    assert events[:5] == [
        "on_migrate",
        ("create_state", "hello"),
        ("on_create", "hello"),
        "create_vars",
        "on_wake",
    ]
    assert first["state"] == {"n": 0, "input": "hello", "created": True}


async def test_static_state_is_copied_per_actor() -> None:
    a = actor("lists", state={"items": []})

    @a.action
    async def push(ctx: ActorContext, item: str) -> list[str]:
        ctx.state["items"].append(item)
        return ctx.state["items"]

    async with Registry([a], kv="memory://").run() as client:
        assert await client.get_or_create("lists", "one").push("x") == ["x"]
        assert await client.get_or_create("lists", "two").push("y") == ["y"]
    assert a.state == {"items": []}


async def test_on_migrate_is_atomic() -> None:
    """A failing `on_migrate` leaves no trace; the next wake runs it again from scratch."""
    attempts = []
    a = actor("migrating")

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        attempts.append(1)
        await ctx.db.execute("CREATE TABLE t(x)")  # no IF NOT EXISTS: fails if a trace remained
        await ctx.db.execute("INSERT INTO t VALUES (1)")
        if len(attempts) == 1:
            raise RuntimeError("migration failed")

    @a.action
    async def rows(ctx: ActorContext) -> list[Any]:
        return await ctx.db.execute("SELECT x FROM t")

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        with pytest.raises(RuntimeError, match="migration failed"):
            await client.get_or_create("migrating", "k").rows()
        assert registry.live() == []
        assert await client.get_or_create("migrating", "k").rows() == [(1,)]


def durable(events: list[str], *, sleep_timeout: float) -> ActorDefinition:
    a = actor("durable", state={"count": 0}, sleep_timeout=sleep_timeout)

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS items(v TEXT)")

    @a.create_vars
    async def create_vars(ctx: ActorContext) -> Any:
        events.append("create_vars")
        return {"calls": 0}

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        events.append("on_sleep")

    @a.action
    async def add(ctx: ActorContext, v: str) -> int:
        await ctx.db.execute("INSERT INTO items VALUES (?)", (v,))
        await ctx.kv.put({v.encode(): v.upper().encode()})
        ctx.state["count"] += 1
        ctx.vars["calls"] += 1
        return ctx.state["count"]

    @a.action
    async def view(ctx: ActorContext) -> dict[str, Any]:
        rows = await ctx.db.execute("SELECT v FROM items ORDER BY rowid")
        return {
            "count": ctx.state["count"],
            "rows": [v for (v,) in rows],
            "kv": await ctx.kv.list(),
            "calls": ctx.vars["calls"],
        }

    return a


async def test_state_db_and_kv_survive_idle_sleep(wait_for) -> None:
    events: list[str] = []
    registry = Registry([durable(events, sleep_timeout=0.2)], kv="memory://")
    async with registry.run() as client:
        handle = client.get_or_create("durable", "k")
        assert await handle.add("a") == 1
        assert await handle.add("b") == 2
        await wait_for(lambda: not registry.live(), what="idle sleep")
        assert events == ["create_vars", "on_sleep"]
        assert await handle.view() == {
            "count": 2,
            "rows": ["a", "b"],
            "kv": [(b"a", b"A"), (b"b", b"B")],
            "calls": 0,  # vars are ephemeral: rebuilt on wake
        }
        assert events == ["create_vars", "on_sleep", "create_vars"]


async def test_state_db_and_kv_survive_registry_restart(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    events: list[str] = []
    definition = durable(events, sleep_timeout=30.0)
    async with Registry([definition], kv=url).run() as client:
        await client.get_or_create("durable", "k").add("a")
        await client.get_or_create("durable", "k").add("b")
    assert events == ["create_vars", "on_sleep"]
    async with Registry([definition], kv=url).run() as client:
        view = await client.get("durable", "k").view()
    assert view == {"count": 2, "rows": ["a", "b"], "kv": [(b"a", b"A"), (b"b", b"B")], "calls": 0}


async def test_run_handler_keeps_the_actor_awake(wait_for) -> None:
    events: list[str] = []
    release = anyio.Event()
    a = actor("runner", state={"ran": False}, sleep_timeout=0.1)

    @a.run
    async def run(ctx: ActorContext) -> None:
        events.append("run-start")
        await release.wait()
        ctx.state["ran"] = True
        events.append("run-end")

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        events.append("on_sleep")

    @a.action
    async def ran(ctx: ActorContext) -> bool:
        return ctx.state["ran"]

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        assert await client.get_or_create("runner", "k").ran() is False
        await wait_for(lambda: "run-start" in events, what="the run handler")
        (instance,) = registry.live()
        # Many idle checks (every 50 ms) at a 0.1 s timeout: the run handler must hold sleep off.
        for _ in range(10):
            await anyio.sleep(0.05)
            assert instance.idle_for() is None
        assert registry.live() == [instance]
        assert events == ["run-start"]

        release.set()
        await wait_for(lambda: not registry.live(), what="sleep after the run handler returned")
        assert events == ["run-start", "run-end", "on_sleep"]
        # What the run handler changed in the state was saved; the next wake runs it again.
        assert await client.get("runner", "k").ran() is True


async def test_failing_run_handler_tears_down_and_next_call_wakes_fresh(wait_for) -> None:
    wakes: list[int] = []
    a = actor("crashy-run")

    @a.on_wake
    async def on_wake(ctx: ActorContext) -> None:
        wakes.append(1)

    @a.run
    async def run(ctx: ActorContext) -> None:
        if len(wakes) == 1:
            raise RuntimeError("run failed")
        await anyio.sleep_forever()

    @a.action
    async def ping(ctx: ActorContext) -> str:
        return "pong"

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        handle = client.get_or_create("crashy-run", "k")
        # The first call may reach the first instance before its run handler fails, or find it
        # already torn down and wake a fresh one; either way the failure forces a second wake.
        assert await handle.ping() == "pong"
        await wait_for(
            lambda: len(wakes) == 2 or not registry.live(),
            what="teardown after the run handler failed",
        )
        assert await handle.ping() == "pong"
        assert len(wakes) == 2


async def test_exception_in_on_wake_tears_down_and_next_call_retries() -> None:
    wakes: list[int] = []
    a = actor("crashy-wake", state={"count": 0})

    @a.on_wake
    async def on_wake(ctx: ActorContext) -> None:
        wakes.append(1)
        if len(wakes) == 1:
            raise RuntimeError("on_wake failed")

    @a.action
    async def inc(ctx: ActorContext) -> int:
        ctx.state["count"] += 1
        return ctx.state["count"]

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        handle = client.get_or_create("crashy-wake", "k")
        with pytest.raises(RuntimeError, match="on_wake failed"):
            await handle.inc()
        assert registry.live() == []
        assert await handle.inc() == 1
        assert len(wakes) == 2
        assert await handle.inc() == 2


async def test_input_survives_a_failed_on_create(attempt) -> None:
    failures = [RuntimeError("on_create failed")]
    a = actor("fragile")

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        if failures:
            raise failures.pop()
        ctx.state = {"input": input}

    @a.action
    async def input_(ctx: ActorContext) -> Any:
        return ctx.state["input"]

    async with Registry([a], kv="memory://").run() as client:
        with pytest.raises(RuntimeError, match="on_create failed"):
            await client.create("fragile", "k", input={"seed": 7})
        retried = await attempt(client.create("fragile", "k", input={"seed": 7}))
        if isinstance(retried, ActorExists):
            retried = client.get("fragile", "k")
        seen = await attempt(retried.call("input_"))
    assert seen == {"seed": 7}


async def test_ctx_sleep_from_an_action(wait_for) -> None:
    events: list[Any] = []
    registry = Registry([hooked(events)], kv="memory://")
    async with registry.run() as client:
        handle = client.get_or_create("hooked", "k", input=1)
        await handle.ping()
        await wait_for(lambda: "run" in events, what="the run handler")
        events.clear()
        # The action's result is delivered, then the actor sleeps (long before its 30 s timeout).
        assert await handle.nap() == "zzz"
        await wait_for(lambda: not registry.live(), what="sleep")
        assert events == ["on_sleep"]
        assert (await handle.ping())["vars"] == {"wakes": 1}


async def test_ctx_destroy_from_an_action(wait_for) -> None:
    events: list[Any] = []
    a = hooked(events)

    @a.action
    async def bye(ctx: ActorContext) -> str:
        ctx.state["n"] = 99
        ctx.destroy()
        return "bye"

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        await client.get_or_create("hooked", "k", input=1).ping()
        assert await client.get("hooked", "k").bye() == "bye"
        await wait_for(lambda: not registry.live(), what="destroy")
        assert "on_destroy" in events
        with pytest.raises(ActorNotFound):
            await client.get("hooked", "k").ping()
        events.clear()
        fresh = await client.get_or_create("hooked", "k", input=2).ping()
        assert fresh["state"] == {"n": 0, "input": 2, "created": True}
        assert events[:2] == ["on_migrate", ("on_create", 2)]


async def test_ctx_destroy_is_not_lost_when_the_registry_exits(tmp_path: Path, attempt) -> None:
    events: list[Any] = []
    a = hooked(events)

    @a.action
    async def bye(ctx: ActorContext) -> str:
        ctx.destroy()
        return "bye"

    url = f"file://{tmp_path}/store"
    async with Registry([a], kv=url).run() as client:
        assert await client.get_or_create("hooked", "k", input=1).bye() == "bye"
    async with Registry([a], kv=url).run() as client:
        after = await attempt(client.get("hooked", "k").ping())
    assert isinstance(after, ActorNotFound)
    assert "on_destroy" in events


async def test_registry_exit_sleeps_live_actors() -> None:
    events: list[Any] = []
    registry = Registry([hooked(events)], kv="memory://")
    async with registry.run() as client:
        await client.get_or_create("hooked", "a", input=1).ping()
        await client.get_or_create("hooked", "b", input=1).ping()
    assert events.count("on_sleep") == 2
    assert registry.live() == []


async def test_ctx_sleep_stops_a_long_running_run_handler(wait_for) -> None:
    events: list[str] = []
    a = actor("looper")

    @a.run
    async def run(ctx: ActorContext) -> None:
        events.append("run-start")
        try:
            await anyio.sleep_forever()
        finally:
            events.append("run-exit")

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        events.append("on_sleep")

    @a.action
    async def nap(ctx: ActorContext) -> None:
        ctx.sleep()

    @a.action
    async def ping(ctx: ActorContext) -> None:
        pass

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        await client.get_or_create("looper", "k").ping()
        await wait_for(lambda: "run-start" in events, what="the run handler")
        await client.get("looper", "k").nap()
        with anyio.move_on_after(2):
            while registry.live():
                await anyio.sleep(0.01)
        slept = not registry.live()
    assert slept
    assert sorted(events) == ["on_sleep", "run-exit", "run-start"]


async def test_a_call_arriving_while_the_actor_goes_to_sleep_wakes_a_fresh_instance(
    wait_for,
) -> None:
    events: list[str] = []
    sleeping = anyio.Event()
    release = anyio.Event()
    a = actor("drowsy", state={"count": 0}, sleep_timeout=0.1)

    @a.on_sleep
    async def on_sleep(ctx: ActorContext) -> None:
        events.append("on_sleep")
        sleeping.set()
        await release.wait()

    @a.on_wake
    async def on_wake(ctx: ActorContext) -> None:
        events.append("on_wake")

    @a.action
    async def inc(ctx: ActorContext) -> int:
        ctx.state["count"] += 1
        return ctx.state["count"]

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        assert await client.get_or_create("drowsy", "k").inc() == 1
        (first,) = registry.live()
        results: list[int] = []

        async def late_call() -> None:
            results.append(await client.get("drowsy", "k").inc())

        # Not `anyio.wait_all_tasks_blocked()`: the registry's housekeeping wakes every 50 ms,
        # and on a loaded machine its wake-ups can fall in step with that function's checks
        # (every 100 ms), which then never find every task blocked.
        try:
            with anyio.fail_after(10):
                await sleeping.wait()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(late_call)
                    await wait_for(
                        lambda: first.stopped.statistics().tasks_waiting > 0,
                        what="the late call waiting for the sleep to finish",
                    )
                    assert results == []  # it waits for the sleep to finish ...
                    release.set()
        finally:
            release.set()  # a failure above must not leave the registry's exit waiting on it
        assert results == [2]  # ... then wakes a fresh instance
        assert events == ["on_wake", "on_sleep", "on_wake"]


async def test_a_call_whose_takeover_check_overlaps_the_start_of_a_sleep_is_retried(
    wait_for, attempt
) -> None:
    """The sleep begins while a call waits for its takeover check (a worker-thread hop to the
    store): the call must go to a fresh instance, not run on the one being closed (which
    failed it with `ActorStopped`). The check is held open here until the sleep has begun."""
    a = actor("drowsy", state={"count": 0}, sleep_timeout=3600)

    @a.action
    async def inc(ctx: ActorContext) -> int:
        ctx.state["count"] += 1
        await ctx.db.execute("SELECT 1")
        return ctx.state["count"]

    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        assert await client.get_or_create("drowsy", "k").inc() == 1
        (first,) = registry.live()
        checking, release = anyio.Event(), anyio.Event()
        check = first.owner_check.check_current

        async def held_check() -> None:
            checking.set()
            await release.wait()
            await check()

        first.owner_check.check_current = held_check  # type: ignore[method-assign]
        results: list[Any] = []

        async def call() -> None:
            results.append(await attempt(client.get("drowsy", "k").inc()))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await checking.wait()
                tg.start_soon(first.stop, "sleep")
                await wait_for(lambda: first.phase.value != "running", what="the sleep to begin")
                release.set()
        assert results == [2]
        assert registry.live() and registry.live()[0] is not first


async def test_concurrent_get_or_create_creates_once() -> None:
    creates: list[Any] = []
    a = actor("popular", state={"count": 0})

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        creates.append(input)

    @a.action
    async def inc(ctx: ActorContext) -> int:
        ctx.state["count"] += 1
        return ctx.state["count"]

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        results: list[int] = []

        async def call(i: int) -> None:
            results.append(await client.get_or_create("popular", "k", input=i).inc())

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(call, i)
        assert sorted(results) == list(range(1, 11))
        assert len(creates) == 1
        assert len(registry.live()) == 1


async def test_a_key_too_long_for_the_registry_is_refused_before_anything_is_written() -> None:
    """The wake entries are longer than the index entry: a key that fits the one but not the
    others failed at the wake write, after the takeover, and left an unindexed namespace."""
    a = actor("keyed", state={})

    @a.action
    async def ping(ctx: ActorContext) -> str:
        return "pong"

    store = MemoryStore()
    longest_ok = 2048 - len("due/") - 16 - len("/keyed/") - len("/") - 20
    async with Registry([a], kv=store).run() as client:
        assert await client.get_or_create("keyed", "k" * longest_ok).ping() == "pong"
        with pytest.raises(KeyTooLarge, match="registry entry of 2049 bytes"):
            await client.get_or_create("keyed", "k" * (longest_ok + 1)).ping()
        assert sorted(store.actor_ids()) == sorted(
            [REGISTRY_NAMESPACE, f"keyed/{'k' * longest_ok}"]
        ), "no namespace of the refused key"


async def test_a_call_that_cannot_bind_wakes_and_creates_nothing(attempt, stored_actors) -> None:
    """An unknown action, or arguments that do not bind to the action's signature, are refused
    before the actor is woken: calling an actor that does not exist that way leaves no namespace
    and no registry entry behind, and names the action and what did not bind."""
    a = actor("binder", state={})

    @a.action
    async def put(ctx: ActorContext, item: str, *, count: int = 1) -> str:
        return item * count

    store = MemoryStore()
    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("binder", "k")
        outcomes = [
            await attempt(handle.put("a", 2)),
            await attempt(handle.put()),
            await attempt(handle.put("a", size=3)),
            await attempt(handle.put("a", item="b")),
            await attempt(handle.take()),
        ]
        after = stored_actors(store)
        assert await handle.put("a", count=2) == "aa"  # the same call, bound: creates it
    too_many, missing, unknown, twice, no_action = outcomes
    for outcome in (too_many, missing, unknown, twice):
        assert isinstance(outcome, InvalidArguments), outcome
        assert "action 'put' of actor 'binder' takes (item, *, count=1): " in str(outcome)
    assert str(too_many).endswith("too many positional arguments")
    assert str(missing).endswith("missing a required argument: 'item'")
    assert str(unknown).endswith("got an unexpected keyword argument 'size'")
    assert str(twice).endswith("multiple values for argument 'item'")
    assert isinstance(no_action, ActionNotFound) and "no action 'take'" in str(no_action)
    assert after == ([], [])


async def test_the_registry_forgets_the_locks_of_actors_not_awake() -> None:
    a = actor("napper", state={}, sleep_timeout=3600)

    @a.action
    async def nap(ctx: ActorContext) -> None:
        ctx.sleep()

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        for i in range(50):
            with pytest.raises(ActorNotFound):
                await client.get("napper", f"missing-{i}").nap()
        assert registry.placement._locks == {}
        await client.get_or_create("napper", "k").nap()
        with anyio.fail_after(10):
            while registry.live():
                await anyio.sleep(0.01)
        assert registry.placement._locks == {}


async def test_keys_are_distinct_actors() -> None:
    a = actor("keyed", state={"key": None})

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        ctx.state["key"] = ctx.key

    @a.action
    async def who(ctx: ActorContext) -> tuple[str, str]:
        return ctx.state["key"], ctx.actor_id

    keys = ["room/1", "room%2F1", "room 1", "", "ключ", "a" * 200]
    async with Registry([a], kv="memory://").run() as client:
        ids = set()
        for key in keys:
            stored, aid = await client.get_or_create("keyed", key).who()
            assert stored == key
            ids.add(aid)
        assert len(ids) == len(keys)
        for key in keys:
            assert (await client.get("keyed", key).who())[0] == key


def test_definitions_are_validated() -> None:
    with pytest.raises(ValueError, match="name"):
        actor("has space")
    with pytest.raises(ValueError, match="sleep_timeout"):
        actor("ok", sleep_timeout=0)
    a = actor("dup")

    @a.action
    async def act(ctx: ActorContext) -> None:
        pass

    with pytest.raises(ValueError, match="already has an action"):
        a.action(act)
    with pytest.raises(ValueError, match="two actors"):
        Registry([actor("same"), actor("same")], kv="memory://")


async def test_destroying_a_sleeping_actor_does_not_leave_its_run_handler_running() -> None:
    running: list[str] = []
    a = actor("ticker")

    @a.run
    async def run(ctx: ActorContext) -> None:
        running.append(ctx.key)
        try:
            await anyio.sleep_forever()
        finally:
            running.remove(ctx.key)

    store = MemoryStore()
    async with Registry([a], kv=store).run() as client:
        await client.create("ticker", "k")
    assert running == []
    async with Registry([a], kv=store).run() as client:
        await client.destroy("ticker", "k")
        with anyio.move_on_after(1):
            while True:  # give a stray run handler every chance to show up
                await anyio.sleep(0.05)
                if running:
                    break
        after_destroy = list(running)
    assert after_destroy == []


async def test_an_action_in_flight_during_destroy_fails_with_actor_stopped(attempt, settle) -> None:
    release = anyio.Event()
    a = actor("busy", state={"n": 0}, stop_grace=0.2)

    @a.action
    async def slow(ctx: ActorContext) -> str:
        await release.wait()
        ctx.state["n"] += 1
        return "done"

    async with Registry([a], kv="memory://").run() as client:
        outcomes: list[Any] = []

        async def call() -> None:
            outcomes.append(await attempt(client.get_or_create("busy", "k").slow()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await settle()
            await client.destroy("busy", "k")
            release.set()
    (outcome,) = outcomes
    assert outcome == "done" or isinstance(outcome, ActorStopped)


async def test_a_run_handler_that_puts_its_actor_to_sleep_is_not_woken_again() -> None:
    """A busy run handler's claim to resume made `ctx.sleep()` from the handler itself wake the
    actor again at the next poll, twice a second for ever."""
    runs = []
    sleeper = actor("sleeper", state={"n": 0})

    @sleeper.run
    async def run(ctx: ActorContext) -> None:
        runs.append(1)
        ctx.sleep()
        await anyio.sleep(60)

    @sleeper.action
    async def hello(ctx: ActorContext) -> str:
        return "hi"

    registry = Registry([sleeper], kv=MemoryStore())
    async with registry.run() as client:
        # (the call may meet the instance its run handler put to sleep, and wake it again)
        assert await client.get_or_create("sleeper", "k").hello() == "hi"
        await anyio.sleep(0.2)
        wakes, started = registry.counters["wakes"], len(runs)
        assert registry.counters["sleeps"] == wakes, "it went to sleep"
        await anyio.sleep(2.0)  # four polls of the wake index
        assert registry.counters["wakes"] == wakes and len(runs) == started


def test_hooks_are_methods_an_ide_and_a_type_checker_can_see() -> None:
    """They were made up by `__getattr__`: invisible to completion and type checks."""
    hooks = ["on_migrate", "create_state", "on_create", "create_vars", "on_wake", "on_sleep"]
    for name in [*hooks, "on_destroy", "run", "action", "workflow"]:
        assert inspect.isfunction(inspect.getattr_static(ActorDefinition, name)), name
    a = actor("typed")
    with pytest.raises(AttributeError):
        a.on_wakeup  # noqa: B018  # a typo is an error, not a silent hook


@pytest.mark.parametrize("kind", [FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE])
async def test_on_create_s_sql_is_there_once_whichever_write_of_the_creation_fails(
    kind: FaultKind,
) -> None:
    """`on_create` commits with the record of the creation: a write of the new actor that fails
    (before or after it landed) never leaves the hook's SQL behind for the retry to repeat."""
    a = actor("once")
    runs: list[int] = []

    @a.on_create
    async def on_create(ctx: ActorContext, input: Any) -> None:
        runs.append(1)
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(x)")
        await ctx.db.execute("INSERT INTO t VALUES (1)")

    @a.action
    async def rows(ctx: ActorContext) -> int:
        return (await ctx.db.execute("SELECT count(*) FROM t"))[0][0]

    fired = 0
    for position in range(10):  # every op of the creation, and past its end
        store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
        store.namespace(actor_id("once", "k"))
        faulty = store.faulty[actor_id("once", "k")]
        faulty.add(Fault(position, kind, WRITE_OPS))
        runs.clear()
        async with Registry([a], kv=store).run() as client:
            for _ in range(3):
                try:
                    counted = await client.get_or_create("once", "k").rows()
                    break
                except Exception:
                    continue
        fired += faulty.fired_count()
        assert counted == 1, f"fault at op {position}: on_create ran {len(runs)}, {counted} rows"
    assert fired >= 3, "faults fired inside the creation"
