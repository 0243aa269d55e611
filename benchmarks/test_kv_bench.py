"""KV backend benchmarks, with native SQLite commits as the baseline in the same run.

Run: `.venv/bin/python -m pytest benchmarks/test_kv_bench.py --benchmark-only`
(results: `benchmarks/RESULTS.md`, "KV level"; how they were taken: `benchmarks/HISTORY.md`,
"KV backends").

- `write_128x4k`: one fenced write of 128 entries of 4 KiB (the largest page batch the VFS sends).
- `get_128`: one `get` of 128 stored keys.
- `write_1`: one fenced write of one entry, to a new key or overwriting one — on `file://` a
  durable (fsynced) commit, so it is the number to hold against native SQLite's one-row commit with
  the same payload (`native_commit_1`, WAL+FULL and DELETE+FULL, each an autocommit INSERT of one
  row on an APSW connection).
- `write_1_interleaved`: `write_1` (new keys) on `file://` and native WAL+FULL in one process,
  alternating in blocks, long enough to include the file store's folds and SQLite's checkpoints;
  the ratio is in the result's `extra_info`.

Every value is fresh `os.urandom` bytes, made before the clock starts.

pytest runs the tests in file order, so `write_1` always runs just before `native_commit_1`; on a
shared VM that fixed order flattered `write_1` by 2-7 % (measured). For the ratio, use
`write_1_interleaved` (`-k interleaved -s`), which pairs the two within one run and includes the
background work each side pays; or run the two as separate invocations in alternating order
(`-k "write_1 and file"`, then `-k "native_commit_1 and WAL"`, swapping which goes first each
time) and pair adjacent ones.

`postgres` runs against a throwaway cluster this module starts (loopback, `fsync=on`, so
`write_1` is a durable commit there too), or against `$PAGEKV_BENCH_POSTGRES_URL` if set; without
PostgreSQL binaries it is skipped (see README, "PostgreSQL").
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import apsw
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from pagekv.kv import ActorKv, KvStore, open_kv
from pagekv.kv.pg_cluster import TempCluster, find_pg_bin

BACKENDS = ["memory", "file", "postgres"]
PAYLOADS = [100, 4096]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for this module: `$PAGEKV_BENCH_POSTGRES_URL` or a throwaway one."""
    if url := os.environ.get("PAGEKV_BENCH_POSTGRES_URL"):
        yield url
        return
    if find_pg_bin() is None:
        pytest.skip("no PostgreSQL binaries: see README, 'PostgreSQL'")
    with TempCluster(fsync=True) as cluster:
        yield cluster.url


def _open(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> KvStore:
    if backend == "postgres":
        base = request.getfixturevalue("postgres_url")
        return open_kv(f"{base}?schema=bench_{os.getpid()}_{abs(hash(tmp_path))}")
    return open_kv("memory://" if backend == "memory" else f"file://{tmp_path / 'kv'}")


@pytest.fixture(params=BACKENDS)
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ActorKv, int]]:
    """A namespace of a fresh store and the generation to fence with."""
    store = _open(request.param, tmp_path, request)
    ns = store.namespace("bench-actor")
    yield ns, ns.takeover()
    store.close()


