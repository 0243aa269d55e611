"""The `file://` store's log: folding, crashes at every step of a fold, torn and forged records,
a failed sync, several store objects on one directory, and the pieces (`Ranges`, record bodies).

A "crash" here is an exception raised from inside the store at a chosen point, after which the
store object is abandoned and the directory reopened by a fresh one, as a new process would; each
test asserts that its crash point was reached. (Real SIGKILLs, also inside folds, are in
`test_file_durability.py`.)
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagekv.kv import KvIndeterminate, KvUnavailable
from pagekv.kv.file import FileStore
from pagekv.kv.file import log as kv_log
from pagekv.kv.file.base import BASE_PAGE_SIZE, SCHEMA_VERSION
from pagekv.kv.file.file_namespace import MAX_GAPS
from pagekv.kv.file.log import LogFile
from pagekv.kv.file.log_records import (
    Create,
    Range,
    Takeover,
    Write,
    decode,
    encode_create,
    encode_range,
    encode_takeover,
    encode_write,
)
from pagekv.kv.file.pending import Pending, Ranges
from pagekv.kv.sorted_keys import _INSERT_MAX

SMALL_LOG = 12 * 1024  # room for one 5 KB record or 16 small ones: folds all the time


class Crash(Exception):
    """Stands for the process dying at an injected point."""


class Model:
    """What one namespace must hold: entries and generation, and the usage they imply; and the
    namespaces created beside it, each holding one entry."""

    def __init__(self) -> None:
        self.entries: dict[bytes, bytes] = {}
        self.generation = 0
        self.created: dict[str, bytes] = {}

    @property
    def used(self) -> int:
        return sum(len(k) + len(v) for k, v in self.entries.items())

    def check(self, store: FileStore, actor: str = "a") -> None:
        ns = store.namespace(actor)
        assert dict(ns.list()) == self.entries
        assert ns.get(list(self.entries)[:100]) == list(self.entries.values())[:100]
        assert ns.generation() == self.generation
        assert ns.used_bytes() == self.used
        names = store.actor_ids()
        assert set(self.created) <= set(names) and names == sorted(names)
        for name, value in self.created.items():
            assert store.namespace(name).get([b"only"]) == [value]


def _folded(directory: Path) -> int:
    db = apsw.Connection(str(directory / "kv.sqlite3"))
    try:
        return db.execute("SELECT epoch FROM log_state").get
    finally:
        db.close()


def _random_op(rng: random.Random, store: FileStore, model: Model, actor: str = "a") -> None:
    """One random operation on `store`, mirrored in `model`."""
    ns = store.namespace(actor)
    keys = [b"k%03d" % i for i in range(60)]
    roll = rng.random()
    if roll < 0.6:
        puts = {k: rng.randbytes(rng.choice((0, 10, 3000, 9000))) for k in rng.sample(keys, 3)}
        deletes = [k for k in rng.sample(keys, 2) if k not in puts]
        ns.write(put=puts, delete=deletes, fence=model.generation)
        model.entries.update(puts)
        for key in deletes:
            model.entries.pop(key, None)
    elif roll < 0.75:
        start, end = sorted(rng.sample(keys, 2))
        ns.delete_range(start, end, fence=model.generation)
        for key in [k for k in model.entries if start <= k < end]:
            del model.entries[key]
    elif roll < 0.9:
        model.generation = ns.takeover()
    elif roll < 0.93:
        ns.drop(fence=model.generation)
        model.entries.clear()
    elif roll < 0.97:  # a namespace created in this epoch, folded or not
        name = f"new-{rng.randrange(10**9)}"
        value = rng.randbytes(rng.choice((1, 3000)))
        store.namespace(name).put({b"only": value})
        model.created[name] = value
    else:
        assert ns.used_bytes() == model.used


def test_a_small_log_folds_often_and_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(7)
    store = FileStore(tmp_path, log_bytes=SMALL_LOG)
    model = Model()
    for _ in range(300):
        _random_op(rng, store, model)
    model.check(store)
    store.close()
    assert _folded(tmp_path) >= 100  # the folds really happened
    reopened = FileStore(tmp_path, log_bytes=SMALL_LOG)
    model.check(reopened)
    reopened.close()


def test_store_objects_sharing_a_directory_see_each_other(tmp_path: Path) -> None:
    """Separate objects have separate locks, mappings and pending states, like processes."""
    rng = random.Random(11)
    stores = [FileStore(tmp_path, log_bytes=SMALL_LOG) for _ in range(3)]
    model = Model()
    for i in range(300):
        _random_op(rng, rng.choice(stores), model)
        if i % 10 == 0:
            for store in stores:
                model.check(store)
    for store in stores:
        model.check(store)
        store.close()
    assert _folded(tmp_path) >= 50


@pytest.fixture
def store_with_history(tmp_path: Path) -> Iterator[tuple[FileStore, Model]]:
    rng = random.Random(3)
    store = FileStore(tmp_path, log_bytes=SMALL_LOG)
    model = Model()
    for _ in range(40):
        _random_op(rng, store, model)
    yield store, model
    store.close()


def _crash_at(monkeypatch: pytest.MonkeyPatch, store: FileStore, step: str) -> list[str]:
    """Make the next fold of `store` raise `Crash` at `step`; return the list it is recorded in.

    The crashes are injected where the fold touches the disk: the log's header writes (the seal,
    then the next epoch's header) and the base's `BEGIN IMMEDIATE`.
    """
    fired: list[str] = []
    if step == "before-fold":

        def tracer(cursor: object, sql: str, bindings: object) -> bool:
            sealed = (
                store.epoch.header is not None and store.epoch.header.sealed
            )  # the fold's, no other
            if sql == "BEGIN IMMEDIATE" and sealed and not fired:
                fired.append(step)
                raise Crash(step)
            return True

        store.base.db.exec_trace = tracer
        return fired
    skip, after = {"before-seal": (0, False), "after-seal": (0, True), "after-fold": (1, False)}[
        step
    ]
    calls = 0

    def header_write(write: Callable[[], object], data: bytes) -> None:
        nonlocal calls
        calls += 1
        if fired or calls <= skip:
            write()
            return
        fired.append(step)
        if after:
            write()
        raise Crash(step)

    _on_header_writes(monkeypatch, header_write)
    return fired


def _on_header_writes(
    monkeypatch: pytest.MonkeyPatch, hook: Callable[[Callable[[], object], bytes], None]
) -> None:
    """Route the log's header writes (a `pwrite` below `DATA_START`) through `hook(write, data)`,
    which decides whether and when `write()` runs; every other `pwrite` runs as usual."""
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if offset >= kv_log.DATA_START:
            return real_pwrite(fd, data, offset)
        hook(lambda: real_pwrite(fd, data, offset), data)
        return len(data)

    monkeypatch.setattr(kv_log.os, "pwrite", pwrite)


def _trace_base_reads(store: FileStore) -> tuple[list[str], list[bytes]]:
    """Record the range queries on the base's entries and the keys of the rows they return."""
    queries: list[str] = []
    rows: list[bytes] = []
    ranges: set[int] = set()

    def exec_trace(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        if sql.startswith("SELECT key, value FROM entries") and "ORDER BY key" in sql:
            ranges.add(id(cursor))
            queries.append(sql)
        else:
            ranges.discard(id(cursor))
        return True

    def row_trace(cursor: apsw.Cursor, row: tuple[Any, ...]) -> tuple[Any, ...]:
        if id(cursor) in ranges:
            rows.append(row[0])
        return row

    store.base.db.exec_trace = exec_trace
    store.base.db.row_trace = row_trace
    return queries, rows


def test_reads_past_many_small_range_deletes_skip_every_hidden_row(tmp_path: Path) -> None:
    """Past `MAX_GAPS` hidden ranges a read queries the whole span once and skips hidden rows
    itself (like the registry's index: one small range delete per actor)."""
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"k%04d" % j: b"v" for j in range(100)})
    with store.sections.exclusive:
        store.appender.fold()
        store.appender.start_epoch()
    hidden = range(0, 80, 2)
    for j in hidden:  # 40 ranges of one row each, with a row between each pair
        ns.delete_range(b"k%04d" % j, b"k%04d" % (j + 1))
    assert len(store.epoch.pending_for(ns._id).hidden.gaps(None, None)) > MAX_GAPS
    visible = [b"k%04d" % j for j in range(100) if j not in hidden]
    queries, _ = _trace_base_reads(store)
    assert [k for k, _ in ns.list()] == visible
    assert len(queries) == 1, "one query for the span, not one per gap"
    assert [k for k, _ in ns.list(reverse=True, limit=7)] == visible[::-1][:7]
    middle = [k for k in visible if b"k0010" <= k < b"k0090"]
    assert [k for k, _ in ns.list(start=b"k0010", end=b"k0090")] == middle
    assert ns.used_bytes() == len(visible) * len(b"k0000v")
    store.close()


