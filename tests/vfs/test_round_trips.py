"""Round trips and KV limits: what the VFS asks of the KV store, counted with `CountingKv`.

Round trips, not Python, set pagekv's speed, so these are the performance tests: a small commit is
one write, a warm read is free, big commits take as few batches as the limits allow, opening costs
the same at any size, cold scans read ahead, compaction keeps the open cost flat, and no request
ever breaks a `KvLimits` bound.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import apsw
import pytest

from pagekv.kv import (
    ActorKv,
    CountingKv,
    Fault,
    FaultKind,
    FaultyKv,
    FenceMismatch,
    InjectedIndeterminate,
    InjectedUnavailable,
    KvLimits,
    MemoryStore,
    entry_size,
)
from pagekv.vfs import Database, DatabaseDead, open_database
from pagekv.vfs.batch_planner import BatchPlanner, encode_batch
from pagekv.vfs.format import (
    BASE_END,
    COMPACT_SHRINKS,
    DELTA_PREFIX,
    HEAD_KEY,
    INDEX_PREFIX,
    Head,
    base_key,
    parse_base_key,
)

KiB = 1024
MiB = 1024 * KiB
PAGE = 4096


def page_count(db: Database) -> int:
    return db.execute("PRAGMA page_count").fetchall()[0][0]


def integrity(db: Database) -> list[tuple[Any, ...]]:
    return db.execute("PRAGMA integrity_check").fetchall()


def fresh_ns(limits: KvLimits | None = None) -> ActorKv:
    return MemoryStore(limits=limits).namespace("actor-1")


def open_cost(kv: ActorKv, **options: Any) -> Counter[str]:
    """Round trips of one `open_database` (the database is closed again)."""
    counting = CountingKv(kv)
    db = open_database(counting, **options)
    cost = Counter(counting.stats.round_trips)
    db.close()
    return cost


def fill_blobs(db: Database, count: int, size: int, seed: int, *, one_transaction: bool) -> None:
    rng = random.Random(seed)
    db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, b BLOB)")
    if one_transaction:
        db.execute("BEGIN")
    for i in range(count):
        db.execute("INSERT INTO t VALUES (?, ?)", (i, rng.randbytes(size)))
    if one_transaction:
        db.execute("COMMIT")


def check_blobs(db: Database, count: int, size: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = db.execute("SELECT id, b FROM t ORDER BY id").fetchall()
    assert [i for i, _ in rows] == list(range(count))
    for i, b in rows:
        assert b == rng.randbytes(size), f"blob {i} differs"


# -- commits and warm reads ------------------------------------------------------------------


@pytest.fixture
def warm() -> tuple[Database, CountingKv]:
    counting = CountingKv(fresh_ns())
    db = open_database(counting)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    db.execute("INSERT INTO t VALUES (1, 'warm')")
    db.execute("SELECT * FROM t").fetchall()
    counting.reset()
    return db, counting


def test_small_commit_is_exactly_one_write(warm: tuple[Database, CountingKv]) -> None:
    db, counting = warm
    db.execute("INSERT INTO t VALUES (2, 'x')")
    assert counting.stats.round_trips == Counter({"write": 1})
    for i in range(3, 53):
        counting.reset()
        db.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}"))
        assert counting.stats.round_trips == Counter({"write": 1}), f"commit {i}"
    counting.reset()
    with db.connection:  # an explicit transaction of a few statements is one commit too
        db.execute("UPDATE t SET v = 'updated' WHERE id < 10")
        db.execute("DELETE FROM t WHERE id = 20")
    assert counting.stats.round_trips == Counter({"write": 1})
    db.close()


def test_a_small_commit_that_shrinks_the_file_is_one_write_too() -> None:
    """SQLite truncates after `SQLITE_FCNTL_SYNC`; the size it truncates to is in page 1's
    header, so the truncation goes into the same KV write, and the reopened file has it."""
    counting = CountingKv(fresh_ns())
    db = open_database(counting, auto_compact=False, in_place_commits=False)
    db.execute("PRAGMA auto_vacuum = FULL")
    db.execute("CREATE TABLE t(x)")
    for _ in range(20):
        db.execute("INSERT INTO t VALUES (randomblob(3000))")
    assert page_count(db) > 20
    for deleted in ("rowid > 5", "rowid > 2"):
        counting.reset()
        db.execute(f"DELETE FROM t WHERE {deleted}")
        assert counting.stats.round_trips == Counter({"write": 1}), deleted
    pages = page_count(db)
    assert pages < 8
    db.close()
    with open_database(counting, read_only=True) as again:
        assert again.metrics()["size_bytes"] == pages * PAGE
        assert again.execute("SELECT count(*) FROM t").fetchall() == [(2,)]
        assert integrity(again) == [("ok",)]


def test_warm_select_costs_nothing(warm: tuple[Database, CountingKv]) -> None:
    db, counting = warm
    assert db.execute("SELECT * FROM t").fetchall() == [(1, "warm")]
    assert db.execute("SELECT count(*) FROM t WHERE v LIKE 'w%'").fetchall() == [(1,)]
    assert counting.stats.total == 0, counting.stats.round_trips
    # Pages this instance wrote itself are warm too: reading back a fresh 1 MiB costs nothing.
    payload = random.Random(1).randbytes(MiB)
    db.execute("INSERT INTO t VALUES (2, ?)", (payload,))
    counting.reset()
    assert db.execute("SELECT v FROM t WHERE id = 2").fetchall() == [(payload,)]
    assert counting.stats.total == 0, counting.stats.round_trips
    db.close()


@pytest.mark.parametrize(("size", "max_writes"), [(MiB, 3), (10 * MiB, 13)], ids=["1MiB", "10MiB"])
def test_blob_insert_writes(warm: tuple[Database, CountingKv], size: int, max_writes: int) -> None:
    db, counting = warm
    payload = random.Random(size).randbytes(size)
    db.execute("INSERT INTO t VALUES (2, ?)", (payload,))
    assert counting.stats.round_trips["write"] <= max_writes, counting.stats.round_trips
    assert counting.stats.writes <= max_writes, counting.stats.round_trips
    # The bytes written are the blob plus small overhead, not a multiple of it.
    assert size <= counting.stats.bytes_written < size * 1.1
    kv = counting.inner
    db.close()
    with open_database(kv) as db:
        assert db.execute("SELECT v FROM t WHERE id = 2").fetchall() == [(payload,)]


def test_only_a_multi_batch_commit_asks_for_the_usage_first() -> None:
    """The quota check ahead of a commit of several batches (`Committer._check_quota`) costs
    one `used_bytes`, on that path alone: a one-batch commit, in place or as a delta, is
    still one write, and a multi-batch commit the check refuses writes nothing."""
    counting = CountingKv(fresh_ns(KvLimits(max_storage_bytes=4 * MiB)))
    db = open_database(counting)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    for statement in ("INSERT INTO t VALUES (1, 'x')", "UPDATE t SET b = 'y'"):
        counting.reset()
        db.execute(statement)
        assert counting.stats.round_trips == Counter({"write": 1}), statement
    counting.reset()
    db.execute("INSERT INTO t VALUES (2, ?)", (random.Random(1).randbytes(MiB),))
    batches = counting.stats.round_trips["write"]
    assert batches > 1
    assert counting.stats.round_trips == Counter({"used_bytes": 1, "write": batches})
    counting.reset()
    with pytest.raises(apsw.FullError):
        db.execute("INSERT INTO t VALUES (3, ?)", (random.Random(2).randbytes(3 * MiB),))
    assert counting.stats.round_trips == Counter({"used_bytes": 1})
    counting.reset()
    db.execute("UPDATE t SET b = 'z' WHERE id = 1")
    assert counting.stats.round_trips == Counter({"write": 1})
    assert not db.is_dead
    db.close()


# -- opening ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compacted", [True, False], ids=["compacted", "deltas"])
def test_open_cost_is_independent_of_size(compacted: bool) -> None:
    costs = []
    for blobs in (1, 100):
        kv = fresh_ns()
        with open_database(kv, auto_compact=False, in_place_commits=False) as db:
            fill_blobs(db, blobs, MiB, seed=blobs, one_transaction=blobs > 1)
            if compacted:
                db.compact()
            assert db.metrics()["live_deltas"] == (0 if compacted else 2)
            assert page_count(db) > blobs * MiB // PAGE
        costs.append(open_cost(kv))
        with open_database(kv) as db:
            assert db.execute("SELECT count(*) FROM t").fetchall() == [(blobs,)]
    small, big = costs
    assert small == big, f"open of 1 MiB: {dict(small)}, of 100 MiB: {dict(big)}"
    assert big["takeover"] == 1
    assert big.total() <= 4, big


# -- preload hints ---------------------------------------------------------------------------


def _indexed_table(kv: ActorKv, rows: int = 2000) -> None:
    """About 2.5 MiB (600 pages) with an index, compacted: well past the first read-ahead."""
    rng = random.Random(3)
    with open_database(kv, preload_hints=False) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB)")
        db.execute("CREATE INDEX t_k ON t(k)")
        with db.connection:
            for i in range(rows):
                db.execute(
                    "INSERT INTO t VALUES (?, ?, ?)", (i, f"k{rng.random()}", rng.randbytes(1000))
                )
        db.compact()
        assert page_count(db) > 500


def _lookups(db: Database, ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """What an actor's action might read: rows by key and through the index."""
    out = []
    for i in ids:
        out += db.execute("SELECT id, length(v) FROM t WHERE id = ?", (i,)).fetchall()
        out += db.execute(
            "SELECT count(*) FROM t WHERE k < (SELECT k FROM t WHERE id = ?)", (i,)
        ).fetchall()
    return out


