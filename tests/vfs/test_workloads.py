"""SQL workloads on pagekv, checked step by step against native SQLite fed the same statements.

Every workload runs on both KV backends, once on one open database and once reopening the
database between its steps; after every step the full contents of every table (and the schema and
page count) must equal the oracle's, and `PRAGMA integrity_check` must say ok on both.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest

import pagekv.vfs.page_vfs
from pagekv.kv import ActorKv, CountingKv, open_kv
from pagekv.vfs import Database, Options, SnapshotExpired, open_database
from pagekv.vfs.page_file import PageFile

Rows = list[tuple[Any, ...]]
KiB = 1024
MiB = 1024 * KiB


def text(rng: random.Random, n: int) -> str:
    """`n` characters of pseudorandom ASCII text."""
    return rng.randbytes((n + 1) // 2).hex()[:n]


def blob(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def integrity(conn: apsw.Connection) -> Rows:
    return conn.execute("PRAGMA integrity_check").fetchall()


def page_count(db: Database) -> int:
    return db.execute("PRAGMA page_count").fetchall()[0][0]


class Pair:
    """A pagekv database and a native SQLite oracle, fed the same statements."""

    def __init__(self, ns: ActorKv, oracle_path: Path, **options: Any) -> None:
        self.ns = ns
        self.options = options
        self.db: Database = open_database(ns, **options)
        self.oracle = apsw.Connection(str(oracle_path))

    def run(self, sql: str, bindings: Any = None) -> Rows:
        """Execute on both; the results must be equal."""
        got = self.db.execute(sql, bindings).fetchall()
        want = self.oracle.execute(sql, bindings).fetchall()
        assert got == want, f"{sql!r}: pagekv returned {got!r}, sqlite returned {want!r}"
        return got

    def run_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.db.connection.executemany(sql, rows)
        self.oracle.executemany(sql, rows)

    def tables(self) -> list[str]:
        return [
            name
            for (name,) in self.db.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"
            )
        ]

    def check(self) -> None:
        """Schema, every table's full contents, page count and integrity equal the oracle's."""
        schema = "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name"
        assert self.db.execute(schema).fetchall() == self.oracle.execute(schema).fetchall()
        for table in self.tables():
            sql = f'SELECT rowid, * FROM "{table}" ORDER BY rowid'
            got = self.db.execute(sql).fetchall()
            want = self.oracle.execute(sql).fetchall()
            assert len(got) == len(want), f"table {table}: {len(got)} rows, expected {len(want)}"
            assert got == want, f"table {table} differs from the oracle"
        count = "PRAGMA page_count"
        assert self.db.execute(count).fetchall() == self.oracle.execute(count).fetchall()
        assert integrity(self.db.connection) == [("ok",)]
        assert integrity(self.oracle) == [("ok",)]

    def reopen(self) -> None:
        self.db.close()
        self.db = open_database(self.ns, **self.options)

    def close(self) -> None:
        self.db.close()
        self.oracle.close()


Step = Callable[[Pair, random.Random], None]


@dataclass(frozen=True)
class Workload:
    steps: list[Step]
    options: dict[str, Any] = field(default_factory=dict)


def _create(p: Pair, rng: random.Random) -> None:
    p.run("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, s TEXT, b BLOB)")


def _one_row(p: Pair, rng: random.Random) -> None:
    p.run("INSERT INTO t VALUES (1, 42, ?, ?)", (text(rng, 30), blob(rng, 100)))


def _rows_in_own_transactions(p: Pair, rng: random.Random) -> None:
    for i in range(100):
        p.run("INSERT INTO t VALUES (?, ?, ?, ?)", (i, rng.randrange(1000), text(rng, 50), None))


def _rows_in_one_transaction(count: int, size: int) -> Step:
    def step(p: Pair, rng: random.Random) -> None:
        start = p.db.execute("SELECT coalesce(max(id), 0) + 1 FROM t").fetchall()[0][0]
        rows = [
            (start + i, rng.randrange(10**9), text(rng, size), blob(rng, size // 2))
            for i in range(count)
        ]
        p.run("BEGIN")
        p.run_many("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
        p.run("COMMIT")

    return step


def _big_text(p: Pair, rng: random.Random) -> None:
    p.run("INSERT INTO t(id, s) VALUES (1, ?)", (text(rng, MiB),))


def _replace_big_text(p: Pair, rng: random.Random) -> None:
    p.run("UPDATE t SET s = ? WHERE id = 1", (text(rng, MiB - 1234),))
    p.run("SELECT length(s), substr(s, 500000, 20) FROM t WHERE id = 1")


def _blobs_10k(p: Pair, rng: random.Random) -> None:
    p.run("BEGIN")
    p.run_many(
        "INSERT INTO t(id, b) VALUES (?, ?)", [(i, blob(rng, 10 * KiB)) for i in range(1000)]
    )
    p.run("COMMIT")


def _small_rows(p: Pair, rng: random.Random) -> None:
    p.run("BEGIN")
    p.run_many(
        "INSERT INTO t(id, n, s) VALUES (?, ?, ?)",
        [(i, rng.randrange(-(2**40), 2**40), text(rng, rng.randrange(40))) for i in range(10_000)],
    )
    p.run("COMMIT")


def _alter_add_column(p: Pair, rng: random.Random) -> None:
    p.run("ALTER TABLE t ADD COLUMN extra TEXT DEFAULT 'dflt'")
    p.run("UPDATE t SET extra = ? WHERE id % 3 = 0", (text(rng, 20),))
    p.run("INSERT INTO t(id, n, s, extra) VALUES (100000, 1, 'added', ?)", (text(rng, 5000),))


def _rollback(p: Pair, rng: random.Random) -> None:
    p.run("BEGIN")
    p.run("INSERT INTO t(id, s) VALUES (777777, 'rolled back')")
    p.run("UPDATE t SET n = -1")
    p.run("DELETE FROM t WHERE id % 2 = 0")
    p.run("ROLLBACK")
    assert p.run("SELECT count(*) FROM t WHERE id = 777777 OR n = -1") == [(0,)]


def _big_rollback(p: Pair, rng: random.Random) -> None:
    """Roll back a transaction big enough to be spilled by SQLite and staged to KV."""
    p.run("PRAGMA cache_size = 20")
    p.run("BEGIN")
    p.run("UPDATE t SET b = randomblob(3000), n = n + 1")
    p.run_many(
        "INSERT INTO t(id, b) VALUES (?, ?)", [(10**6 + i, blob(rng, 6000)) for i in range(300)]
    )
    p.run("ROLLBACK")
    p.run("INSERT INTO t(id, s) VALUES (2000000, 'after rollback')")


def _savepoints(p: Pair, rng: random.Random) -> None:
    p.run("SAVEPOINT a")
    p.run("INSERT INTO t(id, s) VALUES (500001, 'kept a')")
    p.run("SAVEPOINT b")
    p.run("INSERT INTO t(id, s) VALUES (500002, 'undone b')")
    p.run("UPDATE t SET s = 'undone too' WHERE id < 10")
    p.run("ROLLBACK TO b")
    p.run("INSERT INTO t(id, s) VALUES (500003, ?)", (text(rng, 9000),))
    p.run("SAVEPOINT c")
    p.run("DELETE FROM t WHERE id = 500001")
    p.run("RELEASE c")
    p.run("RELEASE a")
    assert p.run("SELECT id FROM t WHERE id > 500000 ORDER BY id") == [(500003,)]


def _count(p: Pair, rng: random.Random) -> None:
    assert p.run("SELECT count(*) FROM t")[0][0] > 0
    p.run("DELETE FROM t WHERE n % 7 = 3")
    p.run("SELECT count(*), sum(n), min(id), max(id) FROM t")


def _index(p: Pair, rng: random.Random) -> None:
    p.run("CREATE INDEX t_n ON t(n)")
    plan = p.db.execute("EXPLAIN QUERY PLAN SELECT id FROM t WHERE n BETWEEN 10 AND 20")
    assert "t_n" in str(plan.fetchall())
    for _ in range(20):
        lo = rng.randrange(-(2**40), 2**40)
        p.run("SELECT id, n FROM t WHERE n BETWEEN ? AND ? ORDER BY n, id", (lo, lo + 2**36))
    p.run("UPDATE t SET n = n + 1 WHERE n < 0")
    p.run("SELECT count(*) FROM t WHERE n >= 0")


def _delete_most(p: Pair, rng: random.Random) -> None:
    p.run("DELETE FROM t WHERE id % 20 != 0")


def _vacuum(p: Pair, rng: random.Random) -> None:
    p.run("VACUUM")


WORKLOADS: dict[str, Workload] = {
    "one-row": Workload([_create, _one_row]),
    "100-rows-100-transactions": Workload([_create, _rows_in_own_transactions]),
    "100-rows-one-transaction": Workload([_create, _rows_in_one_transaction(100, 100)]),
    "1MiB-text": Workload([_create, _big_text, _replace_big_text]),
    "1000x10KiB-one-transaction": Workload([_create, _blobs_10k]),
    "10000-rows-one-transaction": Workload([_create, _small_rows]),
    "alter-table-add-column": Workload(
        [_create, _rows_in_one_transaction(50, 200), _alter_add_column]
    ),
    "rollback": Workload([_create, _rows_in_one_transaction(200, 300), _rollback]),
    "rollback-staged": Workload(
        [_create, _rows_in_one_transaction(300, 2000), _big_rollback, _count],
        {"stage_pages": 32},
    ),
    "savepoints": Workload([_create, _rows_in_one_transaction(20, 100), _savepoints]),
    "count": Workload([_create, _small_rows, _count]),
    "indexed-where": Workload([_create, _small_rows, _index]),
    "vacuum": Workload(
        [
            _create,
            _rows_in_one_transaction(500, 4000),
            _delete_most,
            _vacuum,
            _rows_in_one_transaction(50, 100),
        ]
    ),
}


def _workload_params() -> list[Any]:
    return [
        pytest.param(name, reopen, id=f"{name}-{'reopen-between-steps' if reopen else 'same-db'}")
        for name in WORKLOADS
        for reopen in (False, True)
    ]


@pytest.mark.parametrize(("name", "reopen"), _workload_params())
def test_workload_matches_sqlite(ns: ActorKv, tmp_path: Path, name: str, reopen: bool) -> None:
    workload = WORKLOADS[name]
    rng = random.Random(name)
    pair = Pair(ns, tmp_path / "oracle.db", **workload.options)
    try:
        for step in workload.steps:
            step(pair, rng)
            pair.check()
            if reopen:
                before = pair.db.generation
                pair.reopen()
                assert pair.db.generation > before
                pair.check()
        # Whatever happened, the committed content survives a final reopen.
        pair.reopen()
        pair.check()
    finally:
        pair.close()


@pytest.mark.parametrize("compacted", [False, True], ids=["deltas", "compacted"])
def test_vacuum_returns_storage(compacted: bool, ns: ActorKv, tmp_path: Path) -> None:
    """VACUUM of a database whose pages sit in deltas, or in the base after a compaction: either
    way the stored bytes must follow the file down without an explicit `compact()` (in the base,
    the pages past the new end are garbage the automatic compaction must count)."""
    rng = random.Random(7)
    pair = Pair(ns, tmp_path / "oracle.db")
    try:
        _create(pair, rng)
        for _ in range(4):
            _rows_in_one_transaction(250, 4000)(pair, rng)
        if compacted:
            pair.db.compact()
        full = ns.used_bytes()
        assert full > 4 * MiB
        _delete_most(pair, rng)
        pages_before = page_count(pair.db)
        _vacuum(pair, rng)
        pair.check()
        assert page_count(pair.db) < pages_before / 5
        # 1 row in 20 is left: the stored bytes follow the file down, not just the page count.
        assert ns.used_bytes() < full / 4, (full, ns.used_bytes(), pair.db.metrics())
        pair.db.compact()
        assert ns.used_bytes() < full / 4
        pair.reopen()
        pair.check()
    finally:
        pair.close()


# -- pinned settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"cache_pages": 0}, ValueError, "option cache_pages must be at least 1, got 0"),
        ({"stage_pages": 0}, ValueError, "option stage_pages must be at least 1, got 0"),
        ({"stage_pages": -5}, ValueError, "option stage_pages must be at least 1, got -5"),
        ({"compact_deltas": 0}, ValueError, "option compact_deltas must be at least 1, got 0"),
        ({"compact_pages": -1}, ValueError, "option compact_pages must be at least 1, got -1"),
        ({"cache_pages": "10"}, TypeError, "option cache_pages must be int, not str"),
        ({"stage_pages": True}, TypeError, "option stage_pages must be int, not bool"),
        ({"auto_compact": "no"}, TypeError, "option auto_compact must be bool, not str"),
        ({"cache_size": 10}, TypeError, "unknown option 'cache_size'; the options are cache_"),
    ],
)
def test_bad_options_are_rejected_by_name_before_the_takeover(
    memory_ns: ActorKv, options: dict[str, object], error: type[Exception], message: str
) -> None:
    with open_database(memory_ns) as db:
        db.execute("CREATE TABLE t(x)")
    before = memory_ns.generation(), memory_ns.list()
    with pytest.raises(error) as raised:
        open_database(memory_ns, **options)
    assert str(raised.value).startswith(message)
    assert (memory_ns.generation(), memory_ns.list()) == before


@pytest.mark.parametrize(
    ("kv", "lacks"), [(None, "lacks limits, get, list"), ("memory://", "str lacks limits")]
)
def test_an_object_without_the_actor_kv_methods_is_rejected_by_name(kv: object, lacks: str) -> None:
    with pytest.raises(TypeError, match="open_database needs an object with the ActorKv methods"):
        open_database(kv)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=lacks):
        open_database(kv)  # type: ignore[arg-type]


def test_a_closed_database_never_writes_again(memory_ns: ActorKv) -> None:
    db = open_database(memory_ns)
    db.execute("CREATE TABLE t(x)")
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    stored = memory_ns.list()
    with pytest.raises(apsw.ConnectionClosedError, match="the database is closed"):
        db.compact()
    with pytest.raises(apsw.ConnectionClosedError):
        db.execute("INSERT INTO t VALUES (2)")
    db.close()
    assert memory_ns.list() == stored


def test_compaction_and_metrics_from_another_thread_while_committing(memory_ns: ActorKv) -> None:
    """One thread commits (each commit takes the page store's lock several times, and every
    eighth runs auto-compaction under it), another compacts and reads metrics meanwhile. The lock
    is not reentrant, so a locked path that took it again would deadlock: both run on daemon
    threads and a stuck one fails the test instead of hanging it."""
    db = open_database(memory_ns, compact_deltas=8, in_place_commits=False)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    rows = [random.randbytes(100) for _ in range(400)]
    done, started = threading.Event(), threading.Event()
    seen: Counter[str] = Counter()
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            started.wait(10)
            for i, row in enumerate(rows):
                db.execute("INSERT INTO t(v) VALUES (?)", (row,))
                if i % 50 == 0:  # 400 commits take a few ms, less than a GIL switch interval
                    time.sleep(0.001)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def compact_meanwhile() -> None:
        try:
            while not done.is_set():
                db.metrics()
                seen["metrics"] += 1
                started.set()
                try:
                    db.compact()
                    seen["compactions"] += 1
                except RuntimeError as e:  # the committing thread is inside a transaction
                    assert "inside a transaction" in str(e)
                time.sleep(0.001)  # leave the committer room to compact by itself
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f, daemon=True) for f in (commit, compact_meanwhile)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "deadlock: a thread never finished"
    assert errors == []
    metrics = db.metrics()
    assert metrics["commits"] == 401
    assert seen["compactions"] > 0 and seen["metrics"] > 0, seen
    assert metrics["compactions"] > seen["compactions"], "the committer never compacted by itself"
    db.close()
    with open_database(memory_ns) as reopened:
        assert [r[0] for r in reopened.execute("SELECT v FROM t ORDER BY id")] == rows
        assert reopened.execute("PRAGMA integrity_check").get == "ok"


def test_options_made_directly_are_checked_too() -> None:
    with pytest.raises(ValueError, match="option stage_pages must be at least 1, got 0"):
        Options(stage_pages=0)


def test_pinned_settings(ns: ActorKv) -> None:
    with open_database(ns) as db:
        assert db.execute("PRAGMA journal_mode").fetchall() == [("memory",)]
        assert db.execute("PRAGMA page_size").fetchall() == [(4096,)]
        assert db.execute("PRAGMA locking_mode").fetchall() == [("exclusive",)]
        assert db.execute("PRAGMA temp_store").fetchall() == [(2,)]
        db.execute("CREATE TABLE t(x)")
        db.execute("INSERT INTO t VALUES (1)")
        for mode in ("WAL", "DELETE", "wal", "'truncate'", "PERSIST"):
            with pytest.raises(apsw.SQLError, match="journal_mode"):
                db.execute(f"PRAGMA journal_mode = {mode}")
            assert db.execute("PRAGMA journal_mode").fetchall() == [("memory",)]
        # Re-asserting a pinned value is harmless.
        assert db.execute("PRAGMA journal_mode = MEMORY").fetchall() == [("memory",)]
        # Other pinned settings either refuse the change or keep their value.
        for sql in ("PRAGMA locking_mode = NORMAL", "PRAGMA page_size = 65536"):
            with contextlib.suppress(apsw.SQLError):
                db.execute(sql).fetchall()
        db.execute("VACUUM")
        assert db.execute("PRAGMA page_size").fetchall() == [(4096,)]
        assert db.execute("PRAGMA locking_mode").fetchall() == [("exclusive",)]
        assert db.execute("SELECT * FROM t").fetchall() == [(1,)]
    with open_database(ns) as db:
        assert db.execute("PRAGMA page_size").fetchall() == [(4096,)]
        assert db.execute("PRAGMA journal_mode").fetchall() == [("memory",)]
        assert db.execute("SELECT * FROM t").fetchall() == [(1,)]


def test_journal_and_temp_files_never_reach_kv(memory_ns: ActorKv) -> None:
    """Temp tables, sorts and journals stay in memory: only the database format's keys exist."""
    with open_database(memory_ns) as db:
        db.execute("CREATE TABLE t(x)")
        db.execute("CREATE TEMP TABLE tmp(y)")
        db.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 5000) "
            "INSERT INTO tmp SELECT i FROM c"
        )
        db.execute("BEGIN")
        db.execute("INSERT INTO t SELECT y * 2 FROM tmp ORDER BY random()")
        db.execute("COMMIT")
        assert db.execute("SELECT count(*), sum(x) FROM t").fetchall() == [(5000, 5000 * 5001)]
    prefixes = {key[:2] for key, _ in memory_ns.list()}
    assert prefixes <= {b"\x01H", b"\x01X", b"\x01D", b"\x01B", b"\x01Y"}


