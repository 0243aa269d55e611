"""A/B of `file://` engines: the previous one (SQLite underneath, `file.py` of d27e952) against
the current one (log + base) and native SQLite, in one process, samples in shuffled order.

    git worktree add /tmp/oldpkv d27e952
    N=3000 .venv/bin/python benchmarks/file_engine_ab.py 7
    N=15000 ONLY=WAL,write_1 .venv/bin/python benchmarks/file_engine_ab.py 5

`OLD_FILE_PY` names the previous `file.py` (default `/tmp/oldpkv/pagekv/kv/file.py`), `BASE` the
scratch directory (default `./.bench-ab`, on the disk under test), `N` the operations per sample,
`ONLY` comma-separated substrings of the case names to run. Every sample opens a fresh store, so
the log's first growth and any folds are inside the timing. Results: `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import apsw

from pagekv.kv.file import FileStore

BASE = os.environ.get("BASE", "./.bench-ab")
N = int(os.environ.get("N", "3000"))
Sample = Callable[[], float]


def _previous_store() -> Any:
    spec = importlib.util.spec_from_file_location(
        "previous_file", os.environ.get("OLD_FILE_PY", "/tmp/oldpkv/pagekv/kv/file.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FileStore


def _fresh(name: str) -> str:
    path = os.path.join(BASE, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _kv(store_class: Any, kind: str, size: int) -> Sample:
    """µs per operation of `kind` on a fresh store of `store_class`."""

    def sample() -> float:
        store = store_class(_fresh("kv"))
        ns = store.namespace("a")
        fence = ns.takeover()
        values = [os.urandom(size) for _ in range(64)]
        keys = [b"page%06d" % i for i in range(128)]
        pages = [dict(zip(keys, [os.urandom(4096) for _ in keys], strict=True)) for _ in "ab"]
        ops: Callable[[int], None]
        count = N
        if kind == "write_128x4k":
            count = max(50, N // 20)
            ops = lambda i: ns.write(put=pages[i % 2], fence=fence)  # noqa: E731
        elif kind == "get_128":
            ns.write(put=pages[0], fence=fence)
            count = N // 3
            ops = lambda i: ns.get(keys)  # noqa: E731
        elif kind == "new":
            ops = lambda i: ns.write(put={b"k%08d" % i: values[i % 64]}, fence=fence)  # noqa: E731
        else:
            ops = lambda i: ns.write(put={b"same": values[i % 64]}, fence=fence)  # noqa: E731
        start = time.perf_counter()
        for i in range(count):
            ops(i)
        elapsed = time.perf_counter() - start
        store.close()
        return elapsed / count * 1e6

    return sample


def _native(mode: str, size: int) -> Sample:
    """µs per autocommit one-row INSERT with `journal_mode=mode`, `synchronous=FULL`."""

    def sample() -> float:
        db = apsw.Connection(os.path.join(_fresh("native"), "native.db"))
        assert db.execute(f"PRAGMA journal_mode={mode}").get.upper() == mode
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        values = [os.urandom(size) for _ in range(64)]
        count = N if mode == "WAL" else N // 5
        start = time.perf_counter()
        for i in range(count):
            db.execute("INSERT INTO t(v) VALUES (?)", (values[i % 64],))
        elapsed = time.perf_counter() - start
        db.close()
        return elapsed / count * 1e6

    return sample


def main(repetitions: int) -> None:
    previous = _previous_store()
    cases: dict[str, Sample] = {}
    for size in (100, 4096):
        cases[f"native WAL+FULL {size}"] = _native("WAL", size)
        cases[f"native DELETE+FULL {size}"] = _native("DELETE", size)
        for kind in ("new", "overwrite"):
            cases[f"previous write_1 {kind} {size}"] = _kv(previous, kind, size)
            cases[f"current write_1 {kind} {size}"] = _kv(FileStore, kind, size)
    for kind in ("write_128x4k", "get_128"):
        cases[f"previous {kind}"] = _kv(previous, kind, 0)
        cases[f"current {kind}"] = _kv(FileStore, kind, 0)
    if only := os.environ.get("ONLY"):
        cases = {k: v for k, v in cases.items() if any(o in k for o in only.split(","))}
    results: dict[str, list[float]] = {k: [] for k in cases}
    for repetition in range(repetitions):
        names = list(cases)
        random.shuffle(names)
        for name in names:
            results[name].append(cases[name]())
        print(f"repetition {repetition + 1}/{repetitions} done", file=sys.stderr, flush=True)
    print(f"N={N} ops per sample, {repetitions} shuffled repetitions, fresh store each, {BASE}")
    for name, samples in results.items():
        print(
            f"{name:34s} median {statistics.median(samples):9.1f} µs"
            f"  min {min(samples):8.1f}  max {max(samples):8.1f}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
