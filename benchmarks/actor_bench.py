"""Actor runtime figures: in-process action throughput and wake latency of a 10 MiB actor.

    .venv/bin/python benchmarks/actor_bench.py [--reps 5] [--actions 2000]

Runs every case on memory:// and file:// (a temporary directory under the current one),
interleaved, and prints medians with min-max. Wake is measured from the call that finds the actor
asleep to its result, with the KV round trips of the wake counted by a CountingKv.

The runtime's overhead: in every repetition, right before the memory:// actions, a loop of
one-row commits straight on a VFS database over memory:// (`vfs-commit`, no actor runtime), and
the ratio of the state-only action's rate to it in that same repetition (`bump / vfs-commit`,
median of the repetitions): what is left of a commit's speed once an action wraps it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

from pagekv.actor import ActorContext, Registry, actor
from pagekv.kv import CountingKv, KvStore, open_kv
from pagekv.vfs import open_database

bench = actor("bench", state={"n": 0}, sleep_timeout=3600)


@bench.action
async def bump(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    return ctx.state["n"]


@bench.action
async def peek(ctx: ActorContext) -> int:
    return ctx.state["n"]


@bench.action
async def bump_sql(ctx: ActorContext) -> int:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO t(v) VALUES (?)", (ctx.state["n"],))
        ctx.state["n"] += 1
    return ctx.state["n"]


@bench.action
async def fill(ctx: ActorContext, mib: int) -> None:
    async with ctx.db.transaction():
        for _ in range(mib * 16):
            await ctx.db.execute("INSERT INTO blobs VALUES (?)", (os.urandom(65536),))


@bench.action
async def count(ctx: ActorContext) -> int:
    return (await ctx.db.execute("SELECT count(*) FROM blobs"))[0][0]


@bench.on_migrate
async def schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v)")
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS blobs(b BLOB)")


class _Counting:
    """A store whose namespaces are counted, to see a wake's round trips."""

    def __init__(self, store: KvStore) -> None:
        self.store = store
        self.counters: dict[str, CountingKv] = {}

    def namespace(self, actor_id: str) -> CountingKv:
        counting = CountingKv(self.store.namespace(actor_id))
        self.counters[actor_id] = counting
        return counting

    def close(self) -> None:
        self.store.close()


async def _throughput(url: str, action: str, n: int) -> float:
    store = open_kv(url)
    async with Registry([bench], kv=store).run() as client:
        handle = client.get_or_create("bench", f"tp-{action}-{time.time_ns()}")
        await handle.call(action)
        started = time.perf_counter()
        for _ in range(n):
            await handle.call(action)
        elapsed = time.perf_counter() - started
    store.close()
    return n / elapsed


def _vfs_commits(n: int) -> float:
    """One-row commits/s straight on a VFS database over memory:// (no actor runtime)."""
    store = open_kv("memory://")
    database = open_database(store.namespace(f"vfs-{time.time_ns()}"))
    connection = database.connection
    connection.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    started = time.perf_counter()
    for i in range(n):
        connection.execute("INSERT OR REPLACE INTO t VALUES (1, ?)", (i,))
    elapsed = time.perf_counter() - started
    database.close()
    return n / elapsed


async def _wake(url: str, mib: int) -> tuple[float, int]:
    store = _Counting(open_kv(url))
    key = f"wake-{time.time_ns()}"
    async with Registry([bench], kv=store).run() as client:
        await client.get_or_create("bench", key).fill(mib)
    async with Registry([bench], kv=store).run() as client:
        counting = None
        started = time.perf_counter()
        rows = await client.get("bench", key).count()
        elapsed = time.perf_counter() - started
        counting = store.counters[f"bench/{key}"]
    store.close()
    assert rows == mib * 16
    return elapsed * 1000, counting.stats.total


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    return anyio.run(fn, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--actions", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        urls = {"memory": "memory://", "file": f"file://{os.path.abspath(tmp)}/kv"}
        results: dict[tuple[str, str], list[float]] = {}
        trips: dict[str, list[int]] = {}
        ratios: list[float] = []
        for _ in range(args.reps):
            for backend, url in urls.items():
                if backend == "memory":
                    commits = _vfs_commits(args.actions * 10)
                    results.setdefault((backend, "vfs-commit"), []).append(commits)
                for action in ("bump", "bump_sql", "peek"):
                    n = args.actions if backend == "memory" else args.actions // 4
                    rate = _run(_throughput, url, action, n)
                    results.setdefault((backend, action), []).append(rate)
                    if backend == "memory" and action == "bump":
                        ratios.append(rate / commits)
                ms, rt = _run(_wake, url, 10)
                results.setdefault((backend, "wake-10MiB-ms"), []).append(ms)
                trips.setdefault(backend, []).append(rt)
    print(f"{'backend':8} {'case':16} {'median':>12} {'min':>12} {'max':>12}")
    for (backend, case), values in results.items():
        unit = "ms" if case.endswith("ms") else "commits/s" if case == "vfs-commit" else "actions/s"
        print(
            f"{backend:8} {case:16} {statistics.median(values):12,.1f} {min(values):12,.1f} "
            f"{max(values):12,.1f}  {unit}"
        )
    print(
        f"memory   bump / vfs-commit, same repetition: median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f})"
    )
    for backend, values in trips.items():
        print(f"{backend:8} wake KV round trips (open + first query): {sorted(set(values))}")


if __name__ == "__main__":
    main()