def _wake(
    kv: ActorKv, ids: Sequence[int], **options: Any
) -> tuple[Counter[str], Counter[str], Counter[str], list[tuple[Any, ...]]]:
    """Round trips of the open, of the lookups, and of the close; and what the lookups read."""
    counting = CountingKv(kv)
    db = open_database(counting, **options)
    opened = Counter(counting.stats.round_trips)
    counting.reset()
    rows = _lookups(db, ids)
    looked_up = Counter(counting.stats.round_trips)
    counting.reset()
    db.close()
    return opened, looked_up, Counter(counting.stats.round_trips), rows


def test_a_wake_fetches_the_pages_the_last_one_read_with_the_open() -> None:
    kv = fresh_ns()
    _indexed_table(kv)
    ids = [17, 940, 1800]
    opened, cold, closed, rows = _wake(kv, ids)
    assert cold.total() >= 3 and closed == Counter({"write": 1}), (cold, closed)
    assert len(rows) == 2 * len(ids)
    for _ in range(2):
        opened_again, warm, closed, again = _wake(kv, ids)
        assert opened.total() == opened_again.total() == 3, (opened, opened_again)
        assert opened_again["get"] == 1, "the hinted pages come in one get"
        assert warm == Counter() and again == rows, warm
        assert closed == Counter(), "unchanged hints were written again"
    _, unhinted, closed, _ = _wake(kv, ids, preload_hints=False)
    assert unhinted == cold and closed == Counter()


