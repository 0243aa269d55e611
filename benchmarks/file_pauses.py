"""Per-call latency of `file://` writes, and the pauses of the writes that fold the log.

    .venv/bin/python benchmarks/file_pauses.py [--dir DIR]

Runs one-row VFS commits and one-entry KV writes to new keys on a fresh store with an 8 MiB and
the default 32 MiB log, and prints median, p99, p99.9 and max per call, with the time of each
fold (timed by wrapping `Appender.fold`). Results: `benchmarks/RESULTS.md`, "Through the
VFS" (the pauses), and its last table in `benchmarks/HISTORY.md`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable

from pagekv.kv import open_kv
from pagekv.kv.file.append import Appender
from pagekv.vfs import open_database

_folds: list[float] = []


def _timed_fold(fold: Callable[[Appender], None]) -> Callable[[Appender], None]:
    def wrapper(appender: Appender) -> None:
        start = time.perf_counter()
        fold(appender)
        _folds.append(time.perf_counter() - start)

    return wrapper


def _run(directory: str, log_kib: int, mode: str, count: int) -> None:
    _folds.clear()
    shutil.rmtree(directory, ignore_errors=True)
    store = open_kv(f"file://{directory}?log_kib={log_kib}")
    ns = store.namespace("a")
    value = os.urandom(100)
    latencies = []
    if mode == "vfs":
        db = open_database(ns)
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        for _ in range(count):
            start = time.perf_counter()
            db.execute("INSERT INTO t(v) VALUES (?)", (value,))
            latencies.append(time.perf_counter() - start)
        db.close()
    else:
        fence = ns.takeover()
        for i in range(count):
            start = time.perf_counter()
            ns.write(put={b"k%08d" % i: value}, fence=fence)
            latencies.append(time.perf_counter() - start)
    store.close()
    latencies.sort()

    def ms(quantile: float) -> float:
        return latencies[int(quantile * (len(latencies) - 1))] * 1e3

    folds = ", ".join(f"{f * 1e3:.0f}" for f in _folds[:6])
    print(
        f"{mode} log {log_kib // 1024} MiB, {count} ops: median {ms(0.5):.2f} ms, "
        f"p99 {ms(0.99):.2f}, p99.9 {ms(0.999):.2f}, max {latencies[-1] * 1e3:.1f} ms; "
        f"{len(_folds)} folds ({folds} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="./.bench-pauses", help="scratch store directory")
    args = parser.parse_args()
    Appender.fold = _timed_fold(Appender.fold)  # type: ignore[method-assign]
    for log_kib, kv_writes in ((8 * 1024, 30_000), (32 * 1024, 80_000)):
        _run(args.dir, log_kib, "vfs", 12_000)
        _run(args.dir, log_kib, "kv", kv_writes)


if __name__ == "__main__":
    main()
