"""Schedules fire after sleep and after a whole-process restart; queue messages survive crashes
and are redelivered until completed; limits fail clearly."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from pagekv.actor import ActionNotFound, ActorContext, InvalidArguments, Registry, actor
from pagekv.actor.directory.leases import Lease, Sleeper
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.queue import (
    MAX_MESSAGE_BYTES,
    MAX_QUEUE_NAME_BYTES,
    InvalidQueueName,
    MessageTooLarge,
    QueueFull,
)
from pagekv.actor.registry import actor_id
from pagekv.actor.schedule import TooManySchedules, next_due
from pagekv.kv import CountingKv, FaultKind, FaultyStore, MemoryStore

pytestmark = pytest.mark.anyio
WaitFor = Callable[..., Awaitable[None]]
Attempt = Callable[[Awaitable[Any]], Awaitable[Any]]
StoredActors = Callable[[MemoryStore], tuple[list[str], list[bytes]]]


def _ticker(sleep_timeout: float = 0.2) -> Any:
    a = actor("ticker", state={"ticks": [], "msgs": []}, sleep_timeout=sleep_timeout)

    @a.action
    async def arm(ctx: ActorContext, delay: float) -> str:
        return await ctx.schedule.after(delay, "tick", "once")

    @a.action
    async def arm_every(ctx: ActorContext, every: float) -> str:
        return await ctx.schedule.every(every, "tick", "again", name="beat")

    @a.action
    async def tick(ctx: ActorContext, label: str) -> None:
        ctx.state["ticks"].append(label)

    @a.action
    async def ticks(ctx: ActorContext) -> list[str]:
        return ctx.state["ticks"]

    @a.action
    async def pending(ctx: ActorContext) -> list[str]:
        return [e.action for e in await ctx.schedule.list()]

    return a


async def test_a_schedule_wakes_a_sleeping_actor_and_fires_once(wait_for: WaitFor) -> None:
    a = _ticker()
    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("ticker", "k")
        await handle.arm(0.6)
        await wait_for(lambda: not registry.live(), what="idle sleep before the schedule is due")
        await wait_for(lambda: bool(registry.live()), what="the schedule waking the actor")
        await wait_for(lambda: not registry.live(), what="sleep after the dispatch")
        assert await handle.ticks() == ["once"]
        assert await handle.pending() == []


async def test_a_scheduled_action_the_kv_refuses_fails_once_and_is_settled(
    wait_for: WaitFor,
) -> None:
    """A KV error the action's own request caused (an `InvalidArgument`, a `LimitError`) is the
    action's failure: the schedule is settled after one run, like any failed action, not left
    due to fail again at every dispatch as it is after a storage failure."""
    runs: list[str] = []
    a = actor("asker")

    @a.action
    async def arm(ctx: ActorContext) -> str:
        return await ctx.schedule.after(0.05, "ask")

    @a.action
    async def ask(ctx: ActorContext) -> None:
        runs.append("ask")
        await ctx.kv.list(limit=0)

    @a.action
    async def pending(ctx: ActorContext) -> list[str]:
        return [e.action for e in await ctx.schedule.list()]

    async with Registry([a], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("asker", "k")
        await handle.arm()
        await wait_for(lambda: bool(runs), what="the scheduled run")
        await anyio.sleep(0.5)  # ten housekeeping rounds: a due schedule would run again
        assert runs == ["ask"]
        assert await handle.pending() == []


async def test_a_failed_wake_poll_is_retried_and_the_schedule_still_fires(
    wait_for: WaitFor,
) -> None:
    """A store error in the registry's background loop (a network blip on PostgreSQL, say) must
    cost one round, not the registry: before, it ended the loop and every later call failed."""
    store = FaultyStore(MemoryStore())
    index = store.namespace(REGISTRY_NAMESPACE)
    registry = Registry([_ticker()], kv=store)
    async with registry.run() as client:
        handle = client.get_or_create("ticker", "k")
        await handle.arm(1.2)
        await wait_for(lambda: not registry.live(), what="idle sleep before the schedule is due")
        index.arm(FaultKind.FAIL_BEFORE, ops=frozenset({"list"}))
        await wait_for(lambda: bool(index.fired), what="the injected fault")
        assert registry.counters["housekeeping_errors"] == 1
        await wait_for(lambda: bool(registry.live()), what="the schedule waking the actor")
        assert registry.running
        await wait_for(lambda: not registry.live(), what="sleep after the dispatch")
        assert await handle.ticks() == ["once"]
        assert [f.op for f in index.fired] == ["list"]
        assert registry.counters["housekeeping_errors"] == 1


async def test_recurring_schedules_keep_their_cadence(wait_for: WaitFor) -> None:
    a = _ticker(sleep_timeout=30)
    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("ticker", "k")
        event = await handle.arm_every(0.15)
        assert event == "every:beat"
        assert await handle.arm_every(0.15) == event, "a named schedule upserts"
        await wait_for(lambda: len(registry.live()[0].ctx.state["ticks"]) >= 3, what="3 ticks")
        assert await handle.pending() == ["tick"]
    assert next_due(10.0, 5.0, 31.0) == 35.0 and next_due(10.0, 5.0, 3.0) == 15.0


async def test_a_wake_poll_reads_only_the_due_entries(wait_for: WaitFor) -> None:
    """The registry polls its wake index every 0.5 s: that must cost nothing per sleeping actor
    that is not due, or a server with many sleeping actors spends its time polling."""
    registry = Registry([_ticker(sleep_timeout=0.05)], kv=MemoryStore())
    keys = [f"k{i}" for i in range(40)]
    async with registry.run() as client:
        for key in keys:
            await client.get_or_create("ticker", key).arm(3600)
        await wait_for(lambda: not registry.live(), what="every actor asleep")
        counting = CountingKv(registry.index)
        registry.ownership._index = counting
        assert await registry.housekeeping.due_sleepers(time.time()) == []
        assert counting.stats.entries_read == 0, "no wake entry is due, so none is read"
        due = await registry.housekeeping.due_sleepers(time.time() + 3601)
        assert sorted((s.name, s.key) for s in due) == [("ticker", key) for key in sorted(keys)]
        assert counting.stats.round_trips["list"] == 2


def _publish(registry: Registry, generation: int, due: float | None) -> None:
    """Publish a released lease of ticker/k for an instance of this generation."""
    registry.ownership.publish(actor_id("ticker", "k"), generation, "ticker", "k", Lease(due, None))


def _sleepers(registry: Registry, now: float) -> list[tuple[str, str]]:
    return [(s.name, s.key) for s in registry.ownership.due_sleepers(now, set())]


async def test_each_wake_time_replaces_the_due_entries_it_supersedes() -> None:
    """A new wake time removes the due entries of its own and older generations' earlier times in
    the same batch, but never a newer generation's: that one decides while it lives."""
    registry = Registry([_ticker()], kv=MemoryStore())
    hour = time.time() + 3600

    def due_entries() -> list[bytes]:
        return [key for key, _ in registry.index.list(prefix=b"due/")]

    async with registry.run():
        _publish(registry, 2, hour)
        _publish(registry, 2, hour + 60)
        assert len(due_entries()) == 1, "generation 2's earlier time is gone"
        _publish(registry, 1, hour + 120)  # a stale instance, writing late
        assert len(due_entries()) == 2, "a stale generation leaves the newer one's entry alone"
        assert _sleepers(registry, hour + 3600) == [("ticker", "k")], "once"
        _publish(registry, 2, None)
        assert due_entries() == [], "no wake time: every older due entry is gone"
        assert _sleepers(registry, hour + 3600) == []


