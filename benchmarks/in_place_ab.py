"""In-place commits against delta commits: one-row INSERTs through `open_database`, interleaved.

Per repetition, each variant commits `--commits` one-row autocommit INSERTs (100 B) into a fresh
namespace; the figure is the median µs per commit over repetitions, with the KV bytes written per
commit (compaction included: delta commits are folded every 256) and the round trips per commit.

    .venv/bin/python benchmarks/in_place_ab.py --kv memory:// --reps 7
    .venv/bin/python benchmarks/in_place_ab.py --kv file:///work/bench-runs/ab --reps 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from pagekv.kv import CountingKv, open_kv
from pagekv.vfs import open_database


def one_run(url: str, in_place: bool, commits: int, run: str) -> tuple[float, float, float]:
    store = open_kv(url)
    try:
        ns = store.namespace(f"in-place-ab/{run}/{in_place}")
        kv = CountingKv(ns)
        with open_database(kv, in_place_commits=in_place) as db:
            db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
            values = [os.urandom(100) for _ in range(commits)]
            kv.reset()
            execute = db.connection.execute
            started = time.perf_counter()
            for value in values:
                execute("INSERT INTO t(v) VALUES (?)", (value,))
            elapsed = time.perf_counter() - started
            stats = kv.reset()
        ns.drop()
    finally:
        store.close()
    return elapsed / commits * 1e6, stats.bytes_written / commits, stats.total / commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", default="memory://")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--commits", type=int, default=2000)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    for rep in range(args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        run = f"{os.getpid()}-{rep}"
        for in_place in order:
            results[in_place].append(one_run(args.kv, in_place, args.commits, run))
    print(f"store {args.kv}, {args.commits} one-row commits, {args.reps} interleaved repetitions")
    for in_place, runs in results.items():
        us = statistics.median(r[0] for r in runs)
        print(
            f"  {'in place' if in_place else 'deltas  '}: {us:7.1f} µs/commit "
            f"(range {min(r[0] for r in runs):.1f}-{max(r[0] for r in runs):.1f}), "
            f"{statistics.median(r[1] for r in runs):,.0f} KV bytes/commit, "
            f"{statistics.median(r[2] for r in runs):.3f} round trips/commit"
        )


if __name__ == "__main__":
    main()