@pytest.mark.parametrize(
    "step",
    [
        "after-seal",  # sealed, nothing folded yet
        "before-fold",  # sealed; the fold's transaction never began
        "after-fold",  # folded and committed; no new epoch yet
        "before-seal",  # the sealing header never written
    ],
)
def test_a_crash_at_each_step_of_a_fold(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store_with_history: tuple[FileStore, Model],
    step: str,
) -> None:
    store, model = store_with_history
    folded = _folded(tmp_path)
    ns = store.namespace("a")
    fired = _crash_at(monkeypatch, store, step)
    big = {b"fill-%d" % i: os.urandom(5000) for i in range(2)}
    with pytest.raises(Crash):
        for key, value in big.items():  # the second one needs a fold first
            ns.write(put={key: value}, fence=model.generation)
            model.entries[key] = value
    assert fired == [step]
    monkeypatch.undo()
    # What the next process finds: everything acknowledged, each takeover once, usage exact.
    reopened = FileStore(tmp_path, log_bytes=SMALL_LOG)
    model.check(reopened)
    ns = reopened.namespace("a")
    for key, value in big.items():  # room for one, so the second one finishes a fold
        ns.write(put={b"after-" + key: value}, fence=model.generation)
        model.entries[b"after-" + key] = value
    model.check(reopened)
    reopened.close()
    assert _folded(tmp_path) > folded
    model.check(FileStore(tmp_path, log_bytes=SMALL_LOG))


