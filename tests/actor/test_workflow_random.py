"""Random workflow programs (steps, flaky steps, sleeps, loops with pruning, joins) run once
cleanly, then again with one KV write failing at a random point: the instance dies, a fresh one
replays, and the outcome must equal the clean run's, with every step's row and state change
applied exactly once."""

from __future__ import annotations

import random
from typing import Any

import pytest
from flows import durably, settle

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.registry import REGISTRY_NAMESPACE
from pagekv.actor.workflow import StepContext, WorkflowContext, WorkflowState
from pagekv.kv import FaultKind, FaultyStore, MemoryStore

pytestmark = pytest.mark.anyio
Op = tuple[Any, ...]


def program(rng: random.Random, depth: int = 0) -> list[Op]:
    ops: list[Op] = []
    for i in range(rng.randint(2, 5 if depth else 7)):
        label = f"op{i}"
        kind = rng.choice(
            ["step", "step", "flaky", "sleep"] + (["loop", "join"] if depth < 2 else [])
        )
        if kind == "loop":
            ops.append(("loop", label, rng.randint(1, 4), program(rng, depth + 1)))
        elif kind == "join":
            ops.append(("join", label, program(rng, depth + 1), program(rng, depth + 1)))
        else:
            ops.append((kind, label))
    return ops


def steps_in(ops: list[Op]) -> int:
    total = 0
    for op in ops:
        if op[0] in ("step", "flaky"):
            total += 1
        elif op[0] == "loop":
            total += op[2] * steps_in(op[3])
        elif op[0] == "join":
            total += steps_in(op[2]) + steps_in(op[3])
    return total


def write_step(path: str, *, flaky: bool):
    async def fn(step: StepContext) -> str:
        await step.db.execute("INSERT INTO log VALUES (?)", (path,))
        step.state["count"] += 1
        if flaky and step.attempt == 1:
            raise RuntimeError("first attempt fails")
        return path

    return fn


async def interpret(wf: WorkflowContext, ops: list[Op], path: str) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        kind, label = op[0], op[1]
        where = f"{path}/{label}"
        if kind in ("step", "flaky"):
            out.append(await wf.step(label, write_step(where, flaky=kind == "flaky"), backoff=0))
        elif kind == "sleep":
            await wf.sleep(label, 0.001)
        elif kind == "loop":
            async for it in wf.loop(label, state=0, history_size=2, prune_every=1):
                await interpret(it, op[3], f"{where}/{it.index}")
                it.state += 1
                if it.index == op[2] - 1:
                    out.append(it.state)
                    break
        else:
            branches = {
                "a": lambda w, body=op[2], p=f"{where}/a": interpret(w, body, p),
                "b": lambda w, body=op[3], p=f"{where}/b": interpret(w, body, p),
            }
            out.append(await wf.join(label, branches))
    return out


def flow_actor(ops: list[Op]):
    a = actor("random", state={"count": 0})

    @a.on_migrate
    async def schema(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS log(path TEXT)")

    @a.workflow
    async def run(wf: WorkflowContext) -> Any:
        await wf.queue.next("start")
        return await interpret(wf, ops, "")

    @a.action
    async def view(ctx: ActorContext) -> Any:
        rows = await ctx.db.execute("SELECT path FROM log")
        return ctx.state["count"], sorted(r[0] for r in rows)

    return a


async def _run(ops: list[Op], fault: tuple[FaultKind, int] | None) -> tuple[int, Any, Any]:
    """Run the program once; `fault` fails the n-th KV write counted from the start message's."""
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    async with Registry([flow_actor(ops)], kv=store).run() as client:
        handle = client.get_or_create("random", "k")
        await durably(handle, WorkflowState.SLEEPING)
        counting, faulty = store.counting["random/k"], store.faulty["random/k"]
        counting.reset()
        if fault is not None:
            faulty.arm(fault[0], after=fault[1])
        await handle.send("start", None)
        status = await settle(handle, WorkflowState.COMPLETED, WorkflowState.FAILED, timeout=30)
        assert status.state is WorkflowState.COMPLETED, status.error
        writes = counting.stats.writes
        view = await handle.view()
        if fault is not None:
            assert faulty.fired_count(fault[0]) == 1, "the injected fault fired"
    return writes, status.output, view


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_workflows_replay_to_the_same_outcome_after_a_fault(seed: int) -> None:
    rng = random.Random(seed)
    ops = program(rng)
    writes, clean, (count, rows) = await _run(ops, None)
    assert count == len(rows) == steps_in(ops)
    assert len(set(rows)) == len(rows)
    for kind in (FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE):
        # 0 is the send; the last writes of a clean run may not all happen after a replay
        for at in rng.sample(range(1, max(2, writes * 3 // 4)), k=min(3, writes * 3 // 4 - 1)):
            _, output, view = await _run(ops, (kind, at))
            assert output == clean, (kind, at)
            assert view == (count, rows), f"{kind} at write {at}: exactly once, {view}"
