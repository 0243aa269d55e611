"""Fault matrix: every KV operation of each storage action fails in turn, before and after applying.

For each scenario the action runs once fault-free to learn how many KV calls it makes and what the
database looks like afterwards. Then, for every call index and both fault kinds, a fresh namespace
gets the same setup, the action runs with exactly that call broken, and a fresh instance reopens
the namespace: its content must be the old state or the new one (never a mix), the integrity check
must pass, an acknowledged action must be visible, and the injected fault must have fired.

Every test runs on each KV backend (`new_ns` in conftest.py): the faults are injected above the
backend, so the matrix checks that the VFS and each store together keep a commit all-or-nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import apsw
import pytest

from pagekv.kv import (
    READ_OPS,
    WRITE_OPS,
    ActorKv,
    Fault,
    FaultKind,
    FaultyKv,
    FenceMismatch,
    KvLimits,
    StorageQuotaExceeded,
)
from pagekv.kv.wrappers import KvWrapper
from pagekv.vfs import Database, open_database
from pagekv.vfs.format import PREFIX

NewNamespace = Callable[..., ActorKv]
"""`new_ns(limits=None)` from conftest.py: a fresh namespace of the backend under test."""

ALL_OPS = READ_OPS | WRITE_OPS
State = dict[str, list[tuple[object, ...]]]


def content(db: Database) -> State:
    tables = [
        r[0]
        for r in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
    ]
    return {t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}


def check_integrity(db: Database) -> None:
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def blob(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[Database], None]
    action: Callable[[Database], object]
    options: dict[str, int | bool]
    action_opens: bool = False
    """The action is opening the database itself (takeover and recovery)."""
    in_place: bool | None = None
    """Whether the action's commit must be in place (None: not a one-commit action)."""


def _base_setup(db: Database) -> None:
    rng = random.Random(1)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    db.execute("CREATE INDEX t_v ON t(v)")
    for _ in range(20):
        db.execute("INSERT INTO t(v) VALUES (?)", (blob(rng, 300),))


def _deltas_setup(db: Database) -> None:
    _base_setup(db)
    rng = random.Random(2)
    for i in range(10):
        db.execute("UPDATE t SET v = ? WHERE id = ?", (blob(rng, 500), i + 1))
    db.execute("INSERT INTO t(v) VALUES (?)", (blob(rng, 200_000),))


def _hinted_setup(db: Database) -> None:
    """Past the first read-ahead window (128 pages), so that an open uses preload hints."""
    _deltas_setup(db)
    rng = random.Random(5)
    with db.connection:
        for _ in range(150):
            db.execute("INSERT INTO t(v) VALUES (?)", (blob(rng, 3000),))


def _orphans_setup(db: Database) -> None:
    _base_setup(db)


def _small_commit(db: Database) -> None:
    db.execute("INSERT INTO t(v) VALUES (?)", (b"small",))


def _staged_commit(db: Database) -> None:
    db.execute("INSERT INTO t(v) VALUES (?)", (blob(random.Random(3), 1_500_000),))


def _early_staged_transaction(db: Database) -> None:
    rng = random.Random(4)
    with db.connection:
        for _ in range(6):
            db.execute("INSERT INTO t(v) VALUES (?)", (blob(rng, 100_000),))
        db.execute("DELETE FROM t WHERE id % 3 = 0")


def _shrink(db: Database) -> None:
    db.execute("DELETE FROM t WHERE length(v) > 1000")
    db.execute("VACUUM")


def _compact(db: Database) -> None:
    db.compact()


def _compact_warm(db: Database) -> None:
    """A pass that takes its pages from the cache, as after a run of commits."""
    db.execute("SELECT * FROM t").fetchall()
    db.compact()


def _open(db: Database) -> None:
    pass


DELTAS: dict[str, int | bool] = {"auto_compact": False, "in_place_commits": False}
"""Every commit a delta, folded only when the test says: what compaction and recovery need."""

SCENARIOS = [
    Scenario("fast-path", _base_setup, _small_commit, {}, in_place=True),
    Scenario(
        "fast-path-delta", _base_setup, _small_commit, {"in_place_commits": False}, in_place=False
    ),
    Scenario("staged", _base_setup, _staged_commit, {}),
    Scenario("early-staging", _base_setup, _early_staged_transaction, {"stage_pages": 40}),
    Scenario("vacuum-shrink", _deltas_setup, _shrink, DELTAS),
    Scenario("compaction", _deltas_setup, _compact, DELTAS),
    Scenario("compaction-warm", _deltas_setup, _compact_warm, DELTAS),
    Scenario("takeover", _deltas_setup, _open, DELTAS, action_opens=True),
    Scenario("takeover-hinted", _hinted_setup, _open, DELTAS, action_opens=True),
]