def test_stale_hints_never_serve_an_old_page() -> None:
    """Hints are page numbers: pages rewritten, moved into deltas or cut off by a shrink since
    they were saved are read as they are now."""
    kv = fresh_ns()
    _indexed_table(kv)
    ids = list(range(0, 2000, 97))
    _wake(kv, ids)
    with open_database(kv, preload_hints=False, auto_compact=False, in_place_commits=False) as db:
        db.execute("UPDATE t SET v = zeroblob(10), k = 'changed' WHERE id % 2 = 0")
        db.execute("DELETE FROM t WHERE id >= 1500")
        db.execute("VACUUM")
        expected = _lookups(db, ids)
        assert db.metrics()["live_deltas"] > 0
    opened, _, _, rows = _wake(kv, ids)
    assert opened["get"] == 1, "the open did not fetch the hinted pages"
    assert rows == expected
    with open_database(kv) as db:
        assert db.metrics()["pages_preloaded"] > 1
        assert integrity(db) == [("ok",)]


@pytest.mark.parametrize("kind", list(FaultKind), ids=lambda k: k.value)
def test_a_failed_hint_save_is_kept_not_raised(kind: FaultKind) -> None:
    """Every commit is durable before the close, so a close whose hint write fails still
    closes; the error is kept for `take_last_kv_error` and counted."""
    kv = fresh_ns()
    _indexed_table(kv)
    faulty = FaultyKv(kv)
    db = open_database(faulty)
    rows = _lookups(db, [5, 1500])
    faulty.arm(kind)
    db.close()
    assert faulty.fired_count() == 1
    assert isinstance(db.take_last_kv_error(), (InjectedUnavailable, InjectedIndeterminate))
    assert db.metrics()["hint_save_errors"] == 1
    with open_database(kv) as again:
        assert _lookups(again, [5, 1500]) == rows


