"""Actor runtime figures: in-process action throughput and wake latency of a 10 MiB actor.

    .venv/bin/python benchmarks/actor_bench.py [--reps 5] [--actions 2000]
    .venv/bin/python benchmarks/actor_bench.py --concurrent 64 [--flush-delay-ms 2]

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
from pagekv.kv import CountingKv, FileStore, KvStore, open_kv
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


async def _concurrent(url: str, actors: int, seconds: float) -> tuple[float, float]:
    """Aggregate state-only actions/s of `actors` actors called at once, each by its own task,
    on one store; and the store's flushes per action (NaN where it keeps no counts)."""
    store = open_kv(url)
    async with Registry([bench], kv=store).run() as client:
        handles = [client.get_or_create("bench", f"c{i}-{time.time_ns()}") for i in range(actors)]
        for handle in handles:
            await handle.call("bump")
        before = store.flush_counts() if isinstance(store, FileStore) else None
        done = [0]
        deadline = time.perf_counter() + seconds

        async def caller(handle: Any) -> None:
            while time.perf_counter() < deadline:
                await handle.call("bump")
                done[0] += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(caller, handle)
        elapsed = time.perf_counter() - started
        flushes = float("nan")
        if before is not None and isinstance(store, FileStore):
            flushes = (store.flush_counts().flushes - before.flushes) / done[0]
    store.close()
    return done[0] / elapsed, flushes


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
    parser.add_argument(
        "--concurrent",
        type=int,
        metavar="N",
        help="instead: N actors called at once vs 1 on file:?flush_delay_ms=2 (a slow disk)",
    )
    parser.add_argument("--flush-delay-ms", type=float, default=2.0)
    args = parser.parse_args()
    if args.concurrent:
        _main_concurrent(args.concurrent, args.reps, args.flush_delay_ms)
        return
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


def _main_concurrent(actors: int, reps: int, delay: float) -> None:
    """1 actor and `actors` actors, interleaved, each on a fresh store in its own directory."""
    rates: dict[int, list[float]] = {1: [], actors: []}
    flushes: dict[int, list[float]] = {1: [], actors: []}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for rep in range(reps):
            for n in (1, actors):
                url = f"file://{os.path.abspath(tmp)}/kv-{rep}-{n}?flush_delay_ms={delay:g}"
                rate, per = _run(_concurrent, url, n, 3.0)
                rates[n].append(rate)
                flushes[n].append(per)
    for n in (1, actors):
        print(
            f"{n:4} actor(s), flush_delay_ms={delay:g}: {statistics.median(rates[n]):10,.0f} "
            f"actions/s ({min(rates[n]):,.0f}-{max(rates[n]):,.0f}), "
            f"{statistics.median(flushes[n]):.3f} flushes/action"
        )
    ratios = [many / one for one, many in zip(rates[1], rates[actors], strict=True)]
    print(
        f"{actors} vs 1, same repetition: median {statistics.median(ratios):.1f}x "
        f"({min(ratios):.1f}-{max(ratios):.1f})"
    )


if __name__ == "__main__":
    main()