def _prepare(scenario: Scenario, new_ns: NewNamespace) -> tuple[ActorKv, State]:
    ns = new_ns()
    with open_database(ns, **scenario.options) as db:
        scenario.setup(db)
        old = content(db)
    if scenario.name == "takeover-hinted":
        _learn_hints(ns)
    if scenario.action_opens:
        _leave_orphans(ns)
    return ns, old


def _learn_hints(ns: ActorKv) -> None:
    """A wake that reads rows all over the table, so that its close saves preload hints."""
    with open_database(ns, auto_compact=False, in_place_commits=False) as db:
        db.execute("SELECT length(v) FROM t WHERE id % 7 = 0").fetchall()
    assert db.metrics()["hints_saved"] == 1


def _leave_orphans(ns: ActorKv) -> None:
    """Interrupt a staged commit after its first batch, so the next open must reap orphans."""
    faulty = FaultyKv(ns, faults=[Fault(1, FaultKind.FAIL_BEFORE, frozenset({"write"}))])
    faulty.enabled = False
    db = open_database(faulty, auto_compact=False, in_place_commits=False)
    faulty.enabled = True
    with pytest.raises(apsw.IOError):
        _staged_commit(db)
    assert faulty.fired_count() == 1
    db.close()


def _run(scenario: Scenario, ns: ActorKv, faulty: FaultyKv) -> tuple[bool, bool]:
    """Run the action through `faulty`, then, unless the fault killed the database, commit one
    more row through the same instance: a fault it survived must leave it fit to write on.
    Returns whether the action and that commit were acknowledged (returned normally)."""
    db: Database | None = None
    acknowledged = False
    try:
        if scenario.action_opens:
            faulty.enabled = True
            db = open_database(faulty, **scenario.options)
        else:
            db = open_database(faulty, **scenario.options)
            faulty.enabled = True
        scenario.action(db)
        acknowledged = True
    except (apsw.Error, Exception):
        pass
    faulty.enabled = False
    if db is None:
        return acknowledged, False
    try:
        if db.is_dead:
            return acknowledged, False
        db.execute("CREATE TABLE IF NOT EXISTS later(v)")
        db.execute("INSERT INTO later(v) VALUES ('after the fault')")
        return acknowledged, True
    finally:
        db.close()


def _count_calls(scenario: Scenario, new_ns: NewNamespace) -> tuple[State, State, int]:
    ns, old = _prepare(scenario, new_ns)
    faulty = FaultyKv(ns)
    faulty.enabled = False
    db = open_database(faulty, **scenario.options) if not scenario.action_opens else None
    faulty.enabled = True
    if db is None:
        db = open_database(faulty, **scenario.options)
    scenario.action(db)
    faulty.enabled = False
    calls = faulty.calls
    if scenario.in_place is not None:
        in_place = db.metrics()["commits_in_place"]
        assert in_place == int(scenario.in_place), f"{scenario.name}: {in_place} in place"
    db.close()
    with open_database(ns) as check:
        new = content(check)
    return old, new, calls


_MORE = random.Random(9).randbytes(300_000)


def _write_more(db: Database) -> None:
    """A staged commit after recovery: it must not collide with anything a fault left behind."""
    db.execute("CREATE TABLE IF NOT EXISTS more(v BLOB)")
    db.execute("INSERT INTO more(v) VALUES (?)", (_MORE,))


