"""KV backend benchmarks, with native SQLite commits as the baseline in the same run.

Run: `.venv/bin/python -m pytest benchmarks/test_kv_bench.py --benchmark-only`
(results and how they were taken: `benchmarks/RESULTS.md`, section "KV backends").

- `write_128x4k`: one fenced write of 128 entries of 4 KiB (the largest page batch the VFS sends).
- `get_128`: one `get` of 128 stored keys.
- `write_1`: one fenced write of one entry, to a new key or overwriting one — on `file://` a
  durable (fsynced) commit, so it is the number to hold against native SQLite's one-row commit with
  the same payload (`native_commit_1`, WAL+FULL and DELETE+FULL, each an autocommit INSERT of one
  row on an APSW connection).

Every value is fresh `os.urandom` bytes, made before the clock starts.

pytest runs the tests in file order, so `write_1` always runs just before `native_commit_1`; on a
shared VM that fixed order flattered `write_1` by 2-7 % (measured). For the ratio, run the two as
separate invocations in alternating order (`-k "write_1 and file"`, then
`-k "native_commit_1 and WAL"`, swapping which goes first each time) and pair adjacent ones.

`postgres` runs against a throwaway cluster this module starts (loopback, `fsync=on`, so
`write_1` is a durable commit there too), or against `$PAGEKV_BENCH_POSTGRES_URL` if set; without
PostgreSQL binaries it is skipped (see README, "PostgreSQL").
"""

from __future__ import annotations

import itertools
import os
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
