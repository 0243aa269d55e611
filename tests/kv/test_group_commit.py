"""Group commit in the `file:` store, and namespaces created in the log.

Concurrent writers share one flush, each write is acknowledged only once a flush covers it, and
nothing returns a state a crash could undo: a reader of a namespace whose latest record is not yet
durable waits for the flush too. Flushes are made to block or fail by patching `os.fdatasync`;
each test asserts that its patch ran. (Real SIGKILLs of concurrent writers are in
`test_file_durability.py`.)
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crc32c import crc32c

from pagekv.kv import FileStore, KvIndeterminate, KvLimits, KvUnavailable, open_kv
from pagekv.kv.file import FileNamespace
from pagekv.kv.file import log as kv_log
from pagekv.kv.file.log import LogFile, LogHeader
from pagekv.kv.file.log_records import encode_write

WAIT = 10.0


def _in_groups(store: FileStore) -> None:
    """Make every write of `store` leave its flush to a group, as under contention."""
    store.commit.grouping_until = math.inf


class _Flushes:
    """`os.fdatasync` of the log held at a gate: `started` is set when a flush begins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls = 0
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            self.calls += 1
            self.started.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
            if fail:
                raise OSError(errno.EIO, "injected flush failure")
            real(fd)

        monkeypatch.setattr(kv_log.os, "fdatasync", fdatasync)


def _start(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `fn` in a thread; the list gets its result or the exception it raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    with FileStore(tmp_path / "kv") as store:
        yield store


def test_concurrent_writers_share_flushes_and_lose_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path, flush_delay_ms=5)  # a slow disk: writers pile up behind flushes
    namespaces = [store.namespace(f"actor-{i}") for i in range(16)]
    before = store.flush_counts()
    start = threading.Barrier(len(namespaces))

    def writer(ns: FileNamespace) -> None:
        start.wait()
        for j in range(20):
            ns.put({b"k%02d" % j: ns.actor_id.encode()})

    threads = [threading.Thread(target=writer, args=(ns,)) for ns in namespaces]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = store.flush_counts()
    writes, flushes = after.writes - before.writes, after.flushes - before.flushes
    assert writes == 16 * 20
    assert flushes <= writes / 4, f"{flushes} flushes for {writes} writes: no group commit"
    store.close()
    with FileStore(tmp_path) as reopened:
        for i in range(16):
            ns = reopened.namespace(f"actor-{i}")
            assert dict(ns.list()) == {b"k%02d" % j: f"actor-{i}".encode() for j in range(20)}


def test_a_lone_writer_makes_each_write_durable_in_one_flush(store: FileStore) -> None:
    ns = store.namespace("a")
    before = store.flush_counts()
    for j in range(50):
        ns.put({b"k": b"%d" % j})
    after = store.flush_counts()
    assert (after.writes - before.writes, after.flushes - before.flushes) == (50, 50)