def _with_more(state: State) -> State:
    return {**state, "more": [*state.get("more", []), (_MORE,)]}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_fault_matrix(scenario: Scenario, new_ns: NewNamespace) -> None:
    old, new, calls = _count_calls(scenario, new_ns)
    assert calls > 0
    if scenario.name not in ("compaction", "compaction-warm") and not scenario.action_opens:
        assert new != old, "the action must change the content, or the matrix proves nothing"
    outcomes: set[tuple[str, bool]] = set()
    ops: set[str] = set()
    for index in range(calls):
        for kind in FaultKind:
            ns, _ = _prepare(scenario, new_ns)
            faulty = FaultyKv(ns, faults=[Fault(index, kind, ALL_OPS)])
            faulty.enabled = False
            acknowledged, wrote_on = _run(scenario, ns, faulty)
            assert faulty.fired_count() == 1, f"fault {kind} at call {index} did not fire"
            ops.add(faulty.fired[0].op)
            label = f"{scenario.name}: {kind.value} at call {index} ({faulty.fired[0].op})"
            with open_database(ns, auto_compact=False, in_place_commits=False) as db:
                after = content(db)
                check_integrity(db)
                _write_more(db)
            with open_database(ns, auto_compact=False, in_place_commits=False) as db:
                assert content(db) == _with_more(after), "a commit after recovery went wrong"
            later = after.pop("later", None)
            assert later == ([("after the fault",)] if wrote_on else None), label
            assert after in (old, new), f"{label}: content is neither the old nor the new state"
            if acknowledged:
                assert after == new, f"{label}: an acknowledged action was lost"
            outcomes.add(("new" if after == new else "old", acknowledged))
    if new != old:
        assert ("old", False) in outcomes, "no fault ever prevented the action"
    if scenario.name == "takeover-hinted":
        assert "get" in ops, "the open did not fetch its hinted pages"


def test_unavailable_before_a_small_commit_is_not_fatal(new_ns: NewNamespace) -> None:
    ns = new_ns()
    faulty = FaultyKv(ns, faults=[Fault(0, FaultKind.FAIL_BEFORE, frozenset({"write"}))])
    faulty.enabled = False
    db = open_database(faulty)
    _base_setup(db)
    faulty.enabled = True
    with pytest.raises(apsw.IOError, match="injected fault"):
        db.execute("INSERT INTO t(v) VALUES (?)", (b"lost",))
    assert faulty.fired_count(FaultKind.FAIL_BEFORE) == 1
    assert not db.is_dead
    db.execute("INSERT INTO t(v) VALUES (?)", (b"kept",))
    rows = [r[0] for r in db.execute("SELECT v FROM t WHERE length(v) = 4")]
    assert rows == [b"kept"]
    db.close()
    with open_database(ns) as again:
        assert [r[0] for r in again.execute("SELECT v FROM t WHERE length(v) = 4")] == [b"kept"]
        check_integrity(again)


@pytest.mark.parametrize("failing", [0, 1], ids=["chunk-delete", "index-delete"])
def test_an_automatic_compaction_whose_deletes_fail_leaves_the_writer_consistent(
    failing: int, new_ns: NewNamespace
) -> None:
    """The pass moved the head, then its deletes failed: the writer must go on from the moved
    head (before, its next commit wrote the old head back over it, pointing at deleted chunks)."""
    ns = new_ns()
    faulty = FaultyKv(ns)
    db = open_database(faulty, compact_deltas=4, cache_pages=1, in_place_commits=False)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    with db.connection:
        for i in range(20):
            db.execute("INSERT INTO t(v) VALUES (?)", (f"row {i}",))
    faulty.arm(FaultKind.FAIL_BEFORE, after=failing, ops=frozenset({"delete_range"}))
    for _ in range(4):  # the fourth commit's pass fails in its deletes
        db.execute("INSERT INTO t(v) VALUES ('one more')")
    assert faulty.fired_count(FaultKind.FAIL_BEFORE) == 1
    assert not db.is_dead
    compactions = db.metrics()["compactions"]
    db.close()
    with open_database(ns) as again:
        assert [r[0] for r in again.execute("SELECT id FROM t")] == list(range(1, 25))
        check_integrity(again)
    assert compactions == 1, "the pass moved the head: it counts"


def test_a_death_after_the_commit_fails_reads_from_the_raw_connection(
    new_ns: NewNamespace,
) -> None:
    """The automatic compaction after a commit dies (its write's outcome unknown). SQLite holds
    the pages in its own cache and, in exclusive mode, would answer reads without asking the
    VFS: the death must reach its pager, so `Database.connection` fails like `execute`."""
    faulty = FaultyKv(new_ns())
    db = open_database(faulty, compact_deltas=1, in_place_commits=False)
    db.execute("CREATE TABLE t(x)")
    db.execute("INSERT INTO t VALUES (1)")
    assert db.connection.execute("SELECT * FROM t").fetchall() == [(1,)]
    faulty.arm(FaultKind.APPLY_THEN_RAISE, after=1)  # the pass after the next commit
    with pytest.raises(apsw.IOError, match="dead"):
        db.execute("INSERT INTO t VALUES (2)")
    assert faulty.fired_count(FaultKind.APPLY_THEN_RAISE) == 1 and db.is_dead
    for _ in range(2):
        with pytest.raises(apsw.IOError, match="dead"):
            db.connection.execute("SELECT * FROM t").fetchall()
    assert type(db.take_last_kv_error()).__name__ == "InjectedIndeterminate"
    db.close()


