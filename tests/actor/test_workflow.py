"""Durable workflows: every primitive's recording and replay, waits that let the actor sleep,
divergence checks, rollback, the handle (state, cancel, replay), and the inspector data."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from flows import TERMINAL, durably, settle

from pagekv.actor import ActorContext, ActorError, Registry, actor
from pagekv.actor.workflow import (
    Critical,
    StepContext,
    StepContextClosed,
    StepExhausted,
    StepResult,
    WorkflowContext,
    WorkflowState,
    WorkflowStatus,
)
from pagekv.actor.workflow.history import History
from pagekv.actor.workflow.payloads import Kind, StepPending
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio
Flow = Callable[[WorkflowContext], Awaitable[Any]]


def flow_actor(fn: Flow, *, sleep_timeout: float = 30.0, state: Any = None):
    """An actor `wf` whose workflow is `fn`, with a `poke` action to wake it and `view`."""
    a = actor("wf", state=state if state is not None else {"n": 0}, sleep_timeout=sleep_timeout)
    a.workflow(fn)

    @a.action
    async def view(ctx: ActorContext) -> Any:
        return ctx.state

    @a.action
    async def rows(ctx: ActorContext) -> list[Any]:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS log(v)")
        return [r[0] for r in await ctx.db.execute("SELECT v FROM log ORDER BY rowid")]

    return a


def counting(calls: Counter[str], name: str, result: Any = None):
    async def fn(step: StepContext) -> Any:
        calls[name] += 1
        return result if result is not None else name

    return fn


async def test_steps_run_once_and_replay_their_recorded_results() -> None:
    calls: Counter[str] = Counter()

    async def flow(wf: WorkflowContext) -> Any:
        a = await wf.step("a", counting(calls, "a", {"x": 1}))
        await wf.sleep("pause", 0.3)
        b = await wf.step("b", counting(calls, "b"))
        return [a, b]

    registry = Registry([flow_actor(flow, sleep_timeout=0.1)], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.view()
        with anyio.fail_after(5):
            while registry.live():
                await anyio.sleep(0.02)
        slept_at = time.time()
        with anyio.fail_after(5):
            while not registry.live():
                await anyio.sleep(0.02)
        woke_at = time.time()
        status = await settle(handle)
    assert status == WorkflowStatus(WorkflowState.COMPLETED, [{"x": 1}, "b"], None)
    assert calls == {"a": 1, "b": 1}, "a replayed from history after the wake, not re-run"
    assert woke_at - slept_at < 1.5, "the sleep's deadline woke the sleeping actor on time"


async def test_a_step_commits_state_sql_and_result_together_or_not_at_all() -> None:
    attempts: list[int] = []

    async def write(step: StepContext) -> int:
        attempts.append(step.attempt)
        await step.db.execute("CREATE TABLE IF NOT EXISTS log(v)")
        await step.db.execute("INSERT INTO log VALUES (?)", (step.attempt,))
        step.state["n"] += 10
        if step.attempt == 1:
            raise RuntimeError("flaky")
        return step.state["n"]

    async def flow(wf: WorkflowContext) -> Any:
        return await wf.step("write", write, backoff=0.01)

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        history = await handle.workflow.history()
        assert await handle.view() == {"n": 10}
        assert await handle.rows() == [2], "the failed attempt's row was rolled back"
    assert attempts == [1, 2]
    assert status.output == 10
    (entry,) = history["entries"]
    assert (entry["status"], entry["attempts"], entry["error"]) == ("completed", 2, None)


async def test_retries_back_off_deterministically_then_exhaust() -> None:
    starts: list[float] = []
    failures: list[float] = []

    async def failing(step: StepContext) -> None:
        starts.append(time.time())
        await anyio.sleep(0.03)
        failures.append(time.time())
        raise ValueError(f"attempt {step.attempt}")

    async def flow(wf: WorkflowContext) -> Any:
        result = await wf.try_step("flaky", failing, max_retries=2, backoff=0.1)
        assert isinstance(result, StepResult)
        try:
            await wf.step("again", failing, max_retries=0)
        except StepExhausted as e:
            return [
                result.ok,
                result.failure and result.failure.kind,
                result.failure.attempts,
                e.attempts,
            ]
        return None

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        history = await handle.workflow.history()
    assert status.output == [False, "exhausted", 3, 1]
    waits = [start - failed for failed, start in zip(failures[:2], starts[1:3], strict=True)]
    assert waits[0] >= 0.1 and waits[1] >= 0.2, f"0.1 * 2**(attempt-1) after a failure: {waits}"
    flaky = history["entries"][0]
    assert (flaky["status"], flaky["attempts"]) == ("exhausted", 3)
    assert flaky["error"] == "ValueError: attempt 3"


async def test_critical_errors_and_timeouts_fail_a_step_without_retries() -> None:
    started: Counter[str] = Counter()

    async def critical(step: StepContext) -> None:
        started["critical"] += 1
        raise Critical("card declined")

    async def slow(step: StepContext) -> None:
        started["slow"] += 1
        await step.db.execute("CREATE TABLE IF NOT EXISTS log(v)")
        await step.db.execute("INSERT INTO log VALUES ('slow')")
        await anyio.sleep(5)

    async def unencodable(step: StepContext) -> object:
        return object()

    async def flow(wf: WorkflowContext) -> Any:
        a = await wf.try_step("critical", critical)
        b = await wf.try_step("slow", slow, timeout=0.1)
        c = await wf.try_step("unencodable", unencodable)
        return [(r.failure.kind, r.failure.attempts) for r in (a, b, c) if r.failure]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        assert await handle.rows() == [], "the timed-out step's write was rolled back"
    assert status.output == [("critical", 1), ("timeout", 1), ("critical", 1)]
    assert started == {"critical": 1, "slow": 1}


async def test_a_step_context_is_dead_once_its_step_settled() -> None:
    kept: list[StepContext] = []

    async def keep(step: StepContext) -> int:
        kept.append(step)
        return 1

    async def flow(wf: WorkflowContext) -> Any:
        await wf.step("keep", keep)
        try:
            kept[0].state["n"] = 99
        except StepContextClosed as e:
            return str(e)
        return "allowed"

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        assert await handle.view() == {"n": 0}
    assert "only valid while that step runs" in status.output


async def test_a_long_loop_keeps_its_history_bounded_and_resumes_its_state() -> None:
    iterations = 10_000

    async def flow(wf: WorkflowContext) -> Any:
        total = None
        async for it in wf.loop("count", state=0, history_size=5, prune_every=10):
            if it.index % 1000 == 999:
                await it.step("mark", counting(Counter(), "mark", it.index))
            it.state = it.state + it.index
            if it.index == iterations - 1:
                total = it.state
                break
        await wf.sleep("after", 0.01)
        return total

    registry = Registry([flow_actor(flow)], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle, timeout=60)
        history = await handle.workflow.history()
    assert status.output == sum(range(iterations))
    loop = next(e for e in history["entries"] if e["kind"] == "loop")
    assert loop["status"] == "completed" and loop["data"]["iteration"] == iterations - 1
    locations = [e["location"] for e in history["entries"]]
    assert locations == ["count", "count/~9999/mark", "after"], "old iterations were pruned"


async def test_a_loop_resumes_from_its_recorded_iteration_after_a_wake() -> None:
    ran: list[int] = []

    async def flow(wf: WorkflowContext) -> Any:
        async for it in wf.loop("poll", state=[]):

            async def visit(step: StepContext, i: int = it.index) -> int:
                ran.append(i)
                return i

            await it.step("visit", visit)
            if it.index == 2:
                await it.sleep("nap", 0.3)
            it.state = [*it.state, it.index]
            if it.index == 4:
                final = it.state
                break
        return final

    registry = Registry([flow_actor(flow, sleep_timeout=0.05)], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.view()
        with anyio.fail_after(5):
            while registry.live():
                await anyio.sleep(0.01)
        status = await settle(handle)
    assert status.output == [0, 1, 2, 3, 4]
    assert ran == [0, 1, 2, 3, 4], "no iteration's step ran twice across the sleep"


async def test_messages_are_received_in_order_filtered_and_time_out() -> None:
    async def flow(wf: WorkflowContext) -> Any:
        first = await wf.queue.next("first", names=["orders"])
        batch = await wf.queue.next_batch("batch", count=5, names=["orders"], timeout=0.2)
        none = await wf.queue.next("none", names=["never"], timeout=0.1)
        return [first.body, [m.body for m in batch], none]

    a = flow_actor(flow)
    release = anyio.Event()

    @a.action
    async def hold(ctx: ActorContext) -> None:
        await release.wait()

    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        await settle(handle, WorkflowState.SLEEPING)
        await handle.send("other", "ignored")
        # An action in flight holds off the transaction that receives the first message, so
        # all three are queued when it commits and the batch finds two of them waiting,
        # however the sends and the workflow interleave.
        async with anyio.create_task_group() as tg:
            tg.start_soon(handle.hold)
            while not registry.live()[0].calls.active:
                await anyio.sleep(0.001)
            for n in range(3):
                await handle.workflow.send("orders", n)
            release.set()
        status = await settle(handle)
        history = await handle.workflow.history()
    assert status.output == [0, [1, 2], None]
    kinds = [(e["name"], e["status"]) for e in history["entries"]]
    assert kinds == [("first", "completed"), ("batch", "completed"), ("none", "completed")]


async def test_a_completable_message_stays_queued_until_completed() -> None:
    seen: list[Any] = []

    async def flow(wf: WorkflowContext) -> Any:
        message = await wf.queue.next("job", completable=True)
        seen.append(message.body)
        await wf.sleep("work", 0.2)
        await message.complete()
        return message.body

    a = flow_actor(flow)

    @a.action
    async def queued(ctx: ActorContext) -> int:
        return await ctx.queue.size()

    store = MemoryStore()
    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.send("job", "payload")
        await settle(handle, WorkflowState.SLEEPING)
        with anyio.fail_after(5):
            while not seen:
                await anyio.sleep(0.01)
        assert await handle.queued() == 1, "received but not completed: still queued"
    async with Registry([a], kv=store).run() as client:
        handle = client.get("wf", "k")
        status = await settle(handle)
        assert await handle.queued() == 0
    assert status.output == "payload"
    assert seen == ["payload", "payload"], "replayed from history after the restart"


async def test_join_runs_branches_concurrently_and_names_the_failed_ones() -> None:
    naps: list[str] = []

    async def napper(wf: WorkflowContext) -> str:
        naps.append("start")
        await wf.sleep("nap", 0.1)
        naps.append("end")
        return "rested"

    async def doomed(wf: WorkflowContext) -> str:
        await wf.step("boom", _raise(Critical("no")))
        return "unreachable"

    async def flow(wf: WorkflowContext) -> Any:
        both = await wf.join("pair", {"a": napper, "b": napper})
        try:
            await wf.join("mixed", {"ok": napper, "bad": doomed})
        except Exception as e:
            return [both, sorted(e.errors)]  # type: ignore[attr-defined]
        return None

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.output == [{"a": "rested", "b": "rested"}, ["bad"]]
    assert naps == ["start", "start", "end", "end", "start", "end"], "both naps of the pair overlap"


async def test_race_returns_the_first_winner_and_forgets_the_losers() -> None:
    async def fast(wf: WorkflowContext) -> str:
        return await wf.step("quick", counting(Counter(), "quick", "fast"))

    async def slow(wf: WorkflowContext) -> str:
        await wf.sleep("long", 30)
        return "slow"

    async def flow(wf: WorkflowContext) -> Any:
        result = await wf.race("pick", [slow, fast])
        return [result.winner, result.value]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        history = await handle.workflow.history()
    assert status.output == ["fast", "fast"]
    locations = [e["location"] for e in history["entries"]]
    assert "pick/fast/quick" in locations and not any("slow" in loc for loc in locations)


async def test_rollback_handlers_run_newest_first_after_a_failure() -> None:
    undone: list[str] = []

    def undo(label: str):
        async def handler(step: StepContext, output: Any) -> None:
            undone.append(f"{label}:{output}")
            step.state["n"] -= 1

        return handler

    async def bump(step: StepContext) -> int:
        step.state["n"] += 1
        return step.state["n"]

    async def flow(wf: WorkflowContext) -> Any:
        await wf.step("before", bump)
        await wf.rollback_checkpoint("checkpoint")
        await wf.step("reserve", bump, rollback=undo("reserve"))
        await wf.step("charge", bump, rollback=undo("charge"))
        await wf.step("ship", _raise(Critical("no truck")))

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        assert await handle.view() == {"n": 1}, "both handlers undid their step's state change"
        history = await handle.workflow.history()
    assert undone == ["charge:3", "reserve:2"]
    assert status.state is WorkflowState.FAILED and status.error["type"] == "StepCritical"
    rolled = {e["name"]: e["rollback_completed"] is not None for e in history["entries"]}
    assert rolled == {
        "before": False,
        "checkpoint": False,
        "reserve": True,
        "charge": True,
        "ship": False,
    }


async def test_a_rollback_handler_before_a_checkpoint_fails_the_workflow() -> None:
    async def flow(wf: WorkflowContext) -> Any:
        await wf.step("reserve", counting(Counter(), "r"), rollback=_raise(RuntimeError()))

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.state is WorkflowState.FAILED
    assert status.error["type"] == "RollbackCheckpointError"


async def test_divergent_code_is_refused_before_side_effects_and_removed_migrates() -> None:
    store = MemoryStore()
    calls: Counter[str] = Counter()

    async def v1(wf: WorkflowContext) -> Any:
        await wf.step("a", counting(calls, "a"))
        await wf.step("b", counting(calls, "b"))
        await wf.sleep("wait", 30)

    async def v2(wf: WorkflowContext) -> Any:
        await wf.step("a", counting(calls, "a"))
        await wf.step("c", counting(calls, "c"))
        await wf.sleep("wait", 30)

    async def v3(wf: WorkflowContext) -> Any:
        await wf.step("a", counting(calls, "a"))
        await wf.removed("b", "step")
        await wf.removed("wait", "sleep")
        await wf.step("c", counting(calls, "c"))
        return "migrated"

    async with Registry([flow_actor(v1)], kv=store).run() as client:
        await settle(client.get_or_create("wf", "k"), WorkflowState.SLEEPING)
    async with Registry([flow_actor(v2)], kv=store).run() as client:
        status = await settle(client.get("wf", "k"))
    assert status.state is WorkflowState.FAILED and status.error["type"] == "HistoryDiverged"
    assert "['b', 'wait']" in status.error["message"]
    assert calls == {"a": 1, "b": 1}, "c never ran: the divergence was caught first"
    async with Registry([flow_actor(v3)], kv=store).run() as client:
        status = await settle(client.get("wf", "k"), WorkflowState.COMPLETED)
    assert status.output == "migrated", "a diverged workflow is tried again with new code"
    assert status.error is None


async def test_a_different_kind_at_a_location_is_history_divergence() -> None:
    store = MemoryStore()

    async def v1(wf: WorkflowContext) -> Any:
        await wf.step("x", counting(Counter(), "x"))
        await wf.sleep("hold", 30)

    async def v2(wf: WorkflowContext) -> Any:
        await wf.sleep("x", 0)

    async with Registry([flow_actor(v1)], kv=store).run() as client:
        await settle(client.get_or_create("wf", "k"), WorkflowState.SLEEPING)
    async with Registry([flow_actor(v2)], kv=store).run() as client:
        status = await settle(client.get("wf", "k"))
    assert status.error["type"] == "HistoryDiverged"
    assert "runs sleep 'x' where the history recorded a step" in status.error["message"]


async def test_names_are_unique_per_scope_and_one_op_at_a_time() -> None:
    async def twice(wf: WorkflowContext) -> Any:
        await wf.step("same", counting(Counter(), "1"))
        await wf.step("same", counting(Counter(), "2"))

    async def concurrent(wf: WorkflowContext) -> Any:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wf.sleep, "one", 0.2)
            tg.start_soon(wf.sleep, "two", 0.2)

    for fn, error in ((twice, "HistoryDiverged"), (concurrent, "EntryInProgress")):
        async with Registry([flow_actor(fn)], kv=MemoryStore()).run() as client:
            status = await settle(client.get_or_create("wf", "k"))
        assert status.state is WorkflowState.FAILED
        assert error in (status.error["type"], status.error["message"]), status.error


async def test_get_version_keeps_old_runs_on_the_old_path() -> None:
    store = MemoryStore()

    async def v1(wf: WorkflowContext) -> Any:
        await wf.step("charge", counting(Counter(), "charge"))
        await wf.sleep("hold", 0.3)
        return "v1"

    async def v2(wf: WorkflowContext) -> Any:
        version = await wf.get_version("fraud-check", 2)
        if version >= 2:
            await wf.step("fraud", counting(Counter(), "fraud"))
        await wf.step("charge", counting(Counter(), "charge"))
        await wf.sleep("hold", 0.3)
        return f"v{version}"

    async with Registry([flow_actor(v1)], kv=store).run() as client:
        await settle(client.get_or_create("wf", "old"), WorkflowState.SLEEPING)
    async with Registry([flow_actor(v2)], kv=store).run() as client:
        old = await settle(client.get("wf", "old"))
        new = await settle(client.get_or_create("wf", "new"))
    assert (old.output, new.output) == ("v1", "v2")


async def test_replay_from_a_step_reruns_it_and_everything_after() -> None:
    calls: Counter[str] = Counter()

    async def flow(wf: WorkflowContext) -> Any:
        for name in ("a", "b", "c"):
            await wf.step(name, counting(calls, name))
        return dict(calls)

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        await settle(handle)
        await handle.workflow.replay("b")
        with anyio.fail_after(5):
            while calls["c"] < 2:
                await anyio.sleep(0.01)
        status = await settle(handle)
    assert calls == {"a": 1, "b": 2, "c": 2}
    assert status.output == {"a": 1, "b": 2, "c": 2}


async def test_cancel_stops_a_sleeping_workflow_for_good() -> None:
    store = MemoryStore()
    calls: Counter[str] = Counter()

    async def flow(wf: WorkflowContext) -> Any:
        await wf.sleep("long", 0.5)
        await wf.step("after", counting(calls, "after"))

    a = flow_actor(flow)

    @a.action
    async def schedules(ctx: ActorContext) -> int:
        return len(await ctx.schedule.list())

    async with Registry([a], kv=store).run() as client:
        handle = client.get_or_create("wf", "k")
        # The database, not only memory (which says SLEEPING before the commit): the wake's
        # schedule row commits with the recorded state.
        await durably(handle, WorkflowState.SLEEPING)
        assert await handle.schedules() == 1, "the sleep's deadline is a schedule row"
        await handle.workflow.cancel()
        assert await handle.schedules() == 0
        await anyio.sleep(0.8)
        status = await handle.workflow.status()
    async with Registry([a], kv=store).run() as client:
        await client.get("wf", "k").view()
        await anyio.sleep(0.2)
        again = await client.get("wf", "k").workflow.status()
    assert status.state is again.state is WorkflowState.CANCELLED
    assert calls["after"] == 0


async def test_a_workflow_never_runs_twice_concurrently() -> None:
    inside = 0
    peak = 0

    async def guarded(step: StepContext) -> None:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await anyio.sleep(0.01)
        inside -= 1

    async def flow(wf: WorkflowContext) -> Any:
        for i in range(20):
            await wf.step(f"s{i}", guarded)
            await wf.sleep(f"z{i}", 0.01)
        return "done"

    registry = Registry([flow_actor(flow)], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        with anyio.fail_after(20):
            while (await handle.workflow.status()).state not in TERMINAL:
                await handle.workflow.wake()
                instance = registry.live()[0]
                await instance.dispatch_due()
        status = await handle.workflow.status()
    assert status.output == "done" and peak == 1


async def test_actor_state_is_reachable_only_through_steps() -> None:
    async def flow(wf: WorkflowContext) -> Any:
        return [hasattr(wf, attr) for attr in ("state", "db", "kv", "vars", "schedule")]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.output == [False] * 5


def _raise(error: Exception):
    async def fn(*args: Any) -> None:
        raise error

    return fn


async def test_a_rollback_interrupted_by_a_restart_resumes_without_repeating_handlers() -> None:
    store = MemoryStore()
    undone: list[str] = []
    hold = anyio.Event()

    async def undo_charge(step: StepContext, output: Any) -> None:
        undone.append("charge")

    async def undo_reserve(step: StepContext, output: Any) -> None:
        undone.append("reserve")
        if not hold.is_set():
            hold.set()
            await anyio.sleep(30)

    async def flow(wf: WorkflowContext) -> Any:
        await wf.rollback_checkpoint("checkpoint")
        await wf.step("reserve", counting(Counter(), "reserve"), rollback=undo_reserve)
        await wf.step("charge", counting(Counter(), "charge"), rollback=undo_charge)
        await wf.step("ship", _raise(Critical("no truck")))

    async with Registry([flow_actor(flow)], kv=store).run() as client:
        handle = client.get_or_create("wf", "k")
        await settle(handle, WorkflowState.ROLLING_BACK)
        with anyio.fail_after(5):
            await hold.wait()
    async with Registry([flow_actor(flow)], kv=store).run() as client:
        status = await settle(client.get("wf", "k"), WorkflowState.FAILED)
    assert undone == ["charge", "reserve", "reserve"], "charge's undo was recorded, not repeated"
    assert status.error["type"] == "StepCritical"


async def test_workflow_deadlines_and_ordinary_schedules_do_not_overwrite_each_other() -> None:
    async def flow(wf: WorkflowContext) -> Any:
        await wf.sleep("long", 1.2)
        return time.time()

    a = flow_actor(flow, sleep_timeout=0.1)

    @a.action
    async def arm(ctx: ActorContext) -> None:
        await ctx.schedule.after(0.2, "tick")

    @a.action
    async def tick(ctx: ActorContext) -> None:
        ctx.state["n"] += 1

    def completed() -> bool:
        live = registry.live()
        runner = live[0].workflow if live else None
        done = runner is not None and runner.journal.history.state is WorkflowState.COMPLETED
        return done and live[0].ctx.state["n"] == 1

    registry = Registry([a], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        started = time.time()
        await handle.arm()
        with anyio.fail_after(10):
            while not completed():
                await anyio.sleep(0.01)
        wakes = registry.metrics()["wakes"]
        with anyio.fail_after(10):  # the history says completed just before it is committed
            while (status := await handle.workflow.status()).state is not WorkflowState.COMPLETED:
                await anyio.sleep(0.01)
        assert await handle.view() == {"n": 1}, "the ordinary schedule fired"
    assert status.output - started >= 1.15, "and the workflow's own deadline was kept"
    assert wakes >= 3, "both deadlines woke the sleeping actor (first wake, tick, workflow)"


async def test_the_workflow_of_an_actor_without_one_is_refused_before_the_wake(
    attempt, stored_actors
) -> None:
    """Asking a workflow-less actor for its workflow (status, send, wake, ...) is refused without
    creating the actor it addresses."""
    plain = actor("plain", state={})
    store = MemoryStore()
    async with Registry([plain], kv=store).run() as client:
        workflow = client.get_or_create("plain", "k").workflow
        outcomes = [
            await attempt(ask())
            for ask in (workflow.status, workflow.wake, lambda: workflow.send("q", 1))
        ]
    for outcome in outcomes:
        assert isinstance(outcome, ActorError), outcome
        assert str(outcome) == "actor 'plain' has no workflow"
    assert stored_actors(store) == ([], [])


async def test_loop_state_changed_in_place_counts_once_across_a_sleep() -> None:
    """`it.state["n"] += 1` changed the recorded state the iteration replays from (the record
    and the live state were one object): after a sleep and a wake in iteration 1 the increment
    ran twice, giving {'n': 4} and steps seeing [1, 2, 4]."""

    async def flow(wf: WorkflowContext) -> Any:
        async for it in wf.loop("count", state={"n": 0, "seen": []}):
            it.state["n"] += 1
            it.state["seen"].append(await it.step("see", lambda step, n=it.state["n"]: _value(n)))
            if it.index == 1:
                await it.sleep("nap", 0.3)  # the actor sleeps: the iteration replays
            if it.index == 2:
                return it.state
        raise AssertionError("unreachable")

    registry = Registry([flow_actor(flow, sleep_timeout=0.05)], kv=MemoryStore())
    async with registry.run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.view()
        status = await settle(handle)
    assert status.output == {"n": 3, "seen": [1, 2, 3]}, status
    assert registry.counters["sleeps"] >= 1, "the workflow never slept in between"


async def _value(n: int) -> int:
    return n


@pytest.mark.parametrize("operation", ["cancel", "replay"])
async def test_no_step_runs_after_cancel_returns_even_with_wakes_racing_it(operation: str) -> None:
    """A `wake()` between the run handler's stop and the recorded CANCELLED restarted it: the
    workflow was still running a second after `cancel()` returned (~90 steps ran). `replay()`
    had the same shape: a wake ran the old history while it was being rewound."""
    ran: list[int] = []

    async def flow(wf: WorkflowContext) -> Any:
        async for it in wf.loop("forever", state=0):

            async def tick(step: StepContext, i: int = it.index) -> int:
                ran.append(i)
                await anyio.sleep(0.002)
                return i

            await it.step("tick", tick)

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.workflow.wake()
        with anyio.fail_after(5):
            while len(ran) < 20:
                await anyio.sleep(0.01)
        done = anyio.Event()

        async def keep_waking() -> None:
            while not done.is_set():
                await handle.workflow.wake()
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_waking)
            if operation == "cancel":
                await handle.workflow.cancel()
            else:
                async with anyio.create_task_group() as inner:
                    inner.start_soon(handle.workflow.replay)
                    await anyio.sleep(0)
                await handle.workflow.cancel()
            stopped_at = len(ran)
            await anyio.sleep(0.5)
            done.set()
        status = await handle.workflow.status()
    assert status.state is WorkflowState.CANCELLED
    assert len(ran) == stopped_at, f"{len(ran) - stopped_at} steps ran after cancel() returned"


async def test_concurrent_join_branches_never_lose_each_others_history() -> None:
    """Branch a's commit took the pending history in its worker hop while branch b, woken from
    a sleep, registered a name and put entries; a's commit then cleared b's changes unwritten:
    rows named an index missing from the name table (`history()` raised KeyError), a restart
    met a spurious HistoryDiverged, and the state said b=1 instead of 2. A store with 20 ms
    round trips keeps a's commit in the worker long enough."""

    async def bump(key: str) -> Callable[[StepContext], Awaitable[int]]:
        async def step(ctx: StepContext) -> int:
            ctx.state[key] += 1
            return ctx.state[key]

        return step

    async def branch_a(wf: WorkflowContext) -> int:
        for i in range(20):
            await wf.step(f"a{i}", await bump("a"))
        return 20

    async def branch_b(wf: WorkflowContext) -> int:
        for i in range(8):
            await wf.sleep(f"nap{i}", 0.005)
            await wf.step(f"b{i}", await bump("b"))
        return 8

    async def flow(wf: WorkflowContext) -> Any:
        return await wf.join("both", {"a": branch_a, "b": branch_b})

    store = MemoryStore(latency_ms=20)
    definition = flow_actor(flow, state={"a": 0, "b": 0})
    async with Registry([definition], kv=store).run() as client:
        handle = client.get_or_create("wf", "k")
        status = await settle(handle)
        history = await handle.workflow.history()
        state = await handle.view()
    assert status.state is WorkflowState.COMPLETED, status
    assert status.output == {"a": 20, "b": 8} and state == {"a": 20, "b": 8}
    assert history is not None
    async with Registry([definition], kv=store).run() as client:  # a fresh replay of it all
        handle = client.get("wf", "k")
        await handle.workflow.replay()
        again = await settle(handle)
    assert again.state is WorkflowState.COMPLETED and again.output == {"a": 20, "b": 8}, again