# -- cold scans ------------------------------------------------------------------------------

SCAN_ROWS = 12_800  # one ~4 KiB row per page: a ~50 MiB table
SCAN_ROW_BYTES = 4000


def _build_scan_table(kv: ActorKv, layout: str) -> int:
    """Fill a ~50 MiB table; return the database's page count."""
    rng = random.Random(50)
    with open_database(kv, auto_compact=layout == "auto") as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        batch = SCAN_ROWS if layout != "many-commits" else 256
        for start in range(0, SCAN_ROWS, batch):
            with db.connection:
                db.connection.executemany(
                    "INSERT INTO t VALUES (?, ?)",
                    ((i, rng.randbytes(SCAN_ROW_BYTES)) for i in range(start, start + batch)),
                )
        if layout == "compacted":
            db.compact()
        live = db.metrics()["live_deltas"]
        assert (live == 0) == (layout in ("compacted", "auto")), live
        return page_count(db)


def _cold_scan_reads(kv: ActorKv) -> tuple[int, Counter[str]]:
    counting = CountingKv(kv)
    with open_database(counting) as db:
        counting.reset()
        rows = db.execute("SELECT count(*), sum(length(b)), max(b) IS NOT NULL FROM t").fetchall()
        assert rows == [(SCAN_ROWS, SCAN_ROWS * SCAN_ROW_BYTES, 1)]
        assert counting.stats.writes == 0
        return counting.stats.reads, Counter(counting.stats.round_trips)


@pytest.mark.parametrize(
    "layout",
    [
        "compacted",
        "auto",
        "one-commit",
        "many-commits",
    ],
)
def test_cold_full_scan_reads_ahead(layout: str) -> None:
    kv = fresh_ns()
    pages = _build_scan_table(kv, layout)
    assert pages > 12_000
    reads, ops = _cold_scan_reads(kv)
    assert reads <= pages / 100 + 3, f"{reads} reads for {pages} pages: {dict(ops)}"


@pytest.mark.parametrize("layout", ["compacted", "one-commit"])
def test_cold_full_scan_batches_reads(layout: str) -> None:
    """A weaker bound that holds today: every read fetches many pages, never one at a time."""
    kv = fresh_ns()
    pages = _build_scan_table(kv, layout)
    reads, ops = _cold_scan_reads(kv)
    assert reads <= pages / 25, f"{reads} reads for {pages} pages: {dict(ops)}"


# -- KV limits -------------------------------------------------------------------------------


def test_small_commits_write_each_page_once() -> None:
    """In place, a small commit writes its pages over their base pages, with the head, and
    leaves nothing for compaction to copy again: KV bytes ≈ SQLite's page bytes."""
    counting = CountingKv(fresh_ns())
    db = open_database(counting)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    for i in range(600):
        db.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}" * 10))
    metrics = db.metrics()
    db.close()
    assert metrics["commits_in_place"] == metrics["commits"] == 601, metrics
    assert metrics["compactions"] == 0 and metrics["live_deltas"] == 0, metrics
    # A page's key (6 bytes) and value header (21: version, generation, txid, CRC), and about
    # one head record (45) a commit: at most 72 bytes beyond the page.
    assert metrics["kv_bytes_written"] <= metrics["pages_committed"] * (PAGE + 72), metrics
    keys = [key for key, _ in counting.list()]
    assert not [k for k in keys if k.startswith((DELTA_PREFIX, INDEX_PREFIX))], keys[:5]
    with open_database(counting) as again:
        assert again.execute("SELECT count(*) FROM t").fetchall() == [(600,)]
        assert integrity(again) == [("ok",)]


