"""Export, import and copy: MiB/s of a 100 MiB actor out of and into the `file:` store, and a
copy of 1,000 actors of 100 KiB each from `file:` to PostgreSQL.

Run: `.venv/bin/python benchmarks/transfer_bench.py [--url postgresql://...] [--reps 3]`
(without `--url` a throwaway cluster is started with `fsync=on`, loopback, default settings).
Results and how they were taken: `benchmarks/RESULTS.md`, section "Export, import and copy".

Each repetition uses fresh directories and a fresh schema; repetitions are interleaved (every
measurement once per round) and medians reported. Measured:
- `import 100 MiB`: `import_actor` of a 100 MiB SQLite file (4,000-byte blobs) into a fresh
  `file:` store, compaction included (the database ends as base pages, as an actor's does);
- `export 100 MiB`: `export_actor` of that actor to a file (one consistent `list`, then SQLite's
  backup API, then fsync);
- baseline: SQLite's own backup API copying the same file to another file (`native backup`),
  the floor of any copy through SQLite on this machine;
- `copy 1,000 x 100 KiB`: `copy_store` of 1,000 actors (each a 100 KiB database, recorded in
  the registry's index) from `file:` to PostgreSQL with 4 threads, verification included;
- baseline: the same entries written to PostgreSQL as raw fenced batches (a takeover and the
  batches per namespace, 4 threads; no index, no checksums): the floor of a copy.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import apsw

from pagekv.kv import KvStore, open_kv
from pagekv.kv.pg_cluster import TempCluster
from pagekv.transfer import copy_store, export_actor, import_actor
from pagekv.transfer.chunked_io import batches, scan

BIG_ROWS = 25_600
"""4,000-byte blobs: a 100 MiB database."""
SMALL_ACTORS = 1_000
SMALL_ROWS = 24
"""4,000-byte blobs: a 100 KiB database."""
THREADS = 4
RATIOS = (
    ("import / native backup", "import 100 MiB, MiB/s", "native backup 100 MiB, MiB/s"),
    ("export / native backup", "export 100 MiB, MiB/s", "native backup 100 MiB, MiB/s"),
    (
        "copy / raw batches",
        "copy 1,000 x 100 KiB, actors/s",
        "raw batches 1,000 x 100 KiB, namespaces/s",
    ),
)
"""Each figure against its baseline of the same round."""


def _database(path: Path, rows: int) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        db.executemany("INSERT INTO t(b) VALUES (randomblob(4000))", [()] * rows)
    return path


def _mib(path: Path) -> float:
    return path.stat().st_size / 2**20


def import_rate(work: Path, source: Path) -> float:
    with open_kv(f"file:{work / 'import'}") as store:
        started = time.perf_counter()
        import_actor(store, "big", "one", source)
        return _mib(source) / (time.perf_counter() - started)


def export_rate(work: Path, source: Path) -> float:
    with open_kv(f"file:{work / 'import'}") as store:
        started = time.perf_counter()
        exported = export_actor(store, "big", "one", work / "exported.sqlite")
        return exported.bytes / 2**20 / (time.perf_counter() - started)


def native_backup_rate(work: Path, source: Path) -> float:
    started = time.perf_counter()
    target = apsw.Connection(str(work / "native.sqlite"))
    with target.backup("main", apsw.Connection(str(source)), "main") as backup:
        backup.step(-1)
    target.close()
    with open(work / "native.sqlite", "rb+") as f:
        os.fsync(f.fileno())
    return _mib(source) / (time.perf_counter() - started)


def _small_store(work: Path) -> Path:
    """A `file:` store of `SMALL_ACTORS` actors, each a 100 KiB database."""
    source = _database(work / "small.sqlite", SMALL_ROWS)
    directory = work / "small-store"
    with open_kv(f"file:{directory}") as store:
        for i in range(SMALL_ACTORS):
            import_actor(store, "small", f"k{i:04}", source)
    return directory


def _pg(url: str, tag: str) -> KvStore:
    return open_kv(f"{url}?schema=transfer_{tag}_{os.getpid()}&pool_max={THREADS + 1}")


def copy_rate(url: str, tag: str, directory: Path) -> tuple[float, float]:
    """(actors/s, MiB/s) of `copy_store` file -> PostgreSQL."""
    with open_kv(f"file:{directory}") as source, _pg(url, tag) as target:
        result = copy_store(source, target, threads=THREADS)
        assert result.verified == SMALL_ACTORS
        return SMALL_ACTORS / result.seconds, result.bytes / 2**20 / result.seconds


def raw_rate(url: str, tag: str, directory: Path) -> tuple[float, float]:
    """(namespaces/s, MiB/s) of raw fenced batches of the same entries into PostgreSQL."""
    with open_kv(f"file:{directory}") as source, _pg(url, tag) as target:
        names = [n for n in source.actor_ids() if n.startswith("small/")]  # type: ignore[attr-defined]
        written = [0]

        def one(name: str) -> None:
            kv = target.namespace(name)
            fence = kv.takeover()
            for batch in batches(scan(source.namespace(name)), kv.limits):
                kv.write(put=batch, fence=fence)
                written[0] += sum(len(k) + len(v) for k, v in batch.items())

        started = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, names))
        elapsed = time.perf_counter() - started
        return len(names) / elapsed, written[0] / 2**20 / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a PostgreSQL server (default: a throwaway cluster)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    cluster = None
    url = args.url
    if url is None:
        cluster = TempCluster(fsync=True)
        cluster.start()
        url = cluster.url
    samples: dict[str, list[float]] = {}

    def sample(names: tuple[str, ...], fn: Callable[[], float | tuple[float, ...]]) -> None:
        value = fn()
        for name, v in zip(names, value if isinstance(value, tuple) else (value,), strict=True):
            samples.setdefault(name, []).append(v)

    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("PAGEKV_BENCH_DIR")) as tmp:
            root = Path(tmp)
            big = _database(root / "big.sqlite", BIG_ROWS)
            small = _small_store(root)
            for rep in range(args.reps):
                work = root / f"rep{rep}"
                work.mkdir()
                sample(("native backup 100 MiB, MiB/s",), partial(native_backup_rate, work, big))
                sample(("import 100 MiB, MiB/s",), partial(import_rate, work, big))
                sample(("export 100 MiB, MiB/s",), partial(export_rate, work, big))
                raw = ("raw batches 1,000 x 100 KiB, namespaces/s", "raw batches, MiB/s")
                sample(raw, partial(raw_rate, url, f"r{rep}", small))
                copied = ("copy 1,000 x 100 KiB, actors/s", "copy, MiB/s")
                sample(copied, partial(copy_rate, url, f"c{rep}", small))
                print(f"round {rep + 1}/{args.reps} done", flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()
    for name, values in samples.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:<52} median {statistics.median(values):8.1f}   ({shown})")
    for label, name, baseline in RATIOS:
        ratios = [a / b for a, b in zip(samples[name], samples[baseline], strict=True)]
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"{label:<52} median {statistics.median(ratios):8.2f}   ({shown})")


if __name__ == "__main__":
    main()
