"""Memory left behind by slept actors: RSS after waking N actors once and letting them sleep.

    .venv/bin/python benchmarks/actor_memory.py [--counts 200 2000] [--reps 3] [--kv file]

Each sample is a fresh subprocess (`--child N`): it wakes N actors (each creates a table, writes
a row and its state, and goes to sleep right after), `--concurrency` at a time, waits until every
one is asleep and 2 s more (the registry's housekeeping runs), collects garbage and reads VmRSS
(anonymous and file-backed) and the thread count from /proc/self/status. Python's heap
(`sys.getallocatedblocks`) is printed beside it: when it stays flat while RSS grows, the growth
is the C allocator's (glibc's arenas keep what was freed), not objects left behind. The figure
is RSS(largest N) - RSS(smallest N), medians of `--reps` interleaved samples. Default store: file
(a temporary directory); memory:// holds every actor's data in the process, so its RSS grows
with N by design.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile

import anyio

from pagekv.actor import ActorContext, Registry, actor

_SETTLE_S = 2.0
"""Waited once all are asleep, before measuring: the registry's housekeeping runs meanwhile."""
sleeper = actor("sleeper", state={"n": 0}, sleep_timeout=3600)


@sleeper.on_migrate
async def _schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(v)")


@sleeper.action
async def touch(ctx: ActorContext) -> int:
    await ctx.db.execute("INSERT INTO t VALUES (?)", (os.urandom(200),))
    ctx.state["n"] += 1
    ctx.sleep()  # at most `--concurrency` actors are awake at once, whatever N
    return ctx.state["n"]


def _status() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                fields[name] = int(value.split()[0])
    return fields


async def _child(count: int, concurrency: int, kv: str) -> dict[str, float]:
    registry = Registry([sleeper], kv=kv)
    async with registry.run() as client:

        async def wake(keys: range) -> None:
            for i in keys:
                await client.get_or_create("sleeper", f"a{i}").touch()

        async with anyio.create_task_group() as tg:
            for lane in range(concurrency):
                tg.start_soon(wake, range(lane, count, concurrency))
        peak_threads = _status()["Threads"]
        while registry.live():
            await anyio.sleep(0.05)
        await anyio.sleep(_SETTLE_S)
        gc.collect()
        status = _status()
    return {
        "rss_mib": status["VmRSS"] / 1024,
        "anon_mib": status["RssAnon"] / 1024,
        "file_mib": status["RssFile"] / 1024,
        "threads": status["Threads"],
        "peak_threads": peak_threads,
        "py_blocks": sys.getallocatedblocks(),
    }


def _sample(count: int, concurrency: int, kv: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", str(count)]
    out = subprocess.run(
        [*command, "--concurrency", str(concurrency), "--kv", kv],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"the sample of {count} actors failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument(
        "--kv",
        default="file",
        help="file (a temporary directory; file?OPTIONS passes options such as log_kib=N) "
        "or memory:// (data in RSS)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        kv = args.kv
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            if kv == "file" or kv.startswith("file?"):
                kv = f"file://{os.path.abspath(tmp)}/kv" + kv[len("file") :]
            print(json.dumps(anyio.run(_child, args.child, args.concurrency, kv)))
        return
    samples: dict[int, list[dict[str, float]]] = {n: [] for n in args.counts}
    for _ in range(args.reps):
        for n in args.counts:
            samples[n].append(_sample(n, args.concurrency, args.kv))
    print(f"{args.kv}, {args.concurrency} at a time, medians of {args.reps}:")
    print(
        f"{'actors':>7} {'RSS MiB':>8} {'anon':>6} {'file':>6} {'threads':>8} {'peak':>6} "
        f"{'py blocks':>10}"
    )
    rss = {}
    for n, runs in samples.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rss[n] = med["rss_mib"]
        print(
            f"{n:>7} {med['rss_mib']:>8.1f} {med['anon_mib']:>6.1f} {med['file_mib']:>6.1f} "
            f"{med['threads']:>8.0f} {med['peak_threads']:>6.0f} {med['py_blocks']:>10,.0f}"
        )
    low, high = min(args.counts), max(args.counts)
    print(f"RSS({high}) - RSS({low}) = {rss[high] - rss[low]:.1f} MiB")


if __name__ == "__main__":
    main()