class LimitCheckingKv(CountingKv):
    """Counts calls and records every request that breaks `limits` (which it advertises).

    The inner store may be more permissive, so a violation is recorded, not fatal: the workload
    goes on and the test asserts at the end that nothing was recorded.
    """

    def __init__(self, inner: ActorKv, limits: KvLimits) -> None:
        super().__init__(inner)
        self._checked = limits
        self.violations: list[str] = []
        self.largest: Counter[str] = Counter()

    @property
    def limits(self) -> KvLimits:
        return self._checked

    def _key(self, key: bytes, what: str) -> None:
        if not 0 < len(key) <= self._checked.max_key_bytes:
            self.violations.append(f"{what} of {len(key)} bytes")

    def _note(self, what: str, value: int, allowed: int) -> None:
        self.largest[what] = max(self.largest[what], value)
        if value > allowed:
            self.violations.append(f"{what} = {value} > {allowed}")

    def write(
        self,
        *,
        put: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]] = (),
        delete: Sequence[bytes] = (),
        fence: int | None = None,
    ) -> None:
        lim = self._checked
        items = list(put.items() if isinstance(put, Mapping) else put)
        delete = list(delete)
        for key, value in items:
            self._key(key, "put key")
            self._note("value bytes", len(value), lim.max_value_bytes)
        for key in delete:
            self._key(key, "deleted key")
        self._note("batch entries", len(items) + len(delete), lim.max_batch_entries)
        payload = sum(len(k) + len(v) for k, v in items) + sum(map(len, delete))
        self._note("batch bytes", payload, lim.max_batch_bytes)
        super().write(put=dict(items), delete=delete, fence=fence)

    def get(self, keys: Iterable[bytes]) -> list[bytes | None]:
        keys = list(keys)
        for key in keys:
            self._key(key, "get key")
        self._note("get keys", len(keys), self._checked.max_batch_entries)
        return super().get(keys)

    def list(
        self,
        *,
        prefix: bytes | None = None,
        start: bytes | None = None,
        end: bytes | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        for key in (prefix, start, end):
            if key is not None:
                self._key(key, "list bound")
        return super().list(prefix=prefix, start=start, end=end, limit=limit, reverse=reverse)

    def delete_range(self, start: bytes, end: bytes, *, fence: int | None = None) -> None:
        self._key(start, "delete_range bound")
        self._key(end, "delete_range bound")
        super().delete_range(start, end, fence=fence)


def _limits_workload(kv: ActorKv, **options: Any) -> None:
    rng = random.Random(11)
    with open_database(kv, **options) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        db.execute("INSERT INTO t VALUES (0, ?)", (rng.randbytes(10 * MiB),))
        with db.connection:
            db.connection.executemany(
                "INSERT INTO t VALUES (?, ?)",
                [(i, rng.randbytes(10 * KiB)) for i in range(1, 1001)],
            )
        for i in range(1001, 1301):  # many small commits: auto-compaction
            db.execute("INSERT INTO t VALUES (?, ?)", (i, rng.randbytes(100)))
        db.execute("UPDATE t SET b = randomblob(3000) WHERE id % 3 = 0")
        db.execute("DELETE FROM t WHERE id % 4 = 0")
        db.execute("VACUUM")
        db.compact()
        db.execute("CREATE INDEX t_len ON t(length(b))")
        expected = db.execute("SELECT id, b FROM t ORDER BY id").fetchall()
    with open_database(kv, read_only=True) as snap:  # cold reads with read-ahead
        assert snap.execute("SELECT id, b FROM t ORDER BY id").fetchall() == expected
    with open_database(kv, **options) as db:
        assert db.execute("SELECT id, b FROM t ORDER BY id").fetchall() == expected
        assert integrity(db) == [("ok",)]
        db.execute("DELETE FROM t WHERE id > 100")
        db.execute("VACUUM")
    with open_database(kv, **options) as db:
        assert db.execute("SELECT id, b FROM t ORDER BY id").fetchall() == [
            row for row in expected if row[0] <= 100
        ]
        assert integrity(db) == [("ok",)]


LIMITS = {
    "default": KvLimits(),
    "small": KvLimits(max_value_bytes=16 * KiB, max_batch_bytes=64 * KiB, max_batch_entries=16),
    "few-entries": KvLimits(max_batch_entries=4),
    "small-values": KvLimits(max_value_bytes=4200, max_batch_bytes=40 * KiB),
}


@pytest.mark.parametrize(
    "staged",
    [False, True],
    ids=["buffered", "staged"],
)
@pytest.mark.parametrize("name", list(LIMITS))
def test_no_request_exceeds_the_limits(name: str, staged: bool) -> None:
    limits = LIMITS[name]
    checking = LimitCheckingKv(fresh_ns(), limits)
    options = {"stage_pages": 50, "compact_deltas": 64} if staged else {}
    _limits_workload(checking, **options)
    assert checking.violations == [], checking.violations[:10]
    # The workload really was big enough to reach the limits that matter.
    assert (
        checking.largest["batch bytes"] > limits.max_batch_bytes / 2
        or checking.largest["batch entries"] == limits.max_batch_entries
    ), checking.largest
    assert checking.largest["value bytes"] > limits.max_value_bytes / 2
    assert checking.stats.round_trips["delete_range"] > 0  # compaction ran


@pytest.mark.parametrize("name", list(LIMITS))
def test_staged_transactions_respect_the_limits(name: str) -> None:
    """Early staging and multi-batch commits, each followed by a reopen."""
    limits = LIMITS[name]
    checking = LimitCheckingKv(fresh_ns(), limits)
    rng = random.Random(12)
    rows = [(i, rng.randbytes(rng.choice([100, 5000, 10 * KiB, 300 * KiB]))) for i in range(200)]
    with open_database(checking, stage_pages=40) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        with db.connection:
            db.connection.executemany("INSERT INTO t VALUES (?, ?)", rows)
        assert db.metrics()["stage_batches"] > 0
    with open_database(checking, stage_pages=40) as db:
        with db.connection:
            db.execute("UPDATE t SET b = substr(b, 2) WHERE id % 2 = 0")
        assert db.metrics()["stage_batches"] > 0
    rows = [(i, b[1:] if i % 2 == 0 else b) for i, b in rows]
    with open_database(checking, read_only=True) as snap:
        assert snap.execute("SELECT * FROM t ORDER BY id").fetchall() == rows
    assert checking.violations == [], checking.violations[:10]


@pytest.mark.parametrize("name", list(LIMITS))
def test_the_quota_check_counts_a_commits_batches_as_the_store_charges_them(name: str) -> None:
    planner = BatchPlanner(LIMITS[name])
    rng = random.Random(3)
    batches = planner.plan([(p, rng.randbytes(PAGE)) for p in range(1, 400)], 64)
    assert len(batches) > 1
    charged = chunks = 0
    for part, batch in enumerate(batches):
        puts, _ = encode_batch(7, 5, part, chunks, batch)
        chunks += len(batch.chunks)
        charged += sum(entry_size(key, value) for key, value in puts.items())
    assert planner.stored_bytes(batches) == charged


# -- compaction keeps the open cost flat -----------------------------------------------------


@pytest.mark.parametrize("in_place", [False, True], ids=["deltas", "in-place"])
def test_compaction_bounds_live_deltas_and_open_cost(in_place: bool) -> None:
    """Deltas are folded every `compact_deltas` commits; in-place commits leave none to fold."""
    kv = fresh_ns()
    with open_database(kv, in_place_commits=in_place) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        for i in range(10):
            db.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}"))
    early = open_cost(kv)
    with open_database(kv, in_place_commits=in_place) as db:
        for i in range(10, 1010):
            db.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}"))
        metrics = db.metrics()
        if in_place:
            assert metrics["commits_in_place"] == 1000, metrics
            assert metrics["live_deltas"] == 0 and metrics["compactions"] == 0, metrics
        else:
            assert metrics["commits_in_place"] == 0, metrics
            assert metrics["live_deltas"] < 300, metrics
            assert metrics["compactions"] >= 3, metrics
    counting = CountingKv(kv)
    with open_database(counting) as db:
        late = Counter(counting.stats.round_trips)
        assert db.execute("SELECT count(*), max(id) FROM t").fetchall() == [(1010, 1009)]
    assert late == early, f"open after 10 commits: {dict(early)}, after 1010: {dict(late)}"