async def test_a_due_entry_whose_wake_entry_is_gone_is_deleted_by_the_poll() -> None:
    registry = Registry([_ticker()], kv=MemoryStore())
    async with registry.run():
        _publish(registry, 1, time.time() + 3600)
        registry.index.delete_range(b"wake/", b"wake0")  # as a newer generation's write does
        assert _sleepers(registry, time.time() + 7200) == []
        assert registry.index.list(prefix=b"due/") == []


async def test_a_wake_index_without_due_entries_is_completed_at_start(wait_for: WaitFor) -> None:
    """An index written by a pagekv that kept no due entries still wakes its actors on time."""
    store = MemoryStore()
    async with Registry([_ticker()], kv=store).run() as client:
        await client.get_or_create("ticker", "k").arm(0.8)
    index = store.namespace("pagekv-registry")
    index.delete([key for key, _ in index.list(prefix=b"due/")])
    registry = Registry([_ticker()], kv=store)
    async with registry.run() as client:
        await wait_for(lambda: bool(registry.live()), what="the schedule waking the actor")
        await wait_for(
            lambda: registry.live() and registry.live()[0].ctx.state["ticks"] == ["once"],
            what="the tick",
        )
        assert await client.get("ticker", "k").ticks() == ["once"]


async def test_schedules_survive_a_restart_of_the_whole_process(tmp_path: Path) -> None:
    store = tmp_path / "kv"
    program = textwrap.dedent(
        f"""
        import anyio, sys
        from pagekv.actor import Registry, actor
        a = actor("ticker", state={{"ticks": []}}, sleep_timeout=0.2)
        @a.action
        async def arm(ctx, delay): return await ctx.schedule.after(delay, "tick", "late")
        @a.action
        async def tick(ctx, label): ctx.state["ticks"].append(label)
        @a.action
        async def ticks(ctx): return ctx.state["ticks"]
        async def main():
            async with Registry([a], kv="file://{store}").run() as client:
                if sys.argv[1] == "arm":
                    await client.get_or_create("ticker", "k").arm(1.0)
                else:
                    for _ in range(100):
                        await anyio.sleep(0.1)
                        if {{"ticker/k"}} & {{i.actor_id for i in client.registry.live()}}:
                            break
                    await anyio.sleep(0.3)
                    print(await client.get("ticker", "k").ticks())
        anyio.run(main)
        """
    )
    armed = subprocess.run([sys.executable, "-c", program, "arm"], capture_output=True, text=True)
    assert armed.returncode == 0, armed.stderr
    woken = subprocess.run(
        [sys.executable, "-c", program, "wait"], capture_output=True, text=True, timeout=60
    )
    assert woken.returncode == 0, woken.stderr
    assert woken.stdout.strip() == "['late']"


