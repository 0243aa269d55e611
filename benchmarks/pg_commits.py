"""The VFS on PostgreSQL: commits/s per actor, round trips per commit, many actors at once.

Run: `.venv/bin/python benchmarks/pg_commits.py [--url postgresql://...] [--reps 5]`
(without `--url` a throwaway cluster is started with `fsync=on`, loopback, default settings).
Results and how they were taken: `benchmarks/RESULTS.md`, section "PostgreSQL".

Measured, each repetition in a fresh schema, repetitions interleaved, medians reported:
- `one actor`: one thread commits one-row INSERTs (autocommit, 100-byte row) for `--seconds`;
- `N actors`: N threads, each with its own namespace and database, commit the same way at once;
  aggregate commits/s over the same wall time;
- round trips per small commit, counted twice: KV calls (`CountingKv`) and protocol messages on
  the wire (libpq trace of a one-connection store: `Sync` sent / `ReadyForQuery` received);
- `1 MiB insert`, `10 MiB insert` (one row, one transaction) and a `cold scan` of 10 MiB in 4 KiB
  rows (a fresh open, then a query that reads every byte), in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from psycopg import pq

from pagekv.kv import CountingKv, PostgresStore, open_kv
from pagekv.kv.pg_cluster import TempCluster
from pagekv.vfs import open_database

ROW = os.urandom(50).hex()  # 100 bytes of text


def _store(url: str, tag: str, **options: object) -> PostgresStore:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    store = open_kv(f"{url}?schema=bench_{tag}_{os.getpid()}" + (f"&{query}" if query else ""))
    assert isinstance(store, PostgresStore)
    return store


def commit_loop(store: PostgresStore, actor: str, start: threading.Barrier, seconds: float) -> int:
    """Commit one-row transactions until `seconds` have passed; return how many."""
    with open_database(store.namespace(actor)) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        for _ in range(20):  # warm: prepared statements, page cache
            db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
        start.wait()
        deadline = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < deadline:
            db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
            n += 1
        return n


def commits_per_second(url: str, tag: str, actors: int, seconds: float) -> float:
    store = _store(url, tag, pool_max=max(actors, 1))
    counts = [0] * actors
    start = threading.Barrier(actors + 1)

    def run(i: int) -> None:
        counts[i] = commit_loop(store, f"actor-{i}", start, seconds)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(actors)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    store.close()
    return sum(counts) / elapsed


def round_trips_per_commit(url: str, tag: str, commits: int = 200) -> tuple[float, float, float]:
    """(KV calls, Syncs sent, ReadyForQuery received) per one-row commit."""
    store = _store(url, tag, pool_min=1, pool_max=1)
    counting = CountingKv(store.namespace("actor"))
    with tempfile.TemporaryDirectory() as tmp, open_database(counting) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        for _ in range(20):
            db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
        counting.reset()
        path = Path(tmp) / "trace"
        with open(path, "w") as handle:
            conn = store._pool.getconn()
            conn.pgconn.trace(handle.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            store._pool.putconn(conn)
            for _ in range(commits):
                db.execute("INSERT INTO t(v) VALUES (?)", (ROW,))
            conn = store._pool.getconn()
            conn.pgconn.untrace()
            store._pool.putconn(conn)
        lines = path.read_text().splitlines()
    store.close()
    syncs = sum(1 for line in lines if line.startswith("F\t") and "\tSync" in line)
    ready = sum(1 for line in lines if line.startswith("B\t") and "\tReadyForQuery" in line)
    return counting.stats.total / commits, syncs / commits, ready / commits


def big_ops_ms(url: str, tag: str) -> dict[str, float]:
    store = _store(url, tag)
    ns = store.namespace("actor")
    out: dict[str, float] = {}
    with open_database(ns) as db:
        db.execute("CREATE TABLE b(v BLOB)")
        for label, size in (("1 MiB insert", 2**20), ("10 MiB insert", 10 * 2**20)):
            blob = os.urandom(size)
            t0 = time.perf_counter()
            db.execute("INSERT INTO b(v) VALUES (?)", (blob,))
            out[label] = (time.perf_counter() - t0) * 1000
        db.execute("CREATE TABLE s(v BLOB)")
        with db.connection:  # 10 MiB in 2,560 rows of 4 KiB, one transaction
            for _ in range(2560):
                db.execute("INSERT INTO s(v) VALUES (randomblob(4096))")
    with open_database(ns) as db:  # a fresh open: nothing cached
        t0 = time.perf_counter()
        # `v || x''` makes SQLite read every byte (length(v) alone skips overflow pages).
        total = db.execute("SELECT sum(length(CAST(v || x'' AS BLOB))) FROM s").fetchall()[0][0]
        out["cold scan 10 MiB"] = (time.perf_counter() - t0) * 1000
        assert total == 10 * 2**20
    store.close()
    return out


def median_table(samples: dict[str, list[float]]) -> None:
    for name, values in samples.items():
        spread = f"{min(values):,.1f} to {max(values):,.1f}"
        print(f"| {name} | {statistics.median(values):,.1f} | {spread} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing server (default: a throwaway cluster)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--actors", type=int, default=8)
    args = parser.parse_args()
    cluster = None
    url = args.url
    if url is None:
        cluster = TempCluster(fsync=True)
        cluster.start()
        url = cluster.url
    try:
        samples: dict[str, list[float]] = {}

        def sample(name: str, fn: Callable[[], float]) -> None:
            samples.setdefault(name, []).append(fn())

        for rep in range(args.reps):
            seconds, n = args.seconds, args.actors
            sample("one actor, commits/s", partial(commits_per_second, url, f"s{rep}", 1, seconds))
            sample(
                f"{n} actors, aggregate commits/s",
                partial(commits_per_second, url, f"c{rep}", n, seconds),
            )
            for name, ms in big_ops_ms(url, f"b{rep}").items():
                samples.setdefault(f"{name}, ms", []).append(ms)
            print(f"rep {rep + 1}/{args.reps} done", flush=True)
        single = statistics.median(samples["one actor, commits/s"])
        many = statistics.median(samples[f"{args.actors} actors, aggregate commits/s"])
        kv_calls, syncs, ready = round_trips_per_commit(url, "rt")
        print("| measure | median | range |")
        print("|---|---:|---:|")
        median_table(samples)
        print(f"\n{args.actors} actors / one actor: {many / single:.2f}x")
        print(
            f"per one-row commit: {kv_calls:.2f} KV calls, {syncs:.2f} Sync sent, "
            f"{ready:.2f} ReadyForQuery received"
        )
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