def test_indeterminate_commit_kills_and_never_resends(new_ns: NewNamespace) -> None:
    ns = new_ns()
    faulty = FaultyKv(ns, faults=[Fault(0, FaultKind.APPLY_THEN_RAISE, frozenset({"write"}))])
    faulty.enabled = False
    db = open_database(faulty)
    _base_setup(db)
    faulty.enabled = True
    with pytest.raises(apsw.IOError):
        db.execute("INSERT INTO t(v) VALUES (?)", (b"maybe",))
    assert db.is_dead
    writes_after_death = faulty.calls
    for sql in ("SELECT count(*) FROM t", "INSERT INTO t(v) VALUES (1)", "SELECT * FROM t"):
        with pytest.raises(apsw.IOError, match="dead"):
            db.execute(sql).fetchall()
    assert faulty.calls == writes_after_death, "a dead database must not touch the KV"
    assert type(db.take_last_kv_error()).__name__ == "InjectedIndeterminate"
    db.close()
    with open_database(ns) as again:
        assert again.execute("SELECT count(*) FROM t WHERE v = 'maybe'").fetchall() == [(0,)] or (
            again.execute("SELECT count(*) FROM t WHERE v = ?", (b"maybe",)).fetchall() == [(1,)]
        )
        check_integrity(again)


@pytest.mark.parametrize("staged", [False, True], ids=["fast", "staged"])
def test_split_brain(staged: bool, new_ns: NewNamespace) -> None:
    ns = new_ns()
    a = open_database(ns)
    a.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    acknowledged = []
    for i in range(5):
        a.execute("INSERT INTO t(v) VALUES (?)", (f"a{i}".encode(),))
        acknowledged.append((i + 1, f"a{i}".encode()))
    b = open_database(ns)
    assert b.generation == a.generation + 1
    stored_at_takeover = ns.list()
    payload = random.Random(5).randbytes(2_000_000 if staged else 10)
    with pytest.raises(apsw.IOError, match="dead"):
        a.execute("INSERT INTO t(v) VALUES (?)", (payload,))
    assert a.is_dead
    assert isinstance(a.take_last_kv_error(), FenceMismatch)
    assert ns.list() == stored_at_takeover, "the stale instance wrote after the takeover"
    assert b.execute("SELECT id, v FROM t ORDER BY id").fetchall() == acknowledged
    b.execute("INSERT INTO t(v) VALUES ('b')")
    check_integrity(b)
    a.close()
    b.close()


def test_limits_of_a_tiny_store_are_never_exceeded_by_commits(new_ns: NewNamespace) -> None:
    limits = KvLimits(max_value_bytes=9000, max_batch_bytes=40_000, max_batch_entries=8)
    ns = new_ns(limits)
    with open_database(ns, stage_pages=16) as db:
        _base_setup(db)
        _staged_commit(db)
        _shrink(db)
        db.compact()
        check_integrity(db)
        rows = content(db)
    with open_database(ns) as again:
        assert content(again) == rows


def _blobs(db: Database, rows: int) -> None:
    """A table `t` of `rows` rows of 3,000 random bytes, one commit each."""
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    for _ in range(rows):
        db.execute("INSERT INTO t(b) VALUES (randomblob(3000))")


@pytest.mark.parametrize(
    ("deltas", "quota"), [("delta-commits", 400_000), ("in-place-after-vacuum", 300_000)]
)
def test_a_commit_refused_by_the_quota_rolls_back_and_the_connection_keeps_working(
    new_ns: NewNamespace, deltas: str, quota: int
) -> None:
    """The refused commit wrote nothing; SQLite then writes the rolled-back pages' old contents
    again from its journal and syncs. That sync used to be a commit of every one of those pages
    as a new delta, refused by the same quota, so every later statement failed with `FullError`
    on a database that was not dead."""
    ns = new_ns(KvLimits(max_storage_bytes=quota))
    with open_database(ns, in_place_commits=deltas != "delta-commits") as db:
        _blobs(db, 25)
        if deltas == "in-place-after-vacuum":
            db.execute("DELETE FROM t WHERE id > 24")
            db.execute("VACUUM")  # a shrink: the commits after it are deltas, not in place
        db.execute("UPDATE t SET b = randomblob(3000) WHERE id = 3")  # a live delta
        assert db.metrics()["live_deltas"] > 0
        before = content(db)
        used = ns.used_bytes()
        with pytest.raises(apsw.FullError, match=f"max_storage_bytes = {quota}"):
            db.execute("UPDATE t SET b = randomblob(3100)")
        assert ns.used_bytes() == used, "the refused commit wrote something"
        assert not db.is_dead
        assert content(db) == before
        check_integrity(db)
        db.execute("UPDATE t SET b = x'00' WHERE id = 4")  # a commit that fits
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after
        check_integrity(again)