def _mailbox() -> Any:
    a = actor("mailbox", state={"seen": []}, sleep_timeout=30)

    @a.action
    async def take(ctx: ActorContext, complete: bool) -> Any:
        message = await ctx.queue.next(["jobs"], timeout=0, completable=True)
        if message is None:
            return None
        ctx.state["seen"].append(message.body)
        if complete:
            await message.complete()
        return message.body

    @a.action
    async def size(ctx: ActorContext) -> int:
        return await ctx.queue.size()

    return a


async def test_completable_messages_are_redelivered_after_a_crash_until_completed() -> None:
    store = MemoryStore()
    a = _mailbox()
    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("mailbox", "k")
        for n in range(3):
            await handle.send("jobs", {"n": n})
        assert await handle.take(False) == {"n": 0}
    # The first registry is gone without completing message 0: a crash, as far as it knows.
    async with Registry([a], kv=store).run() as client:
        handle = client.get("mailbox", "k")
        assert await handle.take(True) == {"n": 0}, "an uncompleted message is delivered again"
        assert await handle.take(True) == {"n": 1}
        assert await handle.take(True) == {"n": 2}
        assert await handle.take(True) is None
        assert await handle.size() == 0


async def test_a_message_wakes_a_sleeping_actor_whose_run_handler_waits(wait_for: WaitFor) -> None:
    a = actor("worker", state={"done": []}, sleep_timeout=0.2)

    @a.run
    async def run(ctx: ActorContext) -> None:
        while True:
            message = await ctx.queue.next(["work"])
            assert message is not None
            ctx.state["done"].append(message.body)
            await ctx.db.save_state()

    @a.action
    async def done(ctx: ActorContext) -> list[Any]:
        return ctx.state["done"]

    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("worker", "k")
        assert await handle.done() == []
        await wait_for(lambda: not registry.live(), what="sleep while the run handler waits")
        await handle.send("work", "job-1")
        await wait_for(
            lambda: bool(registry.live()) and registry.live()[0].ctx.state["done"] == ["job-1"],
            what="the woken run handler to take the message",
        )