@pytest.mark.parametrize("torn", [1, 2], ids=["sealing-header", "new-epoch-header"])
def test_a_torn_header_falls_back_to_the_other_slot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store_with_history: tuple[FileStore, Model],
    torn: int,
) -> None:
    """A fold writes two headers: the sealed one, then the next epoch's. Tear either write."""
    store, model = store_with_history
    calls: list[int] = []
    real_pwrite = os.pwrite

    def tearing(write: Callable[[], object], data: bytes) -> None:
        calls.append(int.from_bytes(data[8:16], "little"))  # hseq
        write()
        if len(calls) == torn:
            real_pwrite(store.log.fd, b"\xff" * 8, (calls[-1] % 2) * 512 + 12)
            raise Crash("torn header")

    _on_header_writes(monkeypatch, tearing)
    ns = store.namespace("a")
    with pytest.raises(Crash):
        for i in range(3):  # at most two fit before a fold
            ns.write(put={b"fill-%d" % i: b"x" * 5000}, fence=model.generation)
            model.entries[b"fill-%d" % i] = b"x" * 5000
    monkeypatch.undo()
    assert len(calls) == torn
    reopened = FileStore(tmp_path, log_bytes=SMALL_LOG)
    header = reopened.epoch.header
    assert header is not None and header.hseq == calls[-1] - 1  # the older slot
    model.check(reopened)
    reopened.namespace("a").put({b"after": b"tear"}, fence=model.generation)
    model.entries[b"after"] = b"tear"
    reopened.close()
    model.check(FileStore(tmp_path, log_bytes=SMALL_LOG))


def _tail(store: FileStore) -> tuple[int, int, int]:
    """Where the next record goes, its `seq`, and the seed its CRC needs (the chain so far)."""
    return store.epoch.offset, store.epoch.seq + 1, store.epoch.chain


@pytest.mark.parametrize("salt_known", [False, True], ids=["forged", "genuine"])
def test_a_record_counts_only_with_the_epochs_salt(tmp_path: Path, salt_known: bool) -> None:
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"a": b"1"})
    offset, seq, seed = _tail(store)
    store.close()
    record = encode_write(ns._id, {b"b": b"forged"}, [])
    log = LogFile(tmp_path / "kv.log")
    log.ensure_size(offset + LogFile.record_size(record))
    log.append(offset, seed if salt_known else seed ^ 1, seq, record, durable=True)
    log.close()
    reopened = FileStore(tmp_path)
    expected = {b"a": b"1", b"b": b"forged"} if salt_known else {b"a": b"1"}
    assert dict(reopened.namespace("a").list()) == expected
    reopened.close()


