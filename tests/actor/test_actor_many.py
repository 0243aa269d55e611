"""Many actors on one host (#29): bounded worker threads, nothing left behind by a slept actor,
and the KV round trips of creating an actor and of a workflow, pinned so a regression fails."""

from __future__ import annotations

import gc
import threading
import weakref
from collections import Counter
from typing import Any

import anyio
import pytest

from pagekv.actor import ActorContext, OwnedElsewhere, Registry, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.worker_threads import UPKEEP_THREADS
from pagekv.actor.workflow import StepContext, WorkflowContext, WorkflowState
from pagekv.kv import ActorKv, CountingKv, FaultyStore, MemoryStore
from pagekv.kv.wrappers import KvWrapper

pytestmark = pytest.mark.anyio

counter = actor("counter", state={"n": 0}, sleep_timeout=3600)


@counter.action
async def bump(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    return ctx.state["n"]


@counter.action
async def bump_and_sleep(ctx: ActorContext) -> int:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(v)")
    await ctx.db.execute("INSERT INTO t VALUES (1)")
    ctx.state["n"] += 1
    ctx.sleep()
    return ctx.state["n"]


async def _step(step: StepContext) -> int:
    step.state["n"] += 1
    return step.state["n"]


flow = actor("flow", state={"n": 0}, sleep_timeout=3600)


@flow.workflow
async def three_steps(wf: WorkflowContext) -> str:
    for i in range(3):
        await wf.step(f"s{i}", _step)
    return "done"


class _CountingStore:
    """A memory store whose namespaces are counted (a wrapper: its work runs on threads)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.counters: dict[str, CountingKv] = {}

    def namespace(self, actor_id: str) -> ActorKv:
        counting = self.counters.get(actor_id)
        if counting is None:
            counting = self.counters[actor_id] = CountingKv(self.inner.namespace(actor_id))
        return counting

    def reset(self) -> None:
        for counting in self.counters.values():
            counting.reset()

    def trips(self) -> dict[str, int]:
        """Round trips by op since `reset`, the registry namespace's as `registry <op>`."""
        out: Counter[str] = Counter()
        for aid, counting in self.counters.items():
            prefix = "registry " if aid == REGISTRY_NAMESPACE else ""
            for op, n in counting.stats.round_trips.items():
                if n:
                    out[prefix + op] += n
        return dict(out)

    def close(self) -> None:
        pass


async def test_worker_threads_stay_bounded_when_300_actors_wake_at_once() -> None:
    """A thread per concurrent call grew malloc's arenas with every actor ever woken; the
    registry's pool holds at most `threads` whatever the number of actors (and its upkeep
    `UPKEEP_THREADS` more)."""
    store = FaultyStore(MemoryStore())  # a wrapper: not inline, every hop goes to a thread
    registry = Registry([counter], kv=store, threads=4)
    before = threading.active_count()
    peak = 0
    async with registry.run() as client:

        async def wake(i: int) -> None:
            nonlocal peak
            assert await client.get_or_create("counter", f"k{i}").bump() == 1
            peak = max(peak, threading.active_count())

        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(wake, i)
        assert len(registry.live()) == 300
        assert registry.workers.threads == 4 and not registry.workers.inline
    assert before < peak <= before + 4 + UPKEEP_THREADS, (before, peak)


async def test_a_slept_actor_leaves_no_instance_connection_or_lock_behind() -> None:
    registry = Registry([counter], kv=FaultyStore(MemoryStore()))
    async with registry.run() as client:
        handle = client.get_or_create("counter", "k")
        assert await handle.bump() == 1
        (instance,) = registry.live()
        refs: list[weakref.ref[Any]] = [
            weakref.ref(instance),
            weakref.ref(instance.ctx),
            weakref.ref(instance.ctx.db.database),
            weakref.ref(instance.ctx.db.database.connection),
        ]
        del instance
        assert await handle.bump_and_sleep() == 2
        with anyio.fail_after(10):
            while registry.live():
                await anyio.sleep(0.01)
        gc.collect()
        assert [ref() for ref in refs] == [None] * len(refs)
        assert registry.placement._instances == {} and registry.placement._locks == {}
        assert await handle.bump() == 3, "it wakes again with its state"


async def test_kv_round_trips_of_a_new_actor_and_of_a_three_step_workflow() -> None:
    """Creating an actor: the registry reads its records and its lease entries (2 lists) and
    writes its lease and its record (2 writes); the actor's namespace takes one takeover, one
    list (recovery), one write for the internal tables with the creation, one generation read
    (no other registry woke it meanwhile), and its first action's commit. A 3-step workflow
    started per request: the same creation, one commit per step and one for the outcome."""
    store = _CountingStore()
    async with Registry([counter, flow], kv=store).run() as client:
        await client.get_or_create("counter", "warm").bump()
        for i in range(2):
            store.reset()
            assert await client.get_or_create("counter", f"new{i}").bump() == 1
            assert store.trips() == {
                "registry list": 2,
                "registry write": 2,
                "takeover": 1,
                "list": 1,
                "write": 2,
                "generation": 1,
            }
        store.reset()
        await client.get_or_create("counter", "new0").bump()
        assert store.trips() == {"write": 1}, "a state-only action on a live actor: one commit"
        for i in range(2):
            store.reset()
            handle = client.get_or_create("flow", f"wf{i}")
            with anyio.fail_after(10):
                while (await handle.workflow.status()).state is not WorkflowState.COMPLETED:
                    await anyio.sleep(0.005)
            assert (await handle.workflow.status()).output == "done"
            assert store.trips() == {
                "registry list": 2,
                "registry write": 2,
                "takeover": 1,
                "list": 1,
                "write": 5,
                "generation": 1,
            }


class _StuckStore:
    """A memory store whose `counter/stuck-*` namespaces hang in every call while `stuck` is set
    (a stalled PostgreSQL connection, a row lock), until `release` is set."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.stuck, self.release = threading.Event(), threading.Event()
        self.hung = 0

    def namespace(self, actor_id: str) -> ActorKv:
        namespace = self.inner.namespace(actor_id)
        return _Stuck(namespace, self) if actor_id.startswith("counter/stuck-") else namespace

    def close(self) -> None:
        pass


class _Stuck(KvWrapper):
    def __init__(self, inner: ActorKv, store: _StuckStore) -> None:
        super().__init__(inner)
        self._store = store

    def _call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._store.stuck.is_set():
            self._store.hung += 1
            self._store.release.wait(30)
        return fn(*args, **kwargs)


async def test_a_pool_full_of_stuck_actors_still_renews_the_other_actors_leases() -> None:
    """The registry's upkeep has threads of its own: with every pool thread stuck under some
    actors' KV for longer than a lease, a healthy actor's lease is still renewed, so another
    registry does not take it over."""
    store, lease = _StuckStore(), 1.0
    first = Registry([counter], kv=store, lease=lease, address="http://a:1", threads=2)
    second = Registry([counter], kv=store, lease=lease, address="http://b:1")
    async with first.run() as a, second.run() as b:
        for name in ("stuck-0", "stuck-1", "healthy"):
            await a.get_or_create("counter", name).bump()
        store.stuck.set()
        async with anyio.create_task_group() as group:
            for name in ("stuck-0", "stuck-1"):
                group.start_soon(a.get_or_create("counter", name).bump)
            await anyio.sleep(lease * 2)
            assert store.hung == 2 and first.workers.busy() == 2, "the pool is full"
            with pytest.raises(OwnedElsewhere):
                await b.get_or_create("counter", "healthy").bump()
            store.release.set()
        assert first.counters["takeovers"] == 0
        assert await a.get_or_create("counter", "healthy").bump() == 2
