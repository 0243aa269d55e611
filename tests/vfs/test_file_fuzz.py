"""Property tests of `PageStore`, the database file without SQLite, against a bytearray model.

The model keeps `committed` (what a reopen must see) and `current` (what this instance must see).
Writes at arbitrary offsets (sub-page and page-spanning), reads, truncates that shrink and grow,
syncs, reopens, read-only snapshots and compaction are interleaved by Hypothesis; every read must
equal the model and `size` must equal its length.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagekv.kv import ActorKv, CountingKv, FenceMismatch, KvLimits, MemoryStore
from pagekv.vfs import DatabaseDead, SnapshotExpired
from pagekv.vfs.format import (
    BASE_END,
    DELTA_PREFIX,
    LOCK_BYTE_PAGE,
    PAGE_SIZE,
    Head,
    base_key,
    decode_chunk,
    parse_base_key,
)
from pagekv.vfs.options import Options
from pagekv.vfs.page_cache import PageCache
from pagekv.vfs.page_store import PageStore

MAX_OFFSET = 64 * 1024
SMALL_LIMITS = KvLimits(max_value_bytes=16 * 1024, max_batch_bytes=64 * 1024)


def _near_page_boundary(page: int, delta: int) -> int:
    return max(0, page * PAGE_SIZE + delta)


offsets = st.one_of(
    st.integers(0, MAX_OFFSET),
    st.builds(_near_page_boundary, st.integers(0, MAX_OFFSET // PAGE_SIZE), st.integers(-2, 2)),
)
lengths = st.one_of(
    st.integers(1, 3 * PAGE_SIZE + 7),
    st.sampled_from([1, 2, PAGE_SIZE - 1, PAGE_SIZE, PAGE_SIZE + 1, 2 * PAGE_SIZE]),
)
sizes = st.one_of(offsets, st.just(0))


def fill(seed: int, n: int) -> bytes:
    """`n` pseudorandom bytes; never all zeros for n >= 1, so resurrected data is visible."""
    data = bytearray(random.Random(seed).randbytes(n))
    data[0] |= 1
    return bytes(data)


def resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


def read_all(store: PageStore) -> bytes:
    return store.read(store.size + 3 * PAGE_SIZE, 0)


class PageStoreMachine(RuleBasedStateMachine):
    limits: ClassVar[KvLimits] = KvLimits()
    options: ClassVar[Options] = Options()

    def __init__(self) -> None:
        super().__init__()
        self.kv: ActorKv = MemoryStore(limits=self.limits).namespace("fuzz")
        self.store = PageStore(self.kv, options=self.options)
        self.committed = bytearray()
        self.current = bytearray()
        self.clean = True
        """No write or truncate since the last sync, reopen or compaction."""

    @initialize(length=st.integers(0, 12 * PAGE_SIZE), seed=st.integers(0, 255))
    def start(self, length: int, seed: int) -> None:
        if length:
            self.write(0, length, seed)
            self.sync()

    @rule(offset=offsets, length=lengths, seed=st.integers(0, 255))
    def write(self, offset: int, length: int, seed: int) -> None:
        data = fill(seed, length)
        self.store.write(data, offset)
        if offset > len(self.current):
            resize(self.current, offset)
        self.current[offset : offset + length] = data
        self.clean = False

    @rule(offset=st.integers(0, MAX_OFFSET + 4 * PAGE_SIZE), amount=lengths)
    def read(self, offset: int, amount: int) -> None:
        got = self.store.read(amount, offset)
        want = bytes(self.current[offset : offset + amount])
        assert len(got) == len(want), f"read({amount}, {offset}): {len(got)} bytes"
        assert got == want, f"read({amount}, {offset}) differs from the model"

    @rule()
    def check_all(self) -> None:
        assert read_all(self.store) == bytes(self.current)

    @rule(size=sizes)
    def truncate(self, size: int) -> None:
        self.store.truncate(size)
        resize(self.current, size)
        self.clean = False

    @rule()
    def sync(self) -> None:
        self.store.sync()
        assert not self.store.has_pending()
        self.committed = bytearray(self.current)
        self.clean = True

    @rule()
    def finish_commit(self) -> None:
        """What the VFS does after SQLite's commit: flush anything left, maybe auto-compact."""
        self.store.finish_commit()
        assert not self.store.health.dead, self.store.take_last_error()
        self.committed = bytearray(self.current)
        self.clean = True

    @rule(probe_stale=st.booleans())
    def reopen(self, probe_stale: bool) -> None:
        old = self.store
        self.store = PageStore(self.kv, options=self.options)
        self.current = bytearray(self.committed)
        self.clean = True
        assert self.store.size == len(self.committed)
        if probe_stale:
            # The old instance was taken over: its next commit must fail and change nothing.
            # (A whole page, so the write needs no read of the old instance's staged pages.)
            with pytest.raises(DatabaseDead):
                old.write(b"stale!!!" * (PAGE_SIZE // 8), 0)
                old.sync()
            assert old.health.dead is not None

    @rule()
    def snapshot(self) -> None:
        snap = PageStore(self.kv, read_only=True, options=self.options)
        assert snap.size == len(self.committed)
        assert read_all(snap) == bytes(self.committed)

    @precondition(lambda self: self.clean)
    @rule()
    def compact(self) -> None:
        assert not self.store.has_pending()
        self.store.compact()
        assert self.store.metrics()["live_deltas"] == 0
        pages = self.store.reader.head.pages
        stored = [parse_base_key(k) for k, _ in self.kv.list(start=base_key(1), end=BASE_END)]
        assert all(p <= pages for p in stored), f"base pages past EOF ({pages}): {stored[-3:]}"

    @invariant()
    def size_matches(self) -> None:
        assert self.store.size == len(self.current)


FUZZ_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
VARIANTS: dict[str, tuple[KvLimits, Options]] = {
    "default-limits": (KvLimits(), Options()),
    "small-limits": (
        SMALL_LIMITS,
        Options(cache_pages=300, compact_deltas=3, compact_pages=40, in_place_commits=False),
    ),
    "small-limits-stage-4": (
        SMALL_LIMITS,
        Options(stage_pages=4, cache_pages=300, compact_deltas=5, compact_pages=40),
    ),
    "default-limits-stage-4": (
        KvLimits(),
        Options(stage_pages=4, compact_deltas=5, compact_pages=40),
    ),
    "small-limits-tiny-cache": (SMALL_LIMITS, Options(cache_pages=3, compact_deltas=3)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_page_store_matches_model(variant: str) -> None:
    limits, options = VARIANTS[variant]
    machine: Any = type(
        f"Machine_{variant}", (PageStoreMachine,), {"limits": limits, "options": options}
    )
    run_state_machine_as_test(machine, settings=FUZZ_SETTINGS)


# -- explicit properties ---------------------------------------------------------------------


def _patterned(pages: int, seed: int) -> bytes:
    return fill(seed, pages * PAGE_SIZE)


@pytest.mark.parametrize("sync_between", [False, True], ids=["same-txn", "own-txns"])
@pytest.mark.parametrize("compact_first", [False, True], ids=["deltas", "base"])
@pytest.mark.parametrize("stage_pages", [2048, 3], ids=["buffered", "staged"])
@pytest.mark.parametrize("cut", [0, 1, 2 * PAGE_SIZE, 2 * PAGE_SIZE + 100])
def test_truncate_then_regrow_never_resurrects(
    cut: int, stage_pages: int, compact_first: bool, sync_between: bool
) -> None:
    kv = MemoryStore().namespace("t")
    options = Options(stage_pages=stage_pages)
    store = PageStore(kv, options=options)
    old = _patterned(10, 1)
    store.write(old, 0)
    store.sync()
    if compact_first:
        store.compact()
    # More uncommitted data above the cut, some of it staged.
    store.write(_patterned(6, 2), 4 * PAGE_SIZE)
    store.truncate(cut)
    if sync_between:
        store.sync()
    store.truncate(12 * PAGE_SIZE)  # regrow: everything past `cut` must read as zeros
    store.write(b"\x7f" * 10, 11 * PAGE_SIZE)
    want = old[:cut] + bytes(11 * PAGE_SIZE - cut) + b"\x7f" * 10 + bytes(PAGE_SIZE - 10)
    assert store.size == 12 * PAGE_SIZE
    assert read_all(store) == want
    store.sync()
    assert read_all(store) == want
    reopened = PageStore(kv, options=options)
    assert read_all(reopened) == want
    reopened.compact()
    assert read_all(reopened) == want
    assert read_all(PageStore(kv, options=options)) == want


def test_staged_then_committed_page_is_not_read_stale() -> None:
    """Minimal case: a cached page that a transaction staged to KV must be re-read after commit."""
    kv = MemoryStore().namespace("t")
    store = PageStore(kv, options=Options(stage_pages=2))
    store.write(b"\x01" * PAGE_SIZE, 0)
    store.sync()
    assert store.read(1, 0) == b"\x01"  # page 1 is now in the page cache
    store.write(b"\x02" * (2 * PAGE_SIZE), 0)  # two dirty pages: staged to KV at once
    store.sync()
    assert PageStore(kv, read_only=True).read(1, 0) == b"\x02"  # what was committed
    assert store.read(1, 0) == b"\x02"  # what the writer itself reads


def test_read_ahead_during_a_staged_transaction_leaves_no_stale_page_cached() -> None:
    """Found by the model test above: a read-ahead during a transaction caches the committed
    version of pages the transaction has staged. The commit must evict them, or the next partial
    write of such a page starts from the old version and commits a page that mixes both."""
    kv = MemoryStore().namespace("t")
    store = PageStore(kv)
    pages = 200  # more than the open reads ahead, so the pages near the end start cold
    old = _patterned(pages, 1)
    store.write(old, 0)
    store.sync()
    store.compact()  # every page is a base page
    store = PageStore(kv, options=Options(stage_pages=2))
    assert len(store.reader.cache) < pages - 10
    at = (pages - 2) * PAGE_SIZE
    new = _patterned(2, 2)
    store.write(new, at)  # the last two pages, staged to KV at once
    assert store.metrics()["stage_batches"] == 1
    assert store.read(1, at - 4 * PAGE_SIZE) == old[at - 4 * PAGE_SIZE : at - 4 * PAGE_SIZE + 1]
    assert at // PAGE_SIZE + 1 in store.reader.cache, (
        "the read-ahead must have cached a staged page"
    )
    store.sync()
    store.write(b"!", at + 1)  # a partial write of a page the commit wrote: read, modify, write
    store.sync()
    want = old[:at] + new[:1] + b"!" + new[2:]
    assert read_all(store) == want
    assert read_all(PageStore(kv, read_only=True)) == want


@pytest.mark.parametrize("compacted", [False, True], ids=["deltas", "base"])
def test_read_ahead_larger_than_the_cache_keeps_the_page_read(compacted: bool) -> None:
    kv = MemoryStore().namespace("t")
    store = PageStore(kv)
    data = _patterned(40, 3)
    store.write(data, 0)
    store.sync()
    if compacted:
        store.compact()
    # Any cache size is accepted; one delta chunk holds 31 pages and read-ahead reaches 256.
    small = PageStore(kv, options=Options(cache_pages=4))
    assert read_all(small) == data


@pytest.mark.parametrize("lost", ["staged-chunk", "compacted-delta"])
def test_taken_over_writer_dies_instead_of_reporting_corruption(lost: str) -> None:
    kv = MemoryStore().namespace("t")
    old = PageStore(kv, options=Options(stage_pages=2))
    old.write(_patterned(2, 4), 0)
    if lost == "compacted-delta":
        old.sync()
        old.reader.cache.clear()  # as if evicted: the next read must go to KV
    assert old.has_pending() == (lost == "staged-chunk")
    new = PageStore(kv)  # takeover: reaps the old writer's staged chunk
    if lost == "compacted-delta":
        new.write(b"\x05" * PAGE_SIZE, PAGE_SIZE)
        new.sync()
        new.compact()
    with pytest.raises(DatabaseDead):
        old.write(b"partial page update", 100)  # needs the current page 1
        old.sync()
    assert old.health.dead is not None


# -- the lock-byte page ----------------------------------------------------------------------


LOCK_BYTE_OFFSET = 0x40000000
LOCK_BYTE_KEY = b"\x01B" + struct.pack(">I", 262145)


def _delta_pages(kv: ActorKv) -> set[int]:
    pages: set[int] = set()
    for key, raw in kv.list(prefix=DELTA_PREFIX):
        txid = struct.unpack(">Q", key[2:10])[0]
        pages.update(decode_chunk(txid, raw).pages)
    return pages


@pytest.mark.slow
def test_lock_byte_page_is_never_stored() -> None:
    assert LOCK_BYTE_PAGE == 262145 == LOCK_BYTE_OFFSET // PAGE_SIZE + 1
    assert base_key(LOCK_BYTE_PAGE) == LOCK_BYTE_KEY
    kv = MemoryStore().namespace("lock")
    store = PageStore(kv, options=Options(stage_pages=2))
    around = [LOCK_BYTE_PAGE - 2, LOCK_BYTE_PAGE - 1, LOCK_BYTE_PAGE + 1, LOCK_BYTE_PAGE + 2]
    for pgno in around:
        store.write(bytes([pgno % 200 + 1]) * PAGE_SIZE, (pgno - 1) * PAGE_SIZE)
    # One write spanning the lock-byte page too (SQLite never does this, but it must not leak).
    store.write(b"\xaa" * (3 * PAGE_SIZE), LOCK_BYTE_OFFSET - PAGE_SIZE)
    store.write(b"\xbb" * 100, LOCK_BYTE_OFFSET + 5)
    store.sync()
    stored = _delta_pages(kv)
    assert LOCK_BYTE_PAGE not in stored
    assert {LOCK_BYTE_PAGE - 1, LOCK_BYTE_PAGE + 1} <= stored
    assert kv.get([LOCK_BYTE_KEY]) == [None]
    assert store.read(PAGE_SIZE, LOCK_BYTE_OFFSET) == bytes(PAGE_SIZE)

    store.compact()
    base = {parse_base_key(k) for k, _ in kv.list(start=base_key(LOCK_BYTE_PAGE - 3), end=BASE_END)}
    assert LOCK_BYTE_PAGE not in base
    assert set(around) <= base
    assert kv.get([LOCK_BYTE_KEY]) == [None]
    assert _delta_pages(kv) == set()

    reopened = PageStore(kv)
    assert reopened.read(PAGE_SIZE, LOCK_BYTE_OFFSET) == bytes(PAGE_SIZE)
    assert reopened.read(PAGE_SIZE, LOCK_BYTE_OFFSET - PAGE_SIZE) == b"\xaa" * PAGE_SIZE
    assert reopened.read(PAGE_SIZE, LOCK_BYTE_OFFSET + PAGE_SIZE) == b"\xaa" * PAGE_SIZE
    last = (LOCK_BYTE_PAGE + 1) * PAGE_SIZE
    assert reopened.read(PAGE_SIZE, last) == bytes([(LOCK_BYTE_PAGE + 2) % 200 + 1]) * PAGE_SIZE
    assert reopened.size == (LOCK_BYTE_PAGE + 2) * PAGE_SIZE


@given(
    capacity=st.integers(1, 8),
    before=st.lists(st.integers(1, 12), max_size=10),
    batch=st.dictionaries(st.integers(1, 12), st.binary(max_size=2), max_size=10),
)
def test_caching_a_read_ahead_at_once_is_caching_its_pages_one_by_one(
    capacity: int, before: list[int], batch: dict[int, bytes]
) -> None:
    """`put_many` leaves the cache as `put` of each page in turn would: same pages, same data,
    same order of eviction."""
    one_by_one, at_once = PageCache(capacity), PageCache(capacity)
    for pgno in before:
        one_by_one.put(pgno, b"old")
        at_once.put(pgno, b"old")
    for pgno, data in batch.items():
        one_by_one.put(pgno, data)
    at_once.put_many(batch)
    assert len(at_once) <= capacity
    assert list(at_once._pages.items()) == list(one_by_one._pages.items())


# -- in-place commits --------------------------------------------------------------------------


def _in_place(store: PageStore) -> int:
    return store.counters.commits_in_place


def test_a_commit_that_grows_past_a_hole_is_a_delta() -> None:
    """In place, the base pages must stay contiguous: pages 2-4 of a file grown by writing page
    5 alone are holes, which only the delta path can describe. (Written in place with
    `base_pages = 5`, the next open finds base pages 2-4 missing.)"""
    kv = MemoryStore().namespace("t")
    store = PageStore(kv)
    store.write(fill(1, PAGE_SIZE), 0)
    store.sync()
    assert _in_place(store) == 1
    store.write(fill(5, PAGE_SIZE), 4 * PAGE_SIZE)
    store.sync()
    assert _in_place(store) == 1 and store.metrics()["live_deltas"] == 1
    want = fill(1, PAGE_SIZE) + bytes(3 * PAGE_SIZE) + fill(5, PAGE_SIZE)
    assert read_all(PageStore(kv, read_only=True)) == want
    store.write(fill(2, PAGE_SIZE), PAGE_SIZE)  # live deltas: no longer in place
    store.sync()
    store.compact()
    store.write(fill(6, PAGE_SIZE), 5 * PAGE_SIZE)  # compacted, contiguous: in place again
    store.sync()
    assert _in_place(store) == 2
    want = want[:PAGE_SIZE] + fill(2, PAGE_SIZE) + want[2 * PAGE_SIZE :] + fill(6, PAGE_SIZE)
    assert read_all(PageStore(kv)) == want


def test_in_place_commits_write_base_pages_and_a_compacted_head_only() -> None:
    kv = MemoryStore().namespace("t")
    store = PageStore(kv)
    for n in range(1, 6):
        store.write(fill(n, PAGE_SIZE), (n - 1) * PAGE_SIZE)  # grow by one page
        store.write(fill(10 + n, 100), 50)  # and rewrite part of page 1
        store.sync()
    assert _in_place(store) == 5
    keys = [key for key, _ in kv.list()]
    assert not [k for k in keys if k.startswith(DELTA_PREFIX)], keys
    assert [parse_base_key(k) for k in keys if k.startswith(base_key(0)[:2])] == [1, 2, 3, 4, 5]
    head = store.reader.head
    assert (head.txid, head.compacted, head.base_pages, head.shrinks) == (5, 5, 5, ())


def test_a_snapshot_never_reads_a_page_rewritten_in_place_after_it() -> None:
    """A read-only snapshot's head is older than a page the writer rewrote in place since: the
    snapshot must refuse it (SnapshotExpired), not mix it with its older pages."""
    kv = MemoryStore().namespace("t")
    writer = PageStore(kv)
    writer.write(fill(1, 3 * PAGE_SIZE), 0)
    writer.sync()
    snap = PageStore(kv, read_only=True, options=Options(cache_pages=1, preload_hints=False))
    assert snap.read(PAGE_SIZE, 0) == fill(1, 3 * PAGE_SIZE)[:PAGE_SIZE]
    writer.write(fill(2, PAGE_SIZE), 2 * PAGE_SIZE)
    writer.sync()
    assert _in_place(writer) == 2
    with pytest.raises(SnapshotExpired):
        snap.read(PAGE_SIZE, 2 * PAGE_SIZE)
    fresh = PageStore(kv, read_only=True)
    assert fresh.read(PAGE_SIZE, 2 * PAGE_SIZE) == fill(2, PAGE_SIZE)


@pytest.mark.parametrize("layout", ["compacted", "deltas"])
def test_a_snapshot_or_stale_writer_never_reads_another_incarnation(layout: str) -> None:
    """The namespace is dropped and a new database written under it, with the same transaction
    numbers, page numbers and chunk keys as the old one. A snapshot of the old one (too big to
    be read whole at its open) must refuse the new pages, and a stale writer must die: both
    returned the new pages as if they were their own."""
    kv = MemoryStore().namespace("t")
    pages = 1100
    options = Options(cache_pages=1, in_place_commits=False, auto_compact=False)

    def build(seed: int) -> PageStore:
        writer = PageStore(kv, options=options)
        writer.write(fill(seed, pages * PAGE_SIZE), 0)
        writer.sync()
        if layout == "compacted":
            writer.compact()
        return writer

    old = fill(1, pages * PAGE_SIZE)
    stale = build(1)
    snap = PageStore(kv, read_only=True, options=options)
    assert snap.read(PAGE_SIZE, 0) == old[:PAGE_SIZE]
    assert stale.read(PAGE_SIZE, 0) == old[:PAGE_SIZE]
    kv.drop()
    fresh = build(2)
    assert (fresh.reader.head.txid, fresh.reader.head.compacted) == (
        stale.reader.head.txid,
        stale.reader.head.compacted,
    )
    where = 600 * PAGE_SIZE
    with pytest.raises(SnapshotExpired):
        snap.read(PAGE_SIZE, where)
    with pytest.raises(DatabaseDead, match="FenceMismatch") as dead:
        stale.read(PAGE_SIZE, where)
    assert dead.value.fenced and isinstance(dead.value.cause, FenceMismatch)
    with pytest.raises(DatabaseDead) as again:  # a later call: the cause only in the fields
        stale.read(PAGE_SIZE, 0)
    assert again.value.fenced and again.value.cause is dead.value.cause
    assert fresh.read(PAGE_SIZE, where) == fill(2, pages * PAGE_SIZE)[where : where + PAGE_SIZE]


def test_base_pages_of_format_2_are_read_as_generation_0() -> None:
    """Databases written before base pages carried their generation stay readable."""
    kv = MemoryStore().namespace("t")
    writer = PageStore(kv)
    writer.write(fill(1, 3 * PAGE_SIZE), 0)
    writer.sync()
    assert _in_place(writer) == 1
    for key, raw in kv.list(start=base_key(1), end=BASE_END):
        _, _, txid, crc = struct.unpack_from(">BQQI", raw)
        kv.put({key: struct.pack(">BQI", 1, txid, crc) + raw[-PAGE_SIZE:]})
    for read_only in (True, False):
        assert read_all(PageStore(kv, read_only=read_only)) == fill(1, 3 * PAGE_SIZE)


@pytest.mark.parametrize(
    ("base", "dirty", "in_place"),
    [
        (LOCK_BYTE_PAGE - 1, [LOCK_BYTE_PAGE + 1], True),  # the lock-byte page is never stored
        (LOCK_BYTE_PAGE - 2, [LOCK_BYTE_PAGE - 1, LOCK_BYTE_PAGE + 1], True),
        (LOCK_BYTE_PAGE - 2, [LOCK_BYTE_PAGE + 1], False),  # the page before it would be a hole
        (LOCK_BYTE_PAGE - 1, [LOCK_BYTE_PAGE + 2], False),  # the page after it would be a hole
    ],
)
def test_an_in_place_commit_across_the_lock_byte_page(
    base: int, dirty: list[int], in_place: bool
) -> None:
    """Growing across 1 GiB: in place needs every new page but the lock-byte page. (The state of
    a 1 GiB compacted file is set up by hand: the check reads no page.)"""
    store = PageStore(MemoryStore().namespace("t"))
    store.reader.head = Head(7, base * PAGE_SIZE, 7, base, ())
    store.reader.index.base_limit = base
    store.transaction.size = max(dirty) * PAGE_SIZE
    assert store.committer.in_place([(p, bytes(PAGE_SIZE)) for p in dirty]) is in_place


class _Racing(CountingKv):
    """Runs `race` just before the first range read that starts at page 1: a writer's commit
    landing between a snapshot's read of the head and its read of the pages."""

    def __init__(self, inner: ActorKv, race: Callable[[], None]) -> None:
        super().__init__(inner)
        self.race: Callable[[], None] | None = race

    def list(self, **kwargs: Any) -> list[tuple[bytes, bytes]]:
        if self.race is not None and kwargs.get("start") == base_key(1):
            race, self.race = self.race, None
            race()
        return super().list(**kwargs)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "deltas"])
def test_a_snapshot_of_a_small_database_is_read_whole_and_never_overtaken(in_place: bool) -> None:
    """A snapshot of a database of up to 4 MiB reads all of it in one atomic range read, so a
    commit landing after its read of the head cannot leave it with a page newer than that head
    (it adopts the newer state). Before, its page read came second and the snapshot failed."""
    kv = MemoryStore().namespace("t")
    writer = PageStore(kv, options=Options(in_place_commits=in_place))
    writer.write(fill(1, 20 * PAGE_SIZE), 0)
    writer.sync()
    writer.compact()

    def commit() -> None:
        writer.write(fill(2, PAGE_SIZE), 3 * PAGE_SIZE)
        writer.sync()

    racing = _Racing(kv, commit)
    snap = PageStore(racing, read_only=True)
    assert racing.race is None, "the race did not run"
    want = fill(1, 20 * PAGE_SIZE)
    want = want[: 3 * PAGE_SIZE] + fill(2, PAGE_SIZE) + want[4 * PAGE_SIZE :]
    assert read_all(snap) == want
    assert racing.stats.round_trips == Counter({"generation": 1, "list": 2})