def _value_pool(size: int, count: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


@pytest.mark.benchmark(group="write_128x4k")
def test_write_128x4k(benchmark: BenchmarkFixture, kv: tuple[ActorKv, int]) -> None:
    ns, gen = kv
    keys = [b"page%06d" % i for i in range(128)]
    batches = itertools.cycle([dict(zip(keys, _value_pool(4096, 128), strict=True)) for _ in "ab"])

    def write() -> None:
        ns.write(put=next(batches), fence=gen)

    benchmark(write)
    assert ns.get(keys[:1])[0] is not None
    assert ns.used_bytes() == sum(len(k) + 4096 for k in keys)


@pytest.mark.benchmark(group="get_128")
def test_get_128(benchmark: BenchmarkFixture, kv: tuple[ActorKv, int]) -> None:
    ns, gen = kv
    entries = {b"page%06d" % i: v for i, v in enumerate(_value_pool(4096, 128))}
    ns.write(put=entries, fence=gen)
    keys = list(entries)

    values = benchmark(ns.get, keys)
    assert values == list(entries.values())


@pytest.mark.benchmark(group="write_1")
@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("key", ["new", "overwrite"])
def test_write_1(
    benchmark: BenchmarkFixture, kv: tuple[ActorKv, int], key: str, payload: int
) -> None:
    """One fenced one-entry write (on file://: one durable commit).

    `new`: a new key each time, like the native baseline's INSERT; `overwrite`: the same key with a
    same-sized value, like the VFS rewriting a page.
    """
    ns, gen = kv
    values = _value_pool(payload, 64)
    counter = itertools.count()

    def write() -> None:
        n = next(counter)
        name = b"row%09d" % (n if key == "new" else 0)
        ns.write(put={name: values[n % len(values)]}, fence=gen)

    benchmark(write)
    written = next(counter) if key == "new" else 1
    assert ns.used_bytes() == written * (12 + payload)


@pytest.fixture
def native_db(tmp_path: Path) -> Iterator[Callable[[str], apsw.Connection]]:
    connections: list[apsw.Connection] = []

    def connect(journal_mode: str) -> apsw.Connection:
        db = apsw.Connection(str(tmp_path / f"native-{journal_mode}.sqlite3"))
        mode = db.execute(f"PRAGMA journal_mode={journal_mode}").get
        assert str(mode).upper() == journal_mode
        db.execute("PRAGMA synchronous=FULL")
        assert db.execute("PRAGMA synchronous").get == 2  # FULL
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        connections.append(db)
        return db

    yield connect
    for db in connections:
        db.close()


@pytest.mark.benchmark(group="write_1")
@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("journal_mode", ["WAL", "DELETE"])
def test_native_commit_1(
    benchmark: BenchmarkFixture,
    native_db: Callable[[str], apsw.Connection],
    journal_mode: str,
    payload: int,
) -> None:
    """Native SQLite baseline: one autocommit INSERT of one row, synchronous=FULL."""
    db = native_db(journal_mode)
    values = _value_pool(payload, 64)
    counter = itertools.count()

    def commit() -> None:
        n = next(counter)
        db.execute("INSERT INTO t(id, v) VALUES (?, ?)", (n, values[n % len(values)]))

    benchmark(commit)
    assert db.execute("SELECT count(*) FROM t").get == next(counter)


INTERLEAVED_BLOCKS = 70
INTERLEAVED_BLOCK_OPS = 1000


@pytest.mark.benchmark(group="write_1_interleaved")
@pytest.mark.parametrize("payload", PAYLOADS)
def test_write_1_interleaved(
    benchmark: BenchmarkFixture,
    tmp_path: Path,
    native_db: Callable[[str], apsw.Connection],
    payload: int,
) -> None:
    """`write_1` on `file://` against native WAL+FULL, interleaved in one process.

    Separate invocations meet the shared disk at different moments, and its latency drifts by
    more than the difference being measured. Here the two alternate every
    `INTERLEAVED_BLOCK_OPS` writes (which one goes first alternates too), so each pair of blocks
    meets the same disk. 70,000 writes of each pass a fold of the default 32 MiB log even at 100 B
    (one every ~65,000 such writes) and many WAL checkpoints: each side pays its background work.

    The timed round is the whole run; `extra_info` holds each side's writes/s over the run, their
    ratio (`ratio`: above 1, `file://` is faster) and the median of the per-pair ratios.
    """
    store = open_kv(f"file://{tmp_path / 'kv'}")
    ns = store.namespace("bench-actor")
    gen = ns.takeover()
    db = native_db("WAL")
    values = _value_pool(payload, 64)
    counter = itertools.count()

    def ours() -> None:
        for _ in range(INTERLEAVED_BLOCK_OPS):
            n = next(counter)
            ns.write(put={b"row%09d" % n: values[n % len(values)]}, fence=gen)

    def native() -> None:
        for _ in range(INTERLEAVED_BLOCK_OPS):
            n = next(counter)
            db.execute("INSERT INTO t(id, v) VALUES (?, ?)", (n, values[n % len(values)]))

    spent: dict[Callable[[], None], list[float]] = {ours: [], native: []}

    def run() -> None:
        for block in range(INTERLEAVED_BLOCKS):
            for side in (ours, native) if block % 2 == 0 else (native, ours):
                start = time.perf_counter()
                side()
                spent[side].append(time.perf_counter() - start)

    ours()  # warm both up, untimed
    native()
    benchmark.pedantic(run, rounds=1, iterations=1)
    writes = INTERLEAVED_BLOCKS * INTERLEAVED_BLOCK_OPS
    pairs = [n / o for o, n in zip(spent[ours], spent[native], strict=True)]
    benchmark.extra_info.update(
        file_writes_per_s=round(writes / sum(spent[ours])),
        native_wal_full_commits_per_s=round(writes / sum(spent[native])),
        ratio=round(sum(spent[native]) / sum(spent[ours]), 3),
        pair_ratio_median=round(statistics.median(pairs), 3),
        pairs_at_least_1=sum(r >= 1 for r in pairs),
        pairs=len(pairs),
    )
    print(f"\nwrite_1_interleaved[{payload}]: {benchmark.extra_info}")
    total = writes + INTERLEAVED_BLOCK_OPS
    assert ns.used_bytes() == total * (12 + payload)
    assert db.execute("SELECT count(*) FROM t").get == total
    store.close()
