"""One-row commit latency on PostgreSQL with a synchronous standby, against the same primary
without the standby wait and against a server with no standby at all.

Run: `.venv/bin/python benchmarks/pg_ha_bench.py [--reps 5] [--commits 500]`
Results and how they were taken: `benchmarks/RESULTS.md`, section "PostgreSQL with a synchronous
standby".

A throwaway primary and streaming standby on loopback (`pagekv.kv.pg_cluster.ReplicatedPair`,
`fsync=on`, `synchronous_standby_names = '*'`) and a lone server (`TempCluster`, `fsync=on`), all
on the same VM and disk; one store per mode:

- `synchronous`: on the pair's two-host URL, the server's `synchronous_commit = on`, so every
  commit waits until the standby has flushed it — the supported set-up, where a failover loses
  nothing acknowledged;
- `local`: the same primary, standby still streaming, but the store's sessions set
  `synchronous_commit = local` — a commit waits for the primary's own flush only, as with
  asynchronous replication (a failover may lose the last commits);
- `alone`: the lone server, no replication at all (the baseline of the ratios).

Measured per mode, modes interleaved in each repetition (the order alternating), medians reported:
the latency of a one-row `INSERT` through the VFS (autocommit: one KV write) and of one 100-byte
KV write (`put`, fenced), each the median of `--commits` in a row after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from pagekv.kv import open_kv
from pagekv.kv.pg_cluster import ReplicatedPair, TempCluster
from pagekv.kv.postgres import PostgresStore
from pagekv.vfs import open_database

ROW = os.urandom(50).hex()  # 100 bytes of text
MODES = ("synchronous", "local", "alone")


def _store(url: str) -> PostgresStore:
    store = open_kv(url)
    assert isinstance(store, PostgresStore)
    return store


def _median_us(timings: list[float]) -> float:
    return statistics.median(timings) * 1e6


def vfs_commit_us(store: PostgresStore, actor: str, commits: int) -> float:
    """The median latency of one-row autocommit INSERTs through the VFS, in µs."""
    timings: list[float] = []
    with open_database(store.namespace(actor)) as db:
        db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
        for _ in range(50):  # warm: prepared statements, page cache
            db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
        for _ in range(commits):
            t0 = time.perf_counter()
            db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
            timings.append(time.perf_counter() - t0)
    return _median_us(timings)


def kv_write_us(store: PostgresStore, actor: str, commits: int) -> float:
    """The median latency of fenced one-entry KV writes (100 bytes), in µs."""
    ns = store.namespace(actor)
    gen = ns.takeover()
    timings: list[float] = []
    for i in range(50 + commits):
        t0 = time.perf_counter()
        ns.put({b"k%d" % (i % 64): ROW.encode()}, fence=gen)
        if i >= 50:
            timings.append(time.perf_counter() - t0)
    return _median_us(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--commits", type=int, default=500)
    args = parser.parse_args()
    with ReplicatedPair(fsync=True) as pair, TempCluster(fsync=True) as alone:
        stores = {
            "synchronous": _store(pair.url(schema="ha_bench", pool_max=2)),
            "local": _store(
                pair.url(schema="ha_bench", pool_max=2, options="-c%20synchronous_commit%3Dlocal")
            ),
            "alone": _store(f"{alone.url}?schema=ha_bench&pool_max=2"),
        }
        measures: dict[str, Callable[[PostgresStore, str, int], float]] = {
            "VFS one-row commit": vfs_commit_us,
            "KV one-entry write": kv_write_us,
        }
        samples: dict[tuple[str, str], list[float]] = {}
        try:
            for rep in range(args.reps):
                order = MODES[rep % 3 :] + MODES[: rep % 3]  # each mode first in turn
                for name, measure in measures.items():
                    for mode in order:
                        us = measure(stores[mode], f"{name}-{mode}-{rep}", args.commits)
                        samples.setdefault((name, mode), []).append(us)
                print(f"rep {rep + 1}/{args.reps} done", flush=True)
        finally:
            for store in stores.values():
                store.close()
    print("| measure | synchronous standby | standby, local commit | no standby | sync ÷ alone |")
    print("|---|---:|---:|---:|---:|")
    for name in measures:
        cells = []
        for mode in MODES:
            values = samples[name, mode]
            cells.append(
                f"{statistics.median(values):,.0f} µs ({min(values):,.0f} to {max(values):,.0f})"
            )
        ratio = statistics.median(samples[name, "synchronous"]) / statistics.median(
            samples[name, "alone"]
        )
        print(f"| {name} | {' | '.join(cells)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
