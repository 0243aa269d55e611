"""Workflow figures: steps per second of a 1,000-step workflow, and the replay time of a workflow
with 10,000 history entries.

    .venv/bin/python benchmarks/workflow_bench.py [--reps 5] [--steps 1000] [--history 10000]

Each case runs on memory:// and file:// (a temporary directory under the current one),
interleaved, and prints medians with min-max. For reference the same run measures the actor's
one-row state-changing commits without a workflow (`bump`, one commit per action, the floor a
step is built on). A step is one transaction: the step's own SQL and state plus its history row.
Replay: a registry restart, then the time from the first call to the moment the workflow code,
having replayed every recorded step, reaches its first new operation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.workflow import StepContext, WorkflowContext, WorkflowState
from pagekv.kv import KvStore, open_kv

_marks: dict[str, float] = {}


async def _bump(step: StepContext) -> int:
    step.state["n"] += 1
    return step.state["n"]


def _workflow_actor(steps: int) -> Any:
    a = actor("flow", state={"n": 0}, sleep_timeout=3600)

    @a.workflow
    async def run(wf: WorkflowContext) -> None:
        _marks["start"] = time.perf_counter()
        for i in range(steps):
            await wf.step(f"s{i}", _bump)
        _marks["end"] = time.perf_counter()
        await wf.queue.next("more")

    @a.action
    async def bump(ctx: ActorContext) -> int:
        ctx.state["n"] += 1
        return ctx.state["n"]

    return a


async def _until_waiting(client: Any, key: str) -> None:
    handle = client.get_or_create("flow", key)
    while (await handle.workflow.status()).state is not WorkflowState.SLEEPING:
        await anyio.sleep(0.005)


async def steps_per_second(store: KvStore, steps: int, key: str) -> float:
    async with Registry([_workflow_actor(steps)], kv=store).run() as client:
        await _until_waiting(client, key)
    return steps / (_marks["end"] - _marks["start"])


async def actions_per_second(store: KvStore, count: int, key: str) -> float:
    async with Registry([_workflow_actor(0)], kv=store).run() as client:
        handle = client.get_or_create("flow", key)
        await handle.bump()
        started = time.perf_counter()
        for _ in range(count):
            await handle.bump()
        return count / (time.perf_counter() - started)


async def replay_seconds(store: KvStore, history: int, key: str) -> float:
    """Seconds from the wake call to the replay reaching the end of `history` recorded steps."""
    definition = _workflow_actor(history)
    async with Registry([definition], kv=store).run() as client:
        handle = client.get_or_create("flow", key)
        started = time.perf_counter()
        await handle.bump()
        while "end" not in _marks or _marks["end"] < started:
            await anyio.sleep(0.001)
        return _marks["end"] - started


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


async def main(reps: int, steps: int, history: int) -> None:
    with tempfile.TemporaryDirectory(dir=".") as directory:
        stores: dict[str, Callable[[], KvStore]] = {
            "memory://": lambda: open_kv("memory://"),
            "file://": lambda: open_kv(f"file://{directory}/store"),
        }
        results: dict[tuple[str, str], list[float]] = {}
        for name, make in stores.items():
            store = make()
            async with Registry([_workflow_actor(history)], kv=store).run() as client:
                await _until_waiting(client, "replay")
            if name == "memory://":
                stores[name] = lambda store=store: store
            else:
                store.close()
        for rep in range(reps):
            for name, make in stores.items():
                store = make()
                try:
                    cases = {
                        "steps/s (1,000-step workflow)": await steps_per_second(
                            store, steps, f"steps-{rep}"
                        ),
                        "actions/s (state-only, no workflow)": await actions_per_second(
                            store, steps, f"actions-{rep}"
                        ),
                        f"replay of {history:,} entries (ms)": 1000
                        * await replay_seconds(store, history, "replay"),
                    }
                finally:
                    if name != "memory://":
                        store.close()
                for case, value in cases.items():
                    results.setdefault((name, case), []).append(value)
        print("| backend | case | median (min-max) |")
        print("|---|---|---:|")
        for (name, case), values in results.items():
            print(f"| {name} | {case} | {_median(values)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--history", type=int, default=10_000)
    args = parser.parse_args()
    anyio.run(main, args.reps, args.steps, args.history)