def _compaction_round_trips(db: Database) -> Counter[str]:
    before = Counter(db.metrics()["round_trips"])
    assert db.compact() > 0
    return Counter(db.metrics()["round_trips"]) - before


def _base_pages(kv: ActorKv) -> list[int]:
    return [parse_base_key(k) for k, _ in kv.list(start=base_key(0), end=BASE_END)]


def _one_row_commits(db: Database) -> list[tuple[Any, ...]]:
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    for i in range(200):
        db.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}" * 20))
    return db.execute("SELECT * FROM t").fetchall()


def test_a_compaction_pass_over_cached_pages_reads_nothing_and_writes_once() -> None:
    kv = fresh_ns()
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        rows = _one_row_commits(db)
        assert _compaction_round_trips(db) == Counter({"write": 1, "delete_range": 2})
        pages = page_count(db)
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        assert db.execute("SELECT * FROM t").fetchall() == rows
        assert db.metrics()["live_deltas"] == 0
        assert db.metrics()["delta_pages"] == 0
    assert _base_pages(kv) == list(range(1, pages + 1))


def test_a_compaction_pass_reads_the_pages_it_has_not_cached() -> None:
    kv = fresh_ns()
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        rows = _one_row_commits(db)
    with open_database(kv, auto_compact=False, in_place_commits=False, cache_pages=1) as db:
        trips = _compaction_round_trips(db)
        assert trips["get"] >= 1 and trips["write"] == 1, trips
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        assert db.execute("SELECT * FROM t").fetchall() == rows