def test_a_big_transaction_whose_first_stage_is_refused_rolls_back_alive(
    new_ns: NewNamespace,
) -> None:
    """Staging writes a big transaction's pages early; if the first staged batch is refused by
    the quota, nothing of the transaction is stored, so it rolls back like a refused commit
    instead of killing the database. (For a refusal after a batch was staged, see
    `test_a_later_stage_refused_by_the_quota_deletes_the_staged_and_rolls_back_alive`.)"""
    ns = new_ns(KvLimits(max_storage_bytes=140_000))
    with open_database(ns, stage_pages=16) as db:
        _blobs(db, 20)
        before, used = content(db), ns.used_bytes()
        with pytest.raises(apsw.FullError), db.connection:
            for _ in range(200):
                db.execute("INSERT INTO t(b) VALUES (randomblob(3000))")
        assert db.metrics()["stage_batches"] == 0, "the refusal was not the first stage"
        assert not db.is_dead and ns.used_bytes() == used
        assert content(db) == before
        check_integrity(db)
        db.execute("INSERT INTO t(b) VALUES (x'01')")
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after


def test_a_refused_stage_of_rewritten_pages_rolls_back_alive(new_ns: NewNamespace) -> None:
    """The transaction rewrites more pages than a stage holds, and its first stage is refused:
    SQLite's rollback writes those pages back, more than a stage again, and staging them met
    the same refusal, so every later statement failed (reads too) on a live database."""
    ns = new_ns(KvLimits(max_storage_bytes=200_000))
    with open_database(ns, stage_pages=16) as db:
        _blobs(db, 40)
        before, used = content(db), ns.used_bytes()
        assert used + 16 * 4096 > 200_000, "the first stage would fit"
        with pytest.raises(apsw.FullError):
            db.execute("UPDATE t SET b = randomblob(3000)")
        assert db.metrics()["stage_batches"] == 0 and not db.is_dead
        assert content(db) == before and ns.used_bytes() == used
        db.execute("UPDATE t SET b = x'01' WHERE id = 1")
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after


SMALL_BATCHES = {"max_value_bytes": 9000, "max_batch_bytes": 40_000, "max_batch_entries": 8}
"""Limits under which a batch holds about nine pages, so a commit of a few rows takes several."""
T = TypeVar("T")


def _database_keys(ns: ActorKv) -> list[tuple[bytes, bytes]]:
    """Everything the VFS stores in `ns` (its keys start with `PREFIX`): a refused transaction
    must leave it exactly as it was, with no chunk or index part of its own left over."""
    return ns.list(prefix=PREFIX)


def _write_round_trips(db: Database) -> int:
    trips = db.metrics()["round_trips"]
    assert isinstance(trips, dict)
    return int(trips.get("write", 0))


@pytest.mark.parametrize("where", ["commit", "stage"])
def test_a_multi_batch_transaction_over_the_quota_is_refused_and_the_connection_goes_on(
    new_ns: NewNamespace, where: str
) -> None:
    """A commit of several KV batches used to write its first batches, then meet the quota in
    a later one and kill the database. Now its size is checked against the store's usage
    before its first batch: a commit is refused with nothing written, and a transaction
    staged early (a stage of two batches here) deletes the stages it wrote before the one
    refused. Either way: `FullError`, the data as before, nothing of it left in the store, and
    the next transaction that fits commits on the same connection."""
    quota = 200_000
    ns = new_ns(KvLimits(max_storage_bytes=quota, **SMALL_BATCHES))
    stage_pages = 16 if where == "stage" else 2048
    with open_database(ns, stage_pages=stage_pages) as db:
        _blobs(db, 20)
        before, stored, used = content(db), _database_keys(ns), ns.used_bytes()
        writes = _write_round_trips(db)
        with pytest.raises(apsw.FullError), db.connection:
            for _ in range(60 if where == "stage" else 30):
                db.execute("INSERT INTO t(b) VALUES (randomblob(3000))")
        assert not db.is_dead
        assert isinstance(db.take_last_kv_error(), StorageQuotaExceeded)
        if where == "commit":
            assert _write_round_trips(db) == writes, "the refused commit wrote a batch"
        else:
            assert db.metrics()["stage_batches"] > 0, "no stage was written before the refusal"
        assert _database_keys(ns) == stored and ns.used_bytes() == used
        assert content(db) == before
        check_integrity(db)
        db.execute("INSERT INTO t(b) VALUES (x'01')")
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after
        check_integrity(again)