def test_a_torn_record_is_ignored_and_overwritten(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"a": b"1"})
    offset, seq, seed = _tail(store)
    store.close()
    body = encode_write(ns._id, {b"b": os.urandom(9000)}, [])
    log = LogFile(tmp_path / "kv.log")
    log.ensure_size(offset + LogFile.record_size(body))
    log.append(offset, seed, seq, body, durable=True)
    log.close()
    with open(tmp_path / "kv.log", "r+b") as f:  # the crash left the last block unwritten
        f.seek(offset + 8192)
        f.write(bytes(4096))
    reopened = FileStore(tmp_path)
    ns = reopened.namespace("a")
    assert dict(ns.list()) == {b"a": b"1"}
    ns.put({b"c": b"3"})  # lands where the torn record was
    assert reopened.epoch.offset == offset + kv_log.ALIGN
    reopened.close()
    assert dict(FileStore(tmp_path).namespace("a").list()) == {b"a": b"1", b"c": b"3"}


def test_a_failed_sync_breaks_the_store_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"a": b"1"})
    fired: list[int] = []
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        real_pwritev(fd, buffers, offset)  # written, but the device reported an error
        del buffers  # the traceback must not keep a view of the log's buffer
        fired.append(1)
        raise OSError(errno.EIO, "injected I/O error")

    def fdatasync(fd: int) -> None:  # the same where the log is written without O_DIRECT
        real_fdatasync(fd)
        fired.append(1)
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(kv_log.os, "pwritev", pwritev)
    monkeypatch.setattr(kv_log.os, "fdatasync", fdatasync)
    with pytest.raises(KvIndeterminate, match="injected I/O error"):
        ns.put({b"b": b"2"})
    monkeypatch.undo()
    assert fired == [1]
    for call in (lambda: ns.get([b"a"]), lambda: ns.put({b"c": b"3"}), ns.used_bytes):
        with pytest.raises(KvUnavailable, match=r"refuses requests .*EIO.* reopen it"):
            call()
    store.close()
    # The outcome was unknown; reopening shows the truth (here the bytes had been written).
    assert dict(FileStore(tmp_path).namespace("a").list()) == {b"a": b"1", b"b": b"2"}


@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "pwrite-fdatasync"])
def test_both_ways_of_writing_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    if not direct:  # refuse O_DIRECT as tmpfs does
        real_open = os.open

        def open_without_direct(path: str, flags: int, *args: int) -> int:
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "injected: no O_DIRECT here")
            return real_open(path, flags, *args)

        monkeypatch.setattr(kv_log.os, "open", open_without_direct)
    store = FileStore(tmp_path, log_bytes=SMALL_LOG)
    if direct and store.log._direct is None:
        pytest.skip(f"{tmp_path} does not support O_DIRECT")
    assert (store.log._direct is not None) == direct
    rng = random.Random(5)
    model = Model()
    for _ in range(60):
        _random_op(rng, store, model)
    model.check(store)
    store.close()
    model.check(FileStore(tmp_path, log_bytes=SMALL_LOG))