def test_a_write_and_a_reader_of_it_wait_for_the_flush_others_do_not(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns, other = store.namespace("a"), store.namespace("b")
    ns.put({b"k": b"old"})
    other.put({b"k": b"other"})
    _in_groups(store)
    flushes = _Flushes(monkeypatch)
    writer, written = _start(lambda: ns.put({b"k": b"new"}))
    assert flushes.started.wait(WAIT)
    reader, read = _start(lambda: ns.get([b"k"]))
    generation, seen = _start(ns.generation)
    assert other.get([b"k"]) == [b"other"], "a namespace with nothing pending does not wait"
    time.sleep(0.2)
    assert written == [] and read == [] and seen == [], "returned before the flush"
    flushes.gate.set()
    for thread in (writer, reader, generation):
        thread.join(WAIT)
    assert written == [None] and read == [[b"new"]] and seen == [0]


def test_a_write_never_goes_durable_ahead_of_an_unflushed_one(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write alone would be made durable at once; behind a record still in the page cache it
    must wait for the flush instead, or a crash could keep it after a hole."""
    ns, other = store.namespace("a"), store.namespace("b")
    _in_groups(store)
    flushes = _Flushes(monkeypatch)
    first, first_out = _start(lambda: ns.put({b"k": b"1"}))
    assert flushes.started.wait(WAIT)
    store.commit.grouping_until = 0.0  # alone again, but behind an unflushed record
    second, second_out = _start(lambda: other.put({b"k": b"2"}))
    time.sleep(0.2)
    assert second_out == [], "acknowledged ahead of the record before it"
    flushes.gate.set()
    first.join(WAIT)
    second.join(WAIT)
    assert first_out == [None] and second_out == [None]


def test_a_failed_shared_flush_fails_every_write_it_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    namespaces = [store.namespace(f"a{i}") for i in range(4)]
    _in_groups(store)
    flushes = _Flushes(monkeypatch, fail=True)
    first, first_out = _start(lambda: namespaces[0].put({b"k": b"v"}))
    assert flushes.started.wait(WAIT)
    others = [_start(lambda ns=ns: ns.put({b"k": b"v"})) for ns in namespaces[1:]]
    time.sleep(0.1)
    flushes.gate.set()
    outcomes = [first_out]
    first.join(WAIT)
    for thread, out in others:
        thread.join(WAIT)
        outcomes.append(out)
    assert flushes.calls >= 1
    for out in outcomes:
        assert len(out) == 1 and isinstance(out[0], KvIndeterminate), out
        assert "injected flush failure" in str(out[0]) or "broke before" in str(out[0])
    with pytest.raises(KvUnavailable, match=r"refuses requests .*EIO"):
        namespaces[0].get([b"k"])
    monkeypatch.undo()
    store.close()
    with FileStore(tmp_path) as reopened:  # the outcome was unknown; the store is usable again
        reopened.namespace("a0").put({b"after": b"1"})
        assert reopened.namespace("a0").get([b"after"]) == [b"1"]


def test_losing_an_unflushed_record_loses_it_and_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power loss keeps any subset of the page cache: with the first unflushed record lost,
    a later one that reached the disk must not be replayed after the hole."""
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    ns.put({b"acked": b"1"})
    _in_groups(store)
    lost_at = store.epoch.offset
    flushes = _Flushes(monkeypatch, fail=True)
    first, first_out = _start(lambda: ns.put({b"lost": b"2"}))
    assert flushes.started.wait(WAIT)
    second, second_out = _start(lambda: store.namespace("b").put({b"later": b"3"}))
    deadline = time.monotonic() + WAIT
    while store.epoch.seq < 4 and time.monotonic() < deadline:  # create b, then b's write
        time.sleep(0.01)
    assert store.epoch.seq == 4
    with open(tmp_path / "kv.log", "r+b") as log:  # the first unflushed record never got there
        log.seek(lost_at)
        log.write(bytes(512))
    flushes.gate.set()
    first.join(WAIT)
    second.join(WAIT)
    assert isinstance(first_out[0], KvIndeterminate) and isinstance(second_out[0], KvIndeterminate)
    monkeypatch.undo()
    store.close()
    with FileStore(tmp_path) as reopened:
        assert dict(reopened.namespace("a").list()) == {b"acked": b"1"}
        assert reopened.actor_ids() == ["a"], "a record after the hole was replayed"
        reopened.namespace("b").put({b"again": b"4"})
        assert reopened.actor_ids() == ["a", "b"]


def test_flush_delay_slows_every_flush_and_is_checked(tmp_path: Path) -> None:
    with open_kv(f"file:{tmp_path}/slow?flush_delay_ms=40") as store:
        ns = store.namespace("a")
        started = time.monotonic()
        ns.put({b"k": b"v"})
        assert time.monotonic() - started >= 0.04
    for bad in ("-1", "abc", "20000", "nan"):
        with pytest.raises(ValueError, match="flush_delay_ms"):
            open_kv(f"file:{tmp_path}/x?flush_delay_ms={bad}")


def test_a_new_namespace_is_one_record_and_one_flush(tmp_path: Path, store: FileStore) -> None:
    store.namespace("old").put({b"k": b"v"})
    statements: list[str] = []

    def trace(cursor: object, sql: str, bindings: object) -> bool:
        statements.append(sql)
        return True

    store.base.db.exec_trace = trace
    before = store.flush_counts()
    ns = store.namespace("new")
    after = store.flush_counts()
    assert (after.writes - before.writes, after.flushes - before.flushes) == (1, 1)
    assert not [s for s in statements if s.startswith(("BEGIN", "INSERT", "UPDATE"))]
    assert store.namespace("new")._id == ns._id
    assert store.flush_counts().writes == after.writes, "an existing namespace writes nothing"
    with FileStore(tmp_path / "kv") as other:  # another process, as far as locks go
        assert other.actor_ids() == ["new", "old"]
        assert other.namespace("new")._id == ns._id
        other.namespace("new").put({b"from": b"other"})
    assert ns.get([b"from"]) == [b"other"]
    with store.sections.exclusive:  # the fold gives it its row in the base
        store.appender.fold()
        store.appender.start_epoch()
    rows = store.base.query("SELECT id, generation FROM namespaces WHERE name = 'new'")
    assert rows == [(ns._id, 0)]
    assert store.actor_ids() == ["new", "old"] and ns.get([b"from"]) == [b"other"]


def test_store_objects_creating_namespaces_at_once_agree_on_ids(tmp_path: Path) -> None:
    stores = [FileStore(tmp_path) for _ in range(3)]
    ids: dict[tuple[int, str], int] = {}
    start = threading.Barrier(6)

    def create(s: int, t: int) -> None:
        start.wait()
        for i in range(20):
            for name in (f"own-{s}-{t}-{i}", f"shared-{i}"):
                ids[(s * 2 + t, name)] = stores[s].namespace(name)._id

    threads = [threading.Thread(target=create, args=(s, t)) for s in range(3) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    by_name: dict[str, set[int]] = {}
    for (_, name), ns_id in ids.items():
        by_name.setdefault(name, set()).add(ns_id)
    assert all(len(found) == 1 for found in by_name.values()), "one name, several ids"
    assert len({next(iter(found)) for found in by_name.values()}) == len(by_name) == 140
    for store in stores:
        assert store.actor_ids() == sorted(by_name)
        store.close()
    with FileStore(tmp_path) as reopened:
        assert {n: reopened.namespace(n)._id for n in by_name} == {
            n: next(iter(found)) for n, found in by_name.items()
        }


def test_close_waits_for_a_flush_in_flight_and_keeps_what_it_covers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    _in_groups(store)
    flushes = _Flushes(monkeypatch)
    writer, written = _start(lambda: ns.put({b"k": b"v"}))
    assert flushes.started.wait(WAIT)
    closer, closed = _start(store.close)
    time.sleep(0.2)
    assert closed == [], "closed the log under a flush in flight"
    flushes.gate.set()
    writer.join(WAIT)
    closer.join(WAIT)
    assert written == [None] and closed == [None]
    monkeypatch.undo()
    with FileStore(tmp_path) as reopened:
        assert reopened.namespace("a").get([b"k"]) == [b"v"]


def test_a_record_stranded_after_a_hole_never_rejoins_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Record A frees room under the quota and B uses it; both wait for one flush, and a power
    loss keeps B's sector but not A's. The replay stops at A's hole; the next write lands there,
    and B must not check out after it (the CRC chain), or it would come back over the quota."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    limits = KvLimits(max_storage_bytes=1500)
    store = FileStore(live, limits=limits)
    x, y = store.namespace("x"), store.namespace("y")
    x.put({b"big": b"1" * 896})
    y.put({b"k": b"0"})
    _in_groups(store)
    flushes = _Flushes(monkeypatch)
    hole, seq = store.log_used, store.epoch.seq
    a, _ = _start(lambda: x.delete([b"big"]))
    assert flushes.started.wait(WAIT)
    b, _ = _start(lambda: x.put({b"big2": b"2" * 896}))
    deadline = time.monotonic() + WAIT
    while store.epoch.seq < seq + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.epoch.seq == seq + 2, "both records are in the file"
    crashed.mkdir()
    shutil.copy(live / "kv.sqlite3", crashed)
    image = bytearray((live / "kv.log").read_bytes())
    image[hole : hole + 512] = bytes(512)  # A never reached the disk; B did
    (crashed / "kv.log").write_bytes(image)
    flushes.gate.set()
    a.join(WAIT)
    b.join(WAIT)
    monkeypatch.undo()
    store.close()
    with FileStore(crashed, limits=limits) as reopened:
        assert [k for k, _ in reopened.namespace("x").list()] == [b"big"]
        reopened.namespace("y").put({b"k": b"after the crash"})  # written where A was
    with FileStore(crashed, limits=limits) as reopened:
        x = reopened.namespace("x")
        assert [k for k, _ in x.list()] == [b"big"] and x.used_bytes() <= 1500
        assert reopened.namespace("y").get([b"k"]) == [b"after the crash"]


def test_a_lost_record_redone_byte_for_byte_does_not_let_a_stranded_one_rejoin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Record 1 takes `a` over, record 2 writes `b`; both wait for one flush, and a power loss
    keeps record 2's sector but not record 1's. After the crash the same takeover is redone:
    the same body at the same place, so only the record's nonce can make it differ from the
    lost one. If it did not, record 2, never acknowledged, would check out and come back."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    store = FileStore(live)
    a, b = store.namespace("a"), store.namespace("b")
    generation = a.takeover()
    b.put({b"k": b"before"})
    _in_groups(store)
    flushes = _Flushes(monkeypatch)
    hole, seq = store.log_used, store.epoch.seq
    first, _ = _start(a.takeover)
    assert flushes.started.wait(WAIT)
    second, _ = _start(lambda: b.put({b"k": b"never acknowledged"}))
    deadline = time.monotonic() + WAIT
    while store.epoch.seq < seq + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.epoch.seq == seq + 2, "both records are in the file"
    image = bytearray((live / "kv.log").read_bytes())
    lost = bytes(image[hole : hole + 512])
    image[hole : hole + 512] = bytes(512)  # record 1 never reached the disk; record 2 did
    crashed.mkdir()
    shutil.copy(live / "kv.sqlite3", crashed)
    (crashed / "kv.log").write_bytes(image)
    flushes.gate.set()
    first.join(WAIT)
    second.join(WAIT)
    monkeypatch.undo()
    store.close()
    with FileStore(crashed) as reopened:
        assert reopened.namespace("b").get([b"k"]) == [b"before"]
        assert reopened.namespace("a").takeover() == generation + 1  # the lost record, redone
    with FileStore(crashed) as reopened:
        assert reopened.namespace("b").get([b"k"]) == [b"before"], "record 2 came back"
        assert reopened.namespace("a").generation() == generation + 1
    redone = (crashed / "kv.log").read_bytes()[hole : hole + 512]
    # crc:4 | length:4 | seq:8 | nonce:8 | body: all the same but the nonce, and so the CRC
    assert redone[4:16] == lost[4:16] and redone[24:] == lost[24:]
    assert redone[16:24] != lost[16:24] and redone[:4] != lost[:4]


def test_a_flusher_interrupted_mid_flush_leaves_the_others_to_flush(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Interrupted(BaseException):
        pass

    namespaces = [store.namespace(f"a{i}") for i in range(3)]
    _in_groups(store)
    started, gate, calls = threading.Event(), threading.Event(), []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the first flusher is interrupted (a signal, Ctrl-C) in its flush
            started.set()
            assert gate.wait(WAIT)
            raise Interrupted
        real(fd)

    monkeypatch.setattr(kv_log.os, "fdatasync", fdatasync)
    first, first_out = _start(lambda: _interruptible(namespaces[0], Interrupted))
    assert started.wait(WAIT)
    others = [_start(lambda ns=ns: ns.put({b"k": b"v"})) for ns in namespaces[1:]]
    time.sleep(0.1)
    gate.set()
    first.join(WAIT)
    for thread, out in others:
        thread.join(WAIT)
        assert out == [None], "a waiter was left behind by the interrupted flusher"
    assert first_out == ["interrupted"] and len(calls) >= 2
    namespaces[0].put({b"k": b"after"})
    assert namespaces[0].get([b"k"]) == [b"after"]


def _interruptible(ns: FileNamespace, kind: type[BaseException]) -> str:
    try:
        ns.put({b"k": b"v"})
    except kind:
        return "interrupted"
    return "done"


def test_a_failed_flush_while_the_log_grows_fails_the_writes_it_covered(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Growing the log flushes it, and that flush covers records waiting in the page cache: its
    failure breaks the store like a failed group flush (the kernel reports an error only once,
    so the group flush after it could not tell)."""
    a, b = store.namespace("a"), store.namespace("b")
    while store.log_used + 1024 <= store.log._size:
        a.put({b"f%d" % store.log_used: b"x" * 300})
    _in_groups(store)
    calls: list[int] = []
    gate = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the group flush covering a's record, held
            assert gate.wait(WAIT)
        elif len(calls) == 2:  # the flush of the grown log fails
            raise OSError(errno.EIO, "injected writeback failure")
        real(fd)

    monkeypatch.setattr(kv_log.os, "fdatasync", fdatasync)
    writer, written = _start(lambda: a.put({b"covered": b"1"}))
    deadline = time.monotonic() + WAIT
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(KvUnavailable, match="EIO"):
        b.put({b"big": b"y" * 4000})
    gate.set()
    writer.join(WAIT)
    assert len(calls) == 2
    assert len(written) == 1 and isinstance(written[0], KvIndeterminate)
    with pytest.raises(KvUnavailable, match="refuses requests"):
        a.put({b"later": b"z"})


def test_a_waiter_returns_after_a_fold_whose_folder_died(tmp_path: Path) -> None:
    """Another process folds the epoch a waiter's record is in and dies before the next epoch's
    header: the record is durable (the fold sealed it with a flush), and the waiter must see it,
    not flush for ever towards a position the log no longer grows to."""
    log_bytes = 16 * 1024
    mine = FileStore(tmp_path, log_bytes=log_bytes, flush_delay_ms=600)
    folder = FileStore(tmp_path, log_bytes=log_bytes)
    p1, p2, q = mine.namespace("p1"), mine.namespace("p2"), folder.namespace("q")
    while folder.log_used < log_bytes - 4 * 512:
        q.put({b"f%d" % folder.log_used: b"x"})
    _in_groups(mine)
    first, first_out = _start(lambda: p1.put({b"k": b"1"}))  # flushes for 0.6 s
    time.sleep(0.15)
    second, second_out = _start(lambda: p2.put({b"k": b"2"}))  # waits for the next flush
    time.sleep(0.15)
    real = os.urandom

    def die(n: int) -> bytes:
        raise SystemExit("the folder dies before the next epoch's header")

    os.urandom = die  # the next epoch's salt
    try:
        with pytest.raises(SystemExit):
            q.put({b"big": b"y" * 3000})  # does not fit: folds
    finally:
        os.urandom = real
    FileStore(tmp_path, log_bytes=log_bytes).close()  # a process opening the store meanwhile
    assert p1.get([b"x"]) == [None]
    first.join(WAIT)
    second.join(WAIT)
    assert first_out == [None] and second_out == [None]
    mine.close()


_PROCESS_WRITER = """
import sys, time
from pagekv.kv import FileStore
store = FileStore(sys.argv[1], flush_delay_ms=3)
ns = store.namespace("p" + sys.argv[2])
start = float(sys.argv[3])
while time.time() < start:
    time.sleep(0.001)
before = store.flush_counts()
for i in range(40):
    ns.put({b"k%02d" % i: b"v"})
after = store.flush_counts()
print(after.writes - before.writes, after.flushes - before.flushes)
"""


def test_writers_in_several_processes_share_flushes(tmp_path: Path) -> None:
    """One thread per process: no process sees another thread wait, yet they wait for each
    other's lock and flush; one process flushes for all at a time."""
    FileStore(tmp_path).close()
    start = str(time.time() + 2.0)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS_WRITER, str(tmp_path), str(p), start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    counts = [tuple(map(int, child.communicate(timeout=60)[0].split())) for child in children]
    writes, flushes = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert writes == 160
    assert flushes <= 0.75 * writes, f"{flushes} flushes for {writes} writes in 4 processes"
    with FileStore(tmp_path) as reopened:
        for p in range(4):
            assert len(reopened.namespace(f"p{p}").list()) == 40


def test_an_unchained_epoch_of_format_1_is_read_then_folded_before_a_write(
    tmp_path: Path,
) -> None:
    FileStore(tmp_path).close()
    ns_id = 1
    with FileStore(tmp_path) as store:
        assert store.namespace("a")._id == ns_id
        with store.sections.exclusive:  # fold the creation away: version 2 had none
            store.appender.fold()
            store.appender.start_epoch()
        epoch = store.epoch.header.epoch if store.epoch.header else 0
    log = LogFile(tmp_path / "kv.log")
    salt = os.urandom(8)
    log.write_header(LogHeader(hseq=99, epoch=epoch, salt=salt, sealed=False, format=1))
    offset = kv_log.DATA_START
    for seq, body in enumerate(
        [encode_write(ns_id, {b"old": b"1"}, []), encode_write(ns_id, {b"old2": b"2"}, [])], 1
    ):
        # format 1's record: crc | length | seq | body, every CRC seeded with the salt's
        head = struct.pack("<IQ", len(body), seq)
        record = struct.pack("<I", crc32c(body, crc32c(head, crc32c(salt)))) + head + body
        record += bytes(-len(record) % kv_log.ALIGN)
        assert len(record) == LogFile.record_size(body, 1)
        log.ensure_size(offset + len(record))
        kv_log.write_all(log.fd, record, offset)
        offset += len(record)
    log.close()
    with FileStore(tmp_path) as store:
        ns = store.namespace("a")
        assert dict(ns.list()) == {b"old": b"1", b"old2": b"2"}
        ns.put({b"new": b"3"})
        assert store.epoch.header is not None and store.epoch.header.chained
        assert store.epoch.header.epoch == epoch + 1, "the unchained epoch was folded first"
    with FileStore(tmp_path) as store:
        assert dict(store.namespace("a").list()) == {b"old": b"1", b"old2": b"2", b"new": b"3"}