def test_history_changes_made_while_a_commit_runs_stay_pending() -> None:
    """The invariant behind the join test above, exactly: a commit writes what was pending when
    its block ended; what another branch changes meanwhile stays pending for the next commit,
    and a failed commit's changes become pending again, ahead of newer ones."""
    history = History()
    history.name_index("a")
    history.put(history.new_entry("0", "a", Kind.STEP, StepPending()))
    first = history.take_pending([])
    history.name_index("b")  # another branch, while the first commit is in its worker hop
    history.put(history.new_entry("1", "b", Kind.STEP, StepPending()))
    history.committed(first)
    assert first.names == [(0, "a")] and first.puts == ["0"]
    assert history.dirty(), "the other branch's changes were dropped with the first commit"
    second = history.take_pending([])
    assert second.names == [(1, "b")] and second.puts == ["1"]
    history.name_index("c")
    history.not_committed(second)  # its commit failed: written by the next one, before "c"
    third = history.take_pending([])
    assert third.names == [(1, "b"), (2, "c")] and third.puts == ["1"]


@pytest.mark.parametrize("completable", [False, True], ids=["plain", "completable"])
async def test_a_message_received_by_a_race_loser_is_not_lost(completable: bool) -> None:
    """The losing branch had received the message (a plain receive deletes it from the queue)
    and the race then deleted the branch's history: the message was in neither place. Now it
    goes back to the queue; a completable one stops being held (it was held until a restart)."""

    async def loser(wf: WorkflowContext) -> None:
        await wf.queue.next("take", names=["jobs"], completable=completable)
        await wf.sleep("long", 60)

    async def winner(wf: WorkflowContext) -> str:
        await wf.sleep("short", 0.3)
        return "won"

    async def flow(wf: WorkflowContext) -> Any:
        raced = await wf.race("r", {"loser": loser, "winner": winner})
        later = await wf.queue.next("after", names=["jobs"], timeout=5)
        return [raced.winner, later.body if later is not None else None]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.send("jobs", "job-1")
        status = await settle(handle)
    assert status.output == ["winner", "job-1"], status


async def test_replay_of_a_step_inside_a_join_branch_runs_it_again() -> None:
    """`replay("j/A/s")` deleted the branch's entries but left the join recording branch A as
    settled: only the step after the join ran again, and A's entries were gone for good."""
    calls: Counter[str] = Counter()

    async def branch_a(wf: WorkflowContext) -> Any:
        return await wf.step("s", counting(calls, "s"))

    async def branch_b(wf: WorkflowContext) -> Any:
        return await wf.step("t", counting(calls, "t"))

    async def flow(wf: WorkflowContext) -> Any:
        both = await wf.join("j", {"A": branch_a, "B": branch_b})
        return [both, await wf.step("after", counting(calls, "after"))]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("wf", "k")
        await handle.view()
        first = await settle(handle)
        before = Counter(calls)
        await handle.workflow.replay("j/A/s")
        again = await settle(handle, WorkflowState.COMPLETED)
        history = await handle.workflow.history()
    assert first.output == again.output == [{"A": "s", "B": "t"}, "after"]
    assert calls["s"] == before["s"] + 1 and calls["after"] == before["after"] + 1, calls
    assert "j/A/s" in str(history), "the branch's step is recorded again"