def test_a_later_stage_refused_by_the_quota_deletes_the_staged_and_rolls_back_alive(
    new_ns: NewNamespace,
) -> None:
    """Stages of one batch each are not checked ahead (the store checks a batch as it writes
    it): the first fits, a later one is refused by the store. What was staged is deleted and
    the transaction rolls back, where the database used to die."""
    ns = new_ns(KvLimits(max_storage_bytes=200_000))
    with open_database(ns, stage_pages=16) as db:
        _blobs(db, 20)
        before, stored, used = content(db), _database_keys(ns), ns.used_bytes()
        with pytest.raises(apsw.FullError), db.connection:
            for _ in range(200):
                db.execute("INSERT INTO t(b) VALUES (randomblob(3000))")
        assert db.metrics()["stage_batches"] > 0, "the refusal was the first stage"
        assert "used_bytes" not in db.metrics()["round_trips"], "a one-batch stage was checked"
        assert not db.is_dead
        assert _database_keys(ns) == stored and ns.used_bytes() == used
        assert content(db) == before
        check_integrity(db)
        db.execute("INSERT INTO t(b) VALUES (x'01')")
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after


class _Squatter(KvWrapper):
    """Another writer of the namespace: at the `at`-th write through it (from 1), it first
    fills the quota but for `leave` bytes with entries of its own, under its `PREFIX`, outside
    the VFS's keys (each entry and write within `SMALL_BATCHES`)."""

    PREFIX = b"\x7fsquatter"

    def __init__(self, inner: ActorKv) -> None:
        super().__init__(inner)
        self.at = 0
        self.leave = 0

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if op == "write" and self.at:
            self.at -= 1
            if not self.at:
                self._fill()
        return fn(*args, **kwargs)

    def _fill(self) -> None:
        inner = self.inner
        number = 0
        while True:
            room = inner.limits.max_storage_bytes - inner.used_bytes() - self.leave
            puts = {}
            for _ in range(4):
                key = self.PREFIX + number.to_bytes(4, "big")
                size = min(8000, room - len(key))
                if size <= 0:
                    break
                puts[key] = bytes(size)
                room -= len(key) + size
                number += 1
            if not puts:
                return
            inner.write(put=puts)


def test_a_later_batch_refused_after_another_writer_took_the_room_rolls_back_alive(
    new_ns: NewNamespace,
) -> None:
    """The check before a multi-batch commit cannot reserve the room: another writer of the
    namespace can take it before a later batch, which the store then refuses. The batches
    already written are deleted, so the outcome is the same clean `FullError`."""
    ns = new_ns(KvLimits(max_storage_bytes=400_000, **SMALL_BATCHES))
    squatter = _Squatter(ns)
    with open_database(squatter) as db:
        _blobs(db, 20)
        before, stored = content(db), _database_keys(ns)
        writes = _write_round_trips(db)
        squatter.at, squatter.leave = 2, 100  # after the commit's first batch
        with pytest.raises(apsw.FullError), db.connection:
            for _ in range(30):
                db.execute("INSERT INTO t(b) VALUES (randomblob(3000))")
        assert squatter.at == 0, "the other writer never wrote"
        assert _write_round_trips(db) == writes + 2, "not refused at the second batch"
        assert not db.is_dead
        assert isinstance(db.take_last_kv_error(), StorageQuotaExceeded)
        assert _database_keys(ns) == stored
        assert content(db) == before
        check_integrity(db)
        ns.delete_range(_Squatter.PREFIX, _Squatter.PREFIX + b"\xff")
        db.execute("INSERT INTO t(b) VALUES (x'01')")
        after = content(db)
    with open_database(ns) as again:
        assert content(again) == after
        check_integrity(again)