def _shrunk(kv: ActorKv) -> list[tuple[Any, ...]]:
    """A database whose base pages reach past EOF: compacted big, then shrunk by VACUUM."""
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        fill_blobs(db, 40, 6 * KiB, seed=8, one_transaction=True)
        db.compact()
        db.execute("DELETE FROM t WHERE id >= 4")
        db.execute("VACUUM")
        assert max(_base_pages(kv)) > page_count(db)
        return db.execute("SELECT * FROM t ORDER BY id").fetchall()


def test_a_pass_after_a_shrink_deletes_the_base_past_eof_first() -> None:
    kv = fresh_ns()
    rows = _shrunk(kv)
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        assert _compaction_round_trips(db)["delete_range"] == 3
        pages = page_count(db)
    assert _base_pages(kv) == list(range(1, pages + 1))
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        assert db.execute("SELECT * FROM t ORDER BY id").fetchall() == rows


def test_shrinking_commits_keep_the_head_small_even_with_auto_compaction_off() -> None:
    """Every shrinking commit lists a shrink in the head until a compaction clears them; at
    `COMPACT_SHRINKS` the writer compacts by itself, or the head would grow past the value
    limit and kill the database."""
    kv = fresh_ns()
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        db.execute("PRAGMA auto_vacuum = FULL")
        db.execute("CREATE TABLE t(x)")
        for i in range(2 * COMPACT_SHRINKS):
            db.execute("INSERT INTO t VALUES (randomblob(9000))")
            db.execute("DELETE FROM t")
            shrinks = len(Head.decode(kv.get([HEAD_KEY])[0]).shrinks)
            assert shrinks == (i + 1) % COMPACT_SHRINKS, i
        assert db.metrics()["compactions"] == 2
        db.execute("INSERT INTO t VALUES ('kept')")
    with open_database(kv, read_only=True) as again:
        assert again.execute("SELECT x FROM t").fetchall() == [("kept",)]
        assert integrity(again) == [("ok",)]


@pytest.mark.parametrize("kind", list(FaultKind), ids=lambda k: k.value)
def test_no_base_page_past_eof_survives_a_pass_cut_short_at_any_write(kind: FaultKind) -> None:
    """The invariant that lets a pass without shrinks skip the range delete: cut the pass after a
    shrink at each of its writes in turn, finish with a full pass, and nothing lies past EOF."""
    writes = 4  # the range delete past EOF, the base pages with the head, chunks, index parts
    for index in range(writes):
        kv = fresh_ns()
        rows = _shrunk(kv)
        faulty = FaultyKv(kv, faults=[Fault(index, kind)])
        faulty.enabled = False
        db = open_database(faulty, auto_compact=False, in_place_commits=False)
        faulty.enabled = True
        lost = InjectedUnavailable if kind is FaultKind.FAIL_BEFORE else DatabaseDead
        with pytest.raises(lost) as died:
            db.compact()
        if isinstance(died.value, DatabaseDead):  # an unknown outcome, not a takeover
            assert not died.value.fenced and not isinstance(died.value.cause, FenceMismatch)
        assert faulty.fired_count() == 1, f"fault at write {index} did not fire"
        db.close()
        with open_database(kv, auto_compact=False, in_place_commits=False) as db:
            db.compact()
            pages = page_count(db)
            assert db.execute("SELECT * FROM t ORDER BY id").fetchall() == rows
        assert _base_pages(kv) == list(range(1, pages + 1)), f"{kind.value} at write {index}"


# -- orphans of an interrupted staged commit -------------------------------------------------