async def test_queue_and_schedule_limits_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagekv.actor.queue as queue
    import pagekv.actor.schedule as schedule

    monkeypatch.setattr(queue, "MAX_MESSAGES", 3)
    monkeypatch.setattr(schedule, "MAX_SCHEDULES", 2)
    a = _ticker(sleep_timeout=30)

    @a.action
    async def enqueue(ctx: ActorContext, body: Any) -> int:
        return await ctx.queue.send("q", body)

    outcomes: list[Any] = []
    async with Registry([a], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("ticker", "k")
        for n in range(3):
            await handle.enqueue(n)
        for call in (
            handle.enqueue(99),
            handle.enqueue(b"x" * (MAX_MESSAGE_BYTES + 1)),
        ):
            try:
                await call
            except Exception as e:
                outcomes.append(e)
        await handle.arm(100)
        await handle.arm(100)
        try:
            await handle.arm(100)
        except Exception as e:
            outcomes.append(e)
        await anyio.sleep(0)
    full, too_large, too_many = outcomes
    assert isinstance(full, QueueFull) and "limit 3" in str(full)
    assert isinstance(too_large, MessageTooLarge) and str(MAX_MESSAGE_BYTES) in str(too_large)
    assert isinstance(too_many, TooManySchedules) and "limit 2" in str(too_many)


async def test_a_refused_message_wakes_and_creates_nothing(
    attempt: Attempt, stored_actors: StoredActors
) -> None:
    """A bad queue name or an oversized body is refused before the actor is woken: sending it
    to an actor that does not exist leaves no namespace and no registry entry behind."""
    a = actor("mailbox", state={})

    @a.workflow
    async def _wait(wf: Any) -> None:
        await wf.queue.next("wait")

    bad = [
        ("", 1, InvalidQueueName, "1 to 256 bytes, got 0 bytes"),
        ("q" * (MAX_QUEUE_NAME_BYTES + 1), 1, InvalidQueueName, "got 257 bytes"),
        (7, 1, InvalidQueueName, "must be a string, got int"),
        ("\ud800", 1, InvalidQueueName, "not UTF-8 text"),
        ("q", b"x" * MAX_MESSAGE_BYTES, MessageTooLarge, f"limit of {MAX_MESSAGE_BYTES}"),
    ]
    store = MemoryStore()
    outcomes: list[Any] = []
    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("mailbox", "k")
        for send in (handle.send, handle.workflow.send):
            outcomes += [await attempt(send(queue, body)) for queue, body, _, _ in bad]
    for outcome, (_, _, kind, message) in zip(outcomes, bad * 2, strict=True):
        assert isinstance(outcome, kind) and message in str(outcome), outcome
    assert stored_actors(store) == ([], [])


async def test_a_schedule_whose_call_cannot_bind_is_refused_when_made(
    attempt: Attempt, stored_actors: StoredActors
) -> None:
    """Its arguments are bound to the action when scheduled, not when due: a refused schedule
    stores no row and no wake time."""
    a = _ticker(sleep_timeout=30)

    @a.action
    async def arm_with(ctx: ActorContext, action: str, args: list[Any]) -> str:
        return await ctx.schedule.after(100, action, *args)

    store = MemoryStore()
    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("ticker", "k")
        outcomes = [
            await attempt(handle.arm_with("tick", [])),
            await attempt(handle.arm_with("tick", ["a", "b"])),
            await attempt(handle.arm_with("tock", [])),
        ]
        pending = await handle.pending()
        _, entries = stored_actors(store)
    missing, too_many, unknown = outcomes
    assert isinstance(missing, InvalidArguments) and "missing a required argument" in str(missing)
    assert isinstance(too_many, InvalidArguments) and "too many positional" in str(too_many)
    assert isinstance(unknown, ActionNotFound) and "no action 'tock'" in str(unknown)
    assert pending == []
    assert [e for e in entries if e.startswith(b"due/")] == []


async def test_registry_metrics_count_the_lifecycle(wait_for: WaitFor) -> None:
    store = MemoryStore()
    a = _ticker()
    registry = Registry([a], kv=store)
    async with registry.run() as client, Registry([a], kv=store).run() as other:
        await client.get_or_create("ticker", "k").ticks()
        await wait_for(lambda: not registry.live(), what="idle sleep")
        await client.get("ticker", "k").ticks()
        await other.get("ticker", "k").ticks()
        # meets the stale instance: refused by the fence, then run on a fresh one (a wake)
        armed = await client.get("ticker", "k").arm(100)
        await client.get_or_create("ticker", "gone").ticks()
        await client.destroy("ticker", "gone")
        metrics = registry.metrics()
    assert isinstance(armed, str)
    assert metrics["wakes"] == 4 and metrics["sleeps"] == 1 and metrics["destroys"] == 1
    assert metrics["takeovers"] == 1 and metrics["crashes"] == 1
    assert metrics["actions"] == 5 and metrics["internal.open_database_ms_total"] > 0
    assert metrics["live"] == 1, "the fresh instance of k"


class _Held:
    """The actor `held`: `arm` schedules `work`, which records the generation that runs it in
    `started`, waits for `release`, then records it in `finished`; `hold` only waits."""

    def __init__(self, sleep_timeout: float = 30) -> None:
        self.started: list[int] = []
        self.finished: list[int] = []
        self.release = anyio.Event()
        a = actor("held", state=None, sleep_timeout=sleep_timeout)

        @a.action
        async def arm(ctx: ActorContext, delay: float) -> str:
            return await ctx.schedule.after(delay, "work")

        @a.action
        async def work(ctx: ActorContext) -> None:
            self.started.append(ctx.db.database.generation)
            await self.release.wait()
            self.finished.append(ctx.db.database.generation)

        @a.action
        async def hold(ctx: ActorContext) -> None:
            await self.release.wait()

        @a.action
        async def pending(ctx: ActorContext) -> int:
            return len(await ctx.schedule.list())

        self.definition = a


def _count_polls(registry: Registry, polls: int = 2) -> Callable[[], bool]:
    """Count `registry`'s wake polls; the predicate returned holds once `polls` more polls
    ended and no wake they started is still under way (so whole polls read the index after this
    call, and whatever they decided is done)."""
    ended = waking = 0
    poll, wake = registry.housekeeping.due_sleepers, registry.housekeeping.wake

    async def counted_poll(now: float) -> list[Sleeper]:
        nonlocal ended
        try:
            return await poll(now)
        finally:
            ended += 1

    async def counted_wake(name: str, key: str) -> None:
        nonlocal waking
        waking += 1
        try:
            await wake(name, key)
        finally:
            waking -= 1

    registry.housekeeping.due_sleepers = counted_poll  # type: ignore[method-assign]
    registry.housekeeping.wake = counted_wake  # type: ignore[method-assign]
    return lambda: ended >= polls and waking == 0


async def test_a_due_schedule_runs_once_while_its_owner_runs_it(
    wait_for: WaitFor, attempt: Attempt
) -> None:
    """Registry one owns the actor and runs its due schedule; registry two polls the shared
    wake index meanwhile. Two must not wake (take over) the actor: it would run the schedule a
    second time, since one settles it only when the action returns."""
    held = _Held()
    store = MemoryStore()
    owner, other = Registry([held.definition], kv=store), Registry([held.definition], kv=store)
    async with owner.run() as client, other.run():
        handle = client.get_or_create("held", "k")
        await handle.arm(0.2)
        await wait_for(lambda: bool(held.started), what="the owner running the due schedule")
        await wait_for(_count_polls(other), what="two polls of the other registry")
        woken_elsewhere = [i.actor_id for i in other.live()]
        held.release.set()
        await wait_for(lambda: bool(held.finished), what="the scheduled action to return")
        pending = await attempt(handle.pending())
        takeovers = owner.counters["takeovers"]
    assert woken_elsewhere == [], "the other registry took the actor over from its live owner"
    assert held.started == held.finished and len(held.started) == 1, held.started
    assert pending == 0 and takeovers == 0


async def test_the_owner_renews_its_lease_while_a_schedule_runs_long(
    wait_for: WaitFor, attempt: Attempt
) -> None:
    """The scheduled action outlasts the wake lease several times over; the owner's
    housekeeping renews the lease meanwhile, so the other registry never finds it due."""
    held = _Held()
    store = MemoryStore()
    owner = Registry([held.definition], kv=store, lease=1.0)
    other = Registry([held.definition], kv=store, lease=1.0)
    async with owner.run() as client, other.run():
        await client.get_or_create("held", "k").arm(0.1)
        await wait_for(lambda: bool(held.started), what="the owner running the due schedule")
        await wait_for(_count_polls(other, polls=6), what="3 s of polls by the other registry")
        woken_elsewhere = [i.actor_id for i in other.live()]
        held.release.set()
        await wait_for(lambda: bool(held.finished), what="the scheduled action to return")
        pending = await attempt(client.get("held", "k").pending())
    assert woken_elsewhere == [] and held.started == held.finished == [1]
    assert pending == 0


async def test_an_actor_woken_for_its_schedule_is_left_alone_while_it_starts(
    wait_for: WaitFor, attempt: Attempt
) -> None:
    """Registry two wakes the sleeping actor for its due schedule and its `on_wake` hook takes
    a while; registry three polls meanwhile. The woken instance's lease is in the wake index
    before any hook runs, so three does not take the actor over from it."""
    held = _Held()
    waking = anyio.Event()

    @held.definition.on_wake
    async def slow_wake(ctx: ActorContext) -> None:
        if ctx.db.database.generation == 2:  # the wake by the second registry, only
            waking.set()
            await held.release.wait()

    store = MemoryStore()
    async with Registry([held.definition], kv=store).run() as creator:
        await creator.get_or_create("held", "k").arm(0.1)
    actor_kv = store.namespace(actor_id("held", "k"))
    woken_by, other = Registry([held.definition], kv=store), Registry([held.definition], kv=store)
    async with woken_by.run() as client:
        await wait_for(waking.is_set, what="the schedule waking the actor")
        generation = actor_kv.generation()
        polled = _count_polls(other)
        async with other.run():
            await wait_for(polled, what="two polls of the other registry")
            taken_over = actor_kv.generation() != generation
            held.release.set()
            await wait_for(lambda: bool(held.finished), what="the scheduled action to return")
        pending = await attempt(client.get("held", "k").pending())
    assert not taken_over, "the other registry took the actor over while it started"
    assert held.started == held.finished == [generation] and pending == 0


async def test_a_stale_instance_going_to_sleep_does_not_wake_the_actor_from_its_owner(
    wait_for: WaitFor, attempt: Attempt
) -> None:
    """Registry one's instance was taken over by registry two without knowing it; when it goes
    to sleep it writes its (stale) generation's wake time. Only the newest generation's entry
    decides a wake, so one's polls leave the actor with two, which runs the schedule once."""
    held = _Held(sleep_timeout=0.2)
    store = MemoryStore()
    stale = Registry([held.definition], kv=store)
    owner = Registry([held.definition], kv=store)

    def second_dispatching() -> bool:
        return any(instance.schedules.dispatching for instance in owner.live())

    async with stale.run() as first, owner.run() as second:
        await first.get_or_create("held", "k").arm(1.5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(second.get("held", "k").hold)  # takes the actor over, stays awake
            await wait_for(lambda: not stale.live(), what="the stale instance to sleep")
            wakes = [key for key, _ in store.namespace(REGISTRY_NAMESPACE).list(prefix=b"wake/")]
            await wait_for(lambda: bool(held.started), what="the owner running the schedule")
            await wait_for(_count_polls(stale), what="two polls of the stale registry")
            woken_elsewhere = [i.actor_id for i in stale.live()]
            held.release.set()
        await wait_for(lambda: bool(held.finished), what="the scheduled action to return")
        await wait_for(lambda: not second_dispatching(), what="its dispatch to settle it")
        pending = await attempt(second.get("held", "k").pending())
        left = [key for key, _ in store.namespace(REGISTRY_NAMESPACE).list(prefix=b"wake/")]
    assert len(wakes) == 2, "the stale instance wrote its generation's wake time at sleep"
    assert woken_elsewhere == [] and held.started == held.finished == [2]
    assert pending == 0 and left == wakes[1:], "the poll deleted the stale generation's entry"


async def test_a_schedule_cut_short_by_a_killed_owner_runs_again_elsewhere(
    tmp_path: Path, wait_for: WaitFor
) -> None:
    """At least once across crashes: the owner is SIGKILLed inside the scheduled action, so
    its lease is never renewed nor given up; once it runs out, another registry wakes the
    actor and runs the schedule again."""
    store, runs = tmp_path / "kv", tmp_path / "runs"
    program = textwrap.dedent(
        f"""
        import anyio
        from pagekv.actor import Registry, actor
        a = actor("held", state=None, sleep_timeout=30)
        @a.action
        async def arm(ctx, delay): return await ctx.schedule.after(delay, "work")
        @a.action
        async def work(ctx):
            with open({str(runs)!r}, "a") as f:
                f.write("started\\n")
            await anyio.sleep_forever()
        async def main():
            async with Registry([a], kv="file://{store}", lease=1.0).run() as client:
                await client.get_or_create("held", "k").arm(0.1)
                await anyio.sleep_forever()
        anyio.run(main)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", program])
    try:
        await wait_for(
            lambda: runs.exists() and runs.read_text() == "started\n",
            what="the owner running the scheduled action",
            timeout=30,
        )
    finally:
        owner.kill()
        owner.wait()
    held = _Held()
    held.release.set()
    registry = Registry([held.definition], kv=f"file://{store}")
    async with registry.run() as client:
        await wait_for(lambda: bool(held.finished), what="the schedule to run again")
        pending = await client.get("held", "k").pending()
    assert runs.read_text() == "started\n" and held.finished == [2] and pending == 0


def _canceller(sleep_timeout: float) -> Any:
    fired: list[str] = []
    a = actor("canceller", state={}, sleep_timeout=sleep_timeout)

    @a.action
    async def plan(ctx: ActorContext, first: float, second: float) -> list[str]:
        return [
            await ctx.schedule.after(first, "ring", "first"),
            await ctx.schedule.after(second, "ring", "second"),
        ]

    @a.action
    async def ring(ctx: ActorContext, what: str) -> None:
        fired.append(what)
        if what == "first" and ctx.state.get("victim"):
            assert await ctx.schedule.cancel(ctx.state["victim"])

    @a.action
    async def cancel_then_fail(ctx: ActorContext, event_id: str) -> None:
        async with ctx.db.transaction():
            assert await ctx.schedule.cancel(event_id)
            raise RuntimeError("rolled back")

    @a.action
    async def mark(ctx: ActorContext, event_id: str) -> None:
        ctx.state["victim"] = event_id

    return a, fired


@pytest.mark.parametrize("sleep_timeout", [30.0, 0.05], ids=["awake", "asleep"])
async def test_a_cancel_rolled_back_with_its_transaction_keeps_the_schedule_firing(
    sleep_timeout: float,
) -> None:
    """The wake time was recomputed inside the transaction, without the cancelled event, and
    never again after the rollback: the event stayed listed and never fired."""
    definition, fired = _canceller(sleep_timeout)
    async with Registry([definition], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("canceller", "k")
        first, _ = await handle.plan(0.6, 3600)
        with pytest.raises(RuntimeError, match="rolled back"):
            await handle.cancel_then_fail(first)
        with anyio.fail_after(10):
            while "first" not in fired:
                await anyio.sleep(0.05)
    assert fired == ["first"]


async def test_an_event_cancelled_by_an_earlier_one_of_the_same_round_does_not_run() -> None:
    definition, fired = _canceller(30.0)
    async with Registry([definition], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("canceller", "k")
        _, second = await handle.plan(0.3, 0.301)
        await handle.mark(second)
        await anyio.sleep(1.5)
    assert fired == ["first"]


async def test_idle_sleep_never_loses_a_message_the_run_handler_received() -> None:
    """A run handler loops on `ctx.queue.next()` (not completable) and the actor goes to sleep
    between messages. The sleep was decided while the handler waited, the message arrived and
    was taken (deleted) meanwhile, and the sleep's cancellation then ended the handler before
    it kept it: 4 to 8 of 60 acknowledged messages vanished (a store with 10 ms round trips
    widens the window). The runtime's own decision to sleep must never lose a message."""
    mailbox = actor("mailbox", state={"got": []}, sleep_timeout=0.06)

    @mailbox.run
    async def run(ctx: ActorContext) -> None:
        while True:
            message = await ctx.queue.next(["in"])
            async with ctx.db.transaction():
                ctx.state["got"].append(message.body)

    @mailbox.action
    async def got(ctx: ActorContext) -> list[int]:
        return ctx.state["got"]

    rng = random.Random(2)
    registry = Registry([mailbox], kv=MemoryStore(latency_ms=10))
    async with registry.run() as client:
        handle = client.get_or_create("mailbox", "k")
        for n in range(60):
            await handle.send("in", n)
            await anyio.sleep(rng.uniform(0.04, 0.12))
        with anyio.fail_after(10):
            while len(received := await handle.got()) < 60:
                await anyio.sleep(0.1)
        sleeps = registry.counters["sleeps"]
    assert received == list(range(60))
    assert sleeps >= 10, f"the actor slept only {sleeps} times between messages"
