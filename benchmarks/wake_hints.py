"""An actor's wake with and without preload hints: open, then read the same rows as last time.

Run: `.venv/bin/python benchmarks/wake_hints.py [--kv URL] [--latency-ms 0 1] [--reps 7]`
(`--kv postgresql://` without a server address starts a throwaway cluster, as pg_commits.py
does). Results and how they were taken: `benchmarks/RESULTS.md`, section "Preload hints".

For each database size: build a table of one-page rows (compacted, as a long-lived database is),
wake once to learn the hot rows, then alternate wakes with `preload_hints=False` and `True`
(interleaved, medians). A wake is `open_database` plus `--rows` point reads by key, timed from
before the open to after the last read; round trips are counted over the same span. `--latency-ms`
adds that many milliseconds to every round trip (a remote store's cost).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections.abc import Iterator

from pagekv.kv import ActorKv, CountingKv, FaultyKv, KvStore, open_kv
from pagekv.kv.pg_cluster import TempCluster
from pagekv.vfs import open_database

MiB = 1 << 20
ROW_BYTES = 4000  # one row per leaf page


def build(kv: ActorKv, mib: int) -> int:
    rows = mib * MiB // ROW_BYTES
    rng = random.Random(mib)
    with open_database(kv, preload_hints=False) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        for start in range(0, rows, 2560):
            with db.connection:
                db.connection.executemany(
                    "INSERT INTO t VALUES (?, ?)",
                    ((i, rng.randbytes(ROW_BYTES)) for i in range(start, min(rows, start + 2560))),
                )
        db.compact()
    return rows


def wake(kv: ActorKv, ids: list[int], *, hints: bool, latency_ms: float) -> tuple[float, int]:
    """Seconds and round trips of one wake (the close, which may save hints, is not counted)."""
    counting = CountingKv(FaultyKv(kv, latency_ms=latency_ms) if latency_ms else kv)
    started = time.perf_counter()
    db = open_database(counting, preload_hints=hints)
    for i in ids:
        found = db.execute("SELECT length(v) FROM t WHERE id = ?", (i,)).fetchall()
        assert found == [(ROW_BYTES,)], found
    seconds = time.perf_counter() - started
    trips = counting.stats.total
    db.close()
    return seconds, trips


@contextlib.contextmanager
def store_at(url: str) -> Iterator[KvStore]:
    if url.rstrip("/") not in ("postgresql:", "postgres:"):
        store = open_kv(url)
        try:
            yield store
        finally:
            store.close()
        return
    cluster = TempCluster(fsync=True)
    cluster.start()
    try:
        store = open_kv(cluster.url)
        try:
            yield store
        finally:
            store.close()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", default="memory://")
    parser.add_argument("--mib", type=int, nargs="+", default=[16, 100])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print("| store | size | latency | wake without hints | with hints | speed-up |")
    print("|---|---:|---:|---|---|---:|")
    with store_at(args.kv) as store:
        for mib in args.mib:
            kv = store.namespace(f"wake-{mib}")
            ids = random.Random("hot rows").sample(range(build(kv, mib)), args.rows)
            wake(kv, ids, hints=True, latency_ms=0)  # learns the hot rows
            for latency in args.latency_ms:
                runs: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
                for _ in range(args.reps):
                    for hints in (False, True):
                        runs[hints].append(wake(kv, ids, hints=hints, latency_ms=latency))
                off, on = (statistics.median(s for s, _ in runs[h]) for h in (False, True))
                trips = {h: statistics.median(t for _, t in runs[h]) for h in (False, True)}
                print(
                    f"| {args.kv} | {mib} MiB | {latency:g} ms "
                    f"| {off * 1e3:.2f} ms, {trips[False]:g} RT "
                    f"| {on * 1e3:.2f} ms, {trips[True]:g} RT | {off / on:.1f}x |"
                )


if __name__ == "__main__":
    main()