def _txids_above_head(kv: ActorKv) -> list[bytes]:
    raw = kv.get([HEAD_KEY])[0]
    head = Head.decode(raw) if raw is not None else Head()
    orphans = []
    for prefix in (DELTA_PREFIX, INDEX_PREFIX):
        for key, _ in kv.list(prefix=prefix):
            assert key[:2] == prefix and len(key) == 2 + 8 + 4
            if struct.unpack(">Q", key[2:10])[0] > head.txid:
                orphans.append(key)
    return orphans


STAGED_OPTIONS = {"stage_pages": 64, "auto_compact": False, "in_place_commits": False}


def _base_content(kv: ActorKv) -> list[tuple[Any, ...]]:
    with open_database(kv, **STAGED_OPTIONS) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        fill_blobs(db, 20, 30 * KiB, seed=5, one_transaction=True)
        return db.execute("SELECT * FROM t ORDER BY id").fetchall()


def _big_transaction(db: Database) -> None:
    rng = random.Random(6)
    db.execute("BEGIN")
    for i in range(100, 110):
        db.execute("INSERT INTO t VALUES (?, ?)", (i, rng.randbytes(MiB)))
    db.execute("COMMIT")


def _writes_of_big_transaction() -> int:
    kv = CountingKv(fresh_ns())
    _base_content(kv)
    with open_database(kv, **STAGED_OPTIONS) as db:
        kv.reset()
        _big_transaction(db)
        assert db.metrics()["stage_batches"] > 2
        return kv.stats.writes  # before the close, which may save preload hints


@pytest.mark.parametrize("where", ["second", "middle", "head-move"])
@pytest.mark.parametrize("kind", [FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE])
def test_orphans_of_an_interrupted_staged_commit_are_removed_at_open(
    where: str, kind: FaultKind
) -> None:
    total = _writes_of_big_transaction()
    assert total > 4
    at = {"second": 1, "middle": total // 2, "head-move": total - 1}[where]
    kv = fresh_ns()
    before = _base_content(kv)

    counting = CountingKv(kv)
    # A far-off fault makes FaultyKv count write ops from the start; all of them reach `counting`.
    faulty = FaultyKv(counting, faults=[Fault(at=10**9, kind=FaultKind.FAIL_BEFORE)])
    db = open_database(faulty, **STAGED_OPTIONS)
    faulty.add(Fault(at=counting.stats.writes + at, kind=kind))
    with pytest.raises(apsw.Error):
        _big_transaction(db)
    assert faulty.fired_count() == 1
    assert db.is_dead
    error = db.take_last_kv_error()
    assert error is not None
    injected = InjectedUnavailable if kind is FaultKind.FAIL_BEFORE else InjectedIndeterminate
    assert isinstance(error, injected), repr(error)
    db.close()

    orphans = _txids_above_head(kv)
    committed = kind is FaultKind.APPLY_THEN_RAISE and where == "head-move"
    if not committed:
        assert orphans, "the interrupted commit left no chunks behind; the test proves nothing"

    counting = CountingKv(kv)
    with open_database(counting, **STAGED_OPTIONS) as db:
        assert counting.stats.round_trips["delete_range"] <= 4
        assert _txids_above_head(kv) == []
        if orphans:
            assert db.metrics()["orphan_cleanups"] > 0
        rows = db.execute("SELECT * FROM t WHERE id < 100 ORDER BY id").fetchall()
        assert rows == before
        big = db.execute("SELECT count(*) FROM t WHERE id >= 100").fetchall()[0][0]
        assert big == (10 if committed else 0)
        assert integrity(db) == [("ok",)]
        # The next commit reuses the orphans' txid; nothing of theirs may leak into it.
        db.execute("INSERT INTO t VALUES (1000, x'01')")
    with open_database(kv) as db:
        assert db.execute("SELECT * FROM t WHERE id < 100 ORDER BY id").fetchall() == before
        assert db.execute("SELECT count(*) FROM t WHERE id >= 100 AND id < 1000").fetchall() == [
            (10 if committed else 0,)
        ]
        assert db.execute("SELECT b FROM t WHERE id = 1000").fetchall() == [(b"\x01",)]
        assert integrity(db) == [("ok",)]


def test_limits_too_small_for_any_commit_fail_at_open_and_change_nothing() -> None:
    kv = fresh_ns(KvLimits(max_batch_entries=2))
    with pytest.raises(ValueError, match="cannot hold a commit"):
        open_database(kv)
    assert kv.generation() == 0