def _v1_store(directory: Path) -> None:
    """A store as pagekv wrote it before the log: schema version 1, no `log_state`."""
    directory.mkdir()
    db = apsw.Connection(str(directory / "kv.sqlite3"))
    assert db.execute("PRAGMA journal_mode=WAL").get == "wal"
    db.execute(
        "CREATE TABLE namespaces (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, "
        "generation INTEGER NOT NULL DEFAULT 0, used INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute(
        "CREATE TABLE entries (ns INTEGER NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "PRIMARY KEY (ns, key)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO namespaces VALUES (1, 'a', 4, 11)")
    db.execute("INSERT INTO entries VALUES (1, x'6b31', x'0102'), (1, x'6b32', x'0304050607')")
    db.execute("PRAGMA user_version = 1")
    db.close()


def test_a_version_1_store_is_read_and_upgraded(tmp_path: Path) -> None:
    _v1_store(tmp_path / "kv")
    store = FileStore(tmp_path / "kv", log_bytes=SMALL_LOG)
    model = Model()
    model.entries = {b"k1": b"\x01\x02", b"k2": b"\x03\x04\x05\x06\x07"}
    model.generation = 4
    model.check(store)
    rng = random.Random(9)
    for _ in range(30):
        _random_op(rng, store, model)
    model.check(store)
    store.close()
    assert (
        apsw.Connection(str(tmp_path / "kv" / "kv.sqlite3")).execute("PRAGMA user_version").get
        == SCHEMA_VERSION
    )


_keys = st.binary(min_size=1, max_size=3)


@given(st.lists(st.tuples(_keys, st.one_of(st.none(), _keys))), st.lists(_keys))
def test_ranges_and_their_gaps_match_a_list_of_intervals(
    added: list[tuple[bytes, bytes | None]], probes: list[bytes]
) -> None:
    ranges = Ranges()
    for start, end in added:
        ranges.add(start, end)
    intervals = list(ranges)
    assert intervals == sorted(intervals, key=lambda r: r[0])
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert end is not None and end < start  # disjoint and not touching
    keys = [*probes, *(s for s, _ in added), *(e for _, e in added if e is not None)]
    for key in keys:
        expected = any(s <= key and (e is None or key < e) for s, e in added)
        assert (key in ranges) == expected, (added, key)
    for start, end in [(None, None), *itertools.pairwise(sorted(keys)[:6])]:
        gaps = ranges.gaps(start, end)
        assert gaps == sorted(gaps, key=lambda g: (g[0] is not None, g[0]))
        for key in keys:
            inside = (start is None or start <= key) and (end is None or key < end)
            in_gap = any((lo is None or lo <= key) and (hi is None or key < hi) for lo, hi in gaps)
            assert in_gap == (inside and key not in ranges), (added, start, end, gaps, key)


_pending_ops = st.one_of(
    st.tuples(st.just("put"), st.lists(_keys, max_size=4)),
    st.tuples(st.just("put"), st.lists(_keys, min_size=_INSERT_MAX + 1, max_size=_INSERT_MAX + 8)),
    st.tuples(st.just("delete"), st.lists(_keys, max_size=3)),
    st.tuples(st.just("range"), st.tuples(_keys, st.none() | _keys)),
    st.tuples(st.just("ask"), st.tuples(st.none() | _keys, st.none() | _keys)),
)


def _inside(key: bytes, start: bytes | None, end: bytes | None) -> bool:
    return (start is None or start <= key) and (end is None or key < end)


@given(st.lists(_pending_ops, max_size=30))
def test_pending_keys_in_a_range_match_a_dict(ops: list[tuple[str, Any]]) -> None:
    """`Pending` keeps its keys in a `SortedKeys` (new keys inserted one by one, or merged by a
    sort past `_INSERT_MAX`): every range must still list exactly the keys a dict holds."""
    pending, model = Pending(generation=0, used=0), dict[bytes, bytes | None]()
    for op, arg in ops:
        if op == "put":
            pending.write([(k, b"v") for k in arg], ())
            model.update(dict.fromkeys(arg, b"v"))
        elif op == "delete":
            pending.write((), arg)
            model.update(dict.fromkeys(arg))
        elif op == "range":
            start, end = arg
            if end is not None and start >= end:
                continue
            pending.delete_range(start, end, 0)
            model = {k: v for k, v in model.items() if not _inside(k, start, end)}
        else:
            start, end = arg
            assert pending.keys_in(start, end) == sorted(k for k in model if _inside(k, start, end))
        assert pending.entries == model
    assert pending.keys_in(None, None) == sorted(model)


_write_records = st.builds(
    lambda ns, puts, deletes: Write(ns, list(puts.items()), [k for k in deletes if k not in puts]),
    st.integers(0, 2**63),
    st.dictionaries(_keys, st.binary(max_size=40), max_size=4),
    st.lists(_keys, max_size=4, unique=True),
)
_range_records = st.builds(
    Range, st.integers(0, 2**63), st.binary(max_size=4), st.none() | _keys, st.integers(0, 99)
)
_takeover_records = st.builds(Takeover, st.integers(0, 2**63), st.integers(0, 2**63))
_create_records = st.builds(Create, st.integers(0, 2**63), st.text(min_size=1, max_size=300))


def _encode(record: Write | Range | Takeover | Create) -> bytes:
    match record:
        case Write(ns, puts, deletes):
            return encode_write(ns, dict(puts), deletes)
        case Range(ns, start, end, refund):
            return encode_range(ns, start, end, refund)
        case Takeover(ns, generation):
            return encode_takeover(ns, generation)
        case Create(ns, name):
            return encode_create(ns, name)


@given(st.one_of(_write_records, _range_records, _takeover_records, _create_records))
def test_record_bodies_round_trip(record: Write | Range | Takeover | Create) -> None:
    body = _encode(record)
    assert decode(body) == record
    with pytest.raises(ValueError, match="stray bytes"):
        decode(body + b"\0")
    with pytest.raises(ValueError, match="unknown log record op 9"):
        decode(b"\x09" + body[1:])


def test_a_new_base_uses_large_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    FileStore(tmp_path / "new").close()
    _v1_store(tmp_path / "old")
    FileStore(tmp_path / "old").close()
    sizes = {}
    for name in ("new", "old"):
        db = apsw.Connection(str(tmp_path / name / "kv.sqlite3"))
        sizes[name] = db.execute("PRAGMA page_size").get
        db.close()
    assert sizes == {"new": BASE_PAGE_SIZE, "old": 4096}


def test_reads_skip_base_rows_hidden_by_a_range_delete(tmp_path: Path) -> None:
    store = FileStore(tmp_path, log_bytes=SMALL_LOG)
    ns = store.namespace("a")
    for i in range(0, 600, 100):
        ns.put({b"k%04d" % j: b"v" for j in range(i, i + 100)})
    with store.sections.exclusive:  # fold the rest too: all 600 rows in the base
        store.appender.fold()
        store.appender.start_epoch()
    assert store.epoch.pending == {}
    ns.delete_range(b"k0100", b"k0500")
    _, rows_read = _trace_base_reads(store)
    assert [k for k, _ in ns.list()] == [b"k%04d" % j for j in (*range(100), *range(500, 600))]
    assert len(rows_read) == 200  # none of the 400 hidden rows
    rows_read.clear()
    ns.drop()
    assert ns.list() == [] and ns.list(reverse=True, limit=5) == []
    assert rows_read == []
    store.close()


@pytest.mark.parametrize("step", ["after-seal", "before-fold", "after-fold"])
def test_a_fold_left_unfinished_is_finished_by_another_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The other writer holds the epoch's pending state and has no reason to re-read the log but
    the sealed header; without the seal its next record would go to an epoch already folded."""
    model = Model()
    folder, other = (FileStore(tmp_path, log_bytes=SMALL_LOG) for _ in range(2))
    other.namespace("a").put({b"seen": b"by other"})
    model.entries[b"seen"] = b"by other"
    model.check(other)
    fired = _crash_at(monkeypatch, folder, step)
    with pytest.raises(Crash):
        for i in range(3):
            folder.namespace("a").put({b"fill-%d" % i: b"x" * 5000})
            model.entries[b"fill-%d" % i] = b"x" * 5000
    monkeypatch.undo()
    assert fired == [step]
    model.check(other)  # reads first: the base may already hold the epoch the other still has
    other.namespace("a").put({b"after": b"the crash"})
    model.entries[b"after"] = b"the crash"
    model.check(other)
    other.close()
    model.check(FileStore(tmp_path, log_bytes=SMALL_LOG))


def test_a_direct_write_refused_for_alignment_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    if store.log._direct is None:
        pytest.skip(f"{tmp_path} does not support O_DIRECT")
    refused: list[int] = []

    def pwritev(fd: int, buffers: object, offset: int) -> int:
        refused.append(offset)
        raise OSError(errno.EINVAL, "injected: bad alignment")

    monkeypatch.setattr(kv_log.os, "pwritev", pwritev)
    store.namespace("a").put({b"k": b"v"})
    assert len(refused) == 1 and store.log._direct is None
    store.namespace("a").put({b"k2": b"v2"})
    assert len(refused) == 1
    store.close()
    assert dict(FileStore(tmp_path).namespace("a").list()) == {b"k": b"v", b"k2": b"v2"}


def test_a_full_disk_while_the_log_grows_rejects_the_write_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"a": b"1"})
    used = ns.used_bytes()
    refused: list[int] = []
    original = kv_log.os.pwrite

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if len(data) >= 2**16 and not any(data):  # the zeros of an extension
            refused.append(len(data))
            raise OSError(errno.ENOSPC, "injected: no space left on device")
        return original(fd, data, offset)

    monkeypatch.setattr(kv_log.os, "pwrite", pwrite)
    with pytest.raises(KvUnavailable, match="no space left"):
        ns.put({b"big": os.urandom(100_000)} | {b"k%d" % i: os.urandom(100_000) for i in range(8)})
    assert refused, "the extension never ran"
    assert dict(ns.list()) == {b"a": b"1"} and ns.used_bytes() == used
    monkeypatch.undo()
    ns.put({b"b": b"2"})  # the store was not broken by it
    store.close()
    assert dict(FileStore(tmp_path).namespace("a").list()) == {b"a": b"1", b"b": b"2"}


def test_usage_seen_by_another_store_stays_exact_after_two_crashes_around_a_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer 1 overwrites a key (100 -> 1,000 bytes) and dies right after sealing the log; a
    long-lived reader catches up; writer 2 folds the epoch into the base and dies before the next
    epoch's header. The reader's pending state still owed the key's old size, and the base now
    held the new one: its `used_bytes()` said 101 while its own `list()` summed to 2,503."""
    reader = FileStore(tmp_path, log_bytes=SMALL_LOG)
    first = FileStore(tmp_path, log_bytes=SMALL_LOG)
    ns = first.namespace("a")
    ns.put({b"k": b"x" * 100, b"other": b"o" * 1400})
    with first.sections.exclusive:  # into the base, as a full log would be
        first.appender.fold()
        first.appender.start_epoch()
    ns.put({b"k": b"y" * 1000})
    fired = _crash_at(monkeypatch, first, "after-seal")
    with pytest.raises(Crash):
        for i in range(3):
            ns.put({b"fill-%d" % i: b"z" * 5000})
    assert fired == ["after-seal"]
    monkeypatch.undo()
    entries = dict(reader.namespace("a").list())  # caught up with the sealed epoch
    second = FileStore(tmp_path, log_bytes=SMALL_LOG)
    fired = _crash_at(monkeypatch, second, "before-seal")  # its first header: the next epoch's
    with pytest.raises(Crash):
        second.namespace("a").put({b"never": b"written"})
    assert fired == ["before-seal"]
    monkeypatch.undo()
    sealed = first.epoch.header
    assert sealed is not None and _folded(tmp_path) == sealed.epoch, "the second did not fold"
    mine = reader.namespace("a")
    assert dict(mine.list()) == entries
    assert mine.used_bytes() == sum(len(k) + len(v) for k, v in entries.items())
    assert FileStore(tmp_path, log_bytes=SMALL_LOG).namespace("a").used_bytes() == mine.used_bytes()


def test_a_list_beside_pending_entries_reads_only_what_it_returns(tmp_path: Path) -> None:
    """`list(limit=1)` on a namespace whose base holds 24 MiB and whose log holds one more
    entry reads a row or two of the base, not the rest of the range (a generator expression
    compiled by mypyc is a list comprehension: it read all 24 MiB)."""
    store = FileStore(tmp_path, log_bytes=SMALL_LOG)
    ns = store.namespace("a")
    value = os.urandom(64 * 1024)
    for i in range(0, 384, 4):
        ns.put({b"k%04d" % j: value for j in range(i, i + 4)})
    ns.put({b"k0000x": b"pending"})
    assert store.epoch.pending.get(ns._id) is not None  # the merged path, not the base alone
    tracemalloc.start()
    try:
        first = ns.list(limit=1)
        second = ns.list(start=b"k0000\x00", limit=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        store.close()
    assert [k for k, _ in first] == [b"k0000"]
    assert [k for k, _ in second] == [b"k0000x", b"k0001"]
    assert peak < 1024 * 1024, f"{peak / 2**20:.1f} MiB allocated by two short lists"