def test_the_file_opens_once(memory_ns: ActorKv) -> None:
    """A second pager on the same file (ATTACH, or a connection on the VFS's name) would read
    stale pages and its writes would bypass the first one's: both are refused."""
    with open_database(memory_ns) as db:
        db.execute("CREATE TABLE t(x)")
        with pytest.raises(apsw.CantOpenError, match="already open"):
            db.execute("ATTACH 'pagekv.db' AS again")
        with pytest.raises(apsw.CantOpenError, match="already open"):
            apsw.Connection("pagekv.db", vfs=db._vfs.vfs_name)
        db.execute("INSERT INTO t VALUES (1)")
        assert db.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_the_in_memory_journal_header_is_not_padded_to_a_4k_sector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The file reports `SQLITE_IOCAP_POWERSAFE_OVERWRITE`, so SQLite sizes its journal header by a
    512-byte sector, not by `xSectorSize`'s 4 KiB: a one-row transaction's in-memory journal (a
    header, then the page it changed) takes about 3.5 KiB less of SQLite's memory than under a
    file that reports no characteristics, and that much less zeroing and copying per commit."""

    class NoCharacteristics(PageFile):
        def xDeviceCharacteristics(self) -> int:
            return 0

    def journal_bytes(file_class: type[PageFile]) -> int:
        monkeypatch.setattr(pagekv.vfs.page_vfs, "PageFile", file_class)
        with open_database(open_kv("memory://").namespace("a")) as db:
            db.execute("CREATE TABLE t(x)")
            db.execute("INSERT INTO t VALUES (1)")
            db.execute("BEGIN")
            before = apsw.memory_used()
            db.execute("INSERT INTO t VALUES (2)")
            used = apsw.memory_used() - before
            db.execute("COMMIT")
            return used

    padded = journal_bytes(NoCharacteristics)
    powersafe = journal_bytes(PageFile)
    assert padded - powersafe >= 3 * 1024, (padded, powersafe)


# -- read-only snapshots ---------------------------------------------------------------------


def test_read_only_snapshot(ns: ActorKv) -> None:
    rng = random.Random(3)
    rows = [(i, blob(rng, rng.randrange(10, 20_000))) for i in range(200)]
    writer = open_database(ns)
    try:
        writer.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        with writer.connection:
            writer.connection.executemany("INSERT INTO t VALUES (?, ?)", rows)
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (1000, x'ff')")  # not committed

        counting = CountingKv(ns)
        with open_database(counting, read_only=True) as snap:
            assert snap.read_only
            assert snap.execute("SELECT * FROM t ORDER BY id").fetchall() == rows
            assert integrity(snap.connection) == [("ok",)]
            for sql in (
                "INSERT INTO t VALUES (5000, x'00')",
                "DELETE FROM t",
                "CREATE TABLE u(x)",
            ):
                with pytest.raises(apsw.ReadOnlyError):
                    snap.execute(sql)
            assert snap.execute("SELECT count(*) FROM t").fetchall() == [(200,)]
        assert counting.stats.writes == 0, counting.stats.round_trips
        assert counting.stats.round_trips["takeover"] == 0

        # The writer was not taken over: it still commits.
        writer.execute("COMMIT")
        assert not writer.is_dead
        assert writer.execute("SELECT count(*) FROM t").fetchall() == [(201,)]
    finally:
        writer.close()
    with open_database(ns, read_only=True) as snap:
        assert snap.execute("SELECT count(*) FROM t").fetchall() == [(201,)]


def test_a_snapshot_reads_only_its_own_incarnation_of_a_dropped_database(ns: ActorKv) -> None:
    """What `pagekv inspect` and the inspector meet beside a writer that destroys and re-creates
    an actor: a snapshot (of a database too big to read whole at its open) that keeps scanning
    after the drop returns the old rows or fails with `SnapshotExpired`, never the new rows."""

    def build(tag: str) -> None:
        with open_database(ns) as db:
            db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, tag TEXT, pad BLOB)")
            with db.connection:
                db.connection.executemany(
                    "INSERT INTO t(tag, pad) VALUES (?, randomblob(3000))", [(tag,)] * 1500
                )
            db.compact()

    build("old")
    snap = open_database(ns, read_only=True, cache_pages=16)
    try:
        rows = snap.execute("SELECT tag FROM t")
        seen = [next(rows)[0] for _ in range(10)]
        ns.drop()
        build("new")
        with pytest.raises(apsw.IOError, match="since this snapshot"):
            seen += [tag for (tag,) in rows]
        assert set(seen) == {"old"}
        assert isinstance(snap.take_last_kv_error(), SnapshotExpired)
    finally:
        snap.close()
    with open_database(ns, read_only=True) as again:
        assert again.execute("SELECT DISTINCT tag FROM t").fetchall() == [("new",)]


def test_read_only_snapshot_of_an_empty_namespace_never_writes(ns: ActorKv) -> None:
    counting = CountingKv(ns)
    with open_database(counting, read_only=True) as snap:
        assert snap.execute("SELECT count(*) FROM sqlite_schema").fetchall() == [(0,)]
        with pytest.raises(apsw.ReadOnlyError):
            snap.execute("CREATE TABLE t(x)")
    assert counting.stats.writes == 0, counting.stats.round_trips
    assert list(ns.list()) == []


# -- huge transactions -----------------------------------------------------------------------


def test_100MiB_transaction_keeps_memory_bounded(
    memory_ns: ActorKv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 x 1 MiB blobs in one transaction: staged to KV early, never all held in memory.

    The memory:// store keeps what was staged in this process, so the Python memory that is not
    the store's own content (`traced peak - ns.used_bytes()` before the statement) is what the VFS
    holds; it must stay far below the 100 MiB that went through.
    """
    stage_pages = 1024
    blobs = 100
    peak_dirty = 0

    class ObservedFile(PageFile):
        def xWrite(self, data: bytes, offset: int) -> None:
            nonlocal peak_dirty
            super().xWrite(data, offset)
            peak_dirty = max(peak_dirty, len(self.store.transaction.dirty))

    monkeypatch.setattr(pagekv.vfs.page_vfs, "PageFile", ObservedFile)
    rng = random.Random(100)
    excess = 0
    tracemalloc.start()
    try:
        db = open_database(
            memory_ns, stage_pages=stage_pages, auto_compact=False, in_place_commits=False
        )
        try:
            db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
            db.execute("BEGIN")
            for i in range(blobs + 1):
                tracemalloc.reset_peak()
                stored = memory_ns.used_bytes()
                if i < blobs:
                    db.execute("INSERT INTO t VALUES (?, ?)", (i, rng.randbytes(MiB)))
                else:
                    db.execute("COMMIT")
                excess = max(excess, tracemalloc.get_traced_memory()[1] - stored)
            metrics = db.metrics()
        finally:
            db.close()
    finally:
        tracemalloc.stop()
    assert metrics["stage_batches"] > 0
    assert metrics["commits_staged"] >= 1
    assert metrics["pages_committed"] > blobs * MiB // 4096
    # Staging kicks in at the threshold: the dirty set never grows past it.
    assert 0 < peak_dirty < stage_pages
    assert memory_ns.used_bytes() > blobs * MiB
    assert excess < 60 * MiB, f"VFS held {excess / MiB:.1f} MiB beyond the stored bytes"

    with open_database(memory_ns) as db:
        rng = random.Random(100)
        count = 0
        for i, b in db.execute("SELECT id, b FROM t ORDER BY id"):
            assert i == count
            assert b == rng.randbytes(MiB), f"blob {i} differs after reopen"
            count += 1
        assert count == blobs
        assert integrity(db.connection) == [("ok",)]
