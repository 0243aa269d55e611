"""The page store: one database file's bytes over the actor KV.

This is everything the VFS file does, without APSW: reads through dirty buffer -> page cache ->
KV, buffered writes, truncation, the commit protocol, early staging of huge transactions, and
fatal-on-error. `vfs.py` only adapts it to SQLite's callbacks.

Invariants:
- Reads never see uncommitted data of another instance, and never rewind `head` (only a commit, a
  compaction or a local truncate changes it).
- A commit is visible exactly when the batch carrying its head record is applied; everything before
  it is written under `head.txid + 1`, which readers and recovery ignore until then. A commit in
  place (`_in_place`) is that one batch: its base pages ride with the head.
- After a write whose outcome is unknown (or a fence mismatch) the store is dead: it drops its
  buffers and answers every call with `DatabaseDead`, and never resends the write.
- A transaction refused by a limit or the quota, at any of its batches, leaves nothing stored:
  a run of several batches is checked against the usage first (`_check_quota`), and what a
  refused one had written is deleted (`_write_failed`). The store lives on, as SQLite does.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Final

from librt.threading import Lock

from pagekv.kv import (
    ActorKv,
    CountingKv,
    FenceMismatch,
    KvError,
    KvUnavailable,
    LimitError,
    check_quota,
)
from pagekv.vfs.commit import Batch, BatchPlanner, encode_batch
from pagekv.vfs.compaction import compact, delete_folded
from pagekv.vfs.errors import DatabaseDead, SnapshotExpired, StorageCorrupt
from pagekv.vfs.format import (
    COMPACT_SHRINKS,
    DELTA_PREFIX,
    HEAD_KEY,
    HINTS_END,
    HINTS_KEY,
    LOCK_BYTE_PAGE,
    PAGE_SIZE,
    ZERO_PAGE,
    Head,
    Shrink,
    base_key,
    decode_base,
    decode_chunk,
    delta_key,
    encode_base,
    encode_hints,
    parse_base_key,
    parse_txid_key,
)
from pagekv.vfs.page_cache import PageCache
from pagekv.vfs.preload import MAX_HINT_PAGES, PreloadHints
from pagekv.vfs.read_ahead import ReadAhead
from pagekv.vfs.recovery import delete_txids, read_stored, recover


@dataclass(frozen=True, slots=True)
class Options:
    """Tuning knobs of one open database (all counts are 4 KiB pages)."""

    cache_pages: int = 4096
    stage_pages: int = 2048
    """Dirty pages held in memory before a transaction is staged to KV early."""
    compact_deltas: int = 256
    """Auto-compact once this many commits are live as deltas ..."""
    compact_pages: int = 4096
    """... or their index entries exceed this many pages."""
    auto_compact: bool = True
    """False leaves compaction to `Database.compact()`, except for a head with `COMPACT_SHRINKS`
    shrinks (format.py)."""
    in_place_commits: bool = True
    """A small commit on a fully compacted database overwrites its base pages (in its one KV
    write) instead of adding a delta for compaction to fold later. False writes every commit as
    a delta: a read-only snapshot then lasts until the next compaction, not only until a page it
    has not read yet is rewritten."""
    preload_hints: bool = True
    """Learn which pages SQLite reads first after an open, save them at close, and fetch them
    with page 1 at the next open (preload.py); False preloads the first read-ahead window."""

    def __post_init__(self) -> None:
        check_options({name: getattr(self, name) for name in _OPTION_TYPES})


_IN_PLACE_HEAD_BYTES: Final = len(HEAD_KEY) + len(Head().encode())
"""The key and value of a head without shrinks, the only kind an in-place commit writes."""
_BASE_ENTRY_BYTES: Final = len(base_key(1)) + len(encode_base(0, 0, 1, ZERO_PAGE))
_READ_ALL_PAGES: Final = 1024
"""A snapshot reads a database of up to 4 MiB whole, at its open (`PageStore._read_all`)."""
_READ_ALL_SLACK: Final = 32
"""Entries a snapshot's whole read (`PageStore._read_all`) allows beyond what it expects."""
_MAGIC: Final = b"SQLite format 3\x00"
"""The start of SQLite's database header, on page 1."""
_OPTION_TYPES: Final[dict[str, type]] = {f.name: type(f.default) for f in fields(Options)}
"""Each option's type, that of its default (`int` counts and the `bool` switch)."""


def check_options(options: Mapping[str, object]) -> None:
    """Reject an unknown option, a value of the wrong type or a count below 1, naming the option.

    `open_database` calls it before making `Options`: compiled, a typed field rejects a wrong
    type on its own, with an error that does not say which option it was."""
    for name, value in options.items():
        kind = _OPTION_TYPES.get(name)
        if kind is None:
            raise TypeError(f"unknown option {name!r}; the options are {', '.join(_OPTION_TYPES)}")
        if type(value) is not kind:
            raise TypeError(f"option {name} must be {kind.__name__}, not {type(value).__name__}")
        if kind is int and isinstance(value, int) and value < 1:
            raise ValueError(f"option {name} must be at least 1, got {value}")


@dataclass(slots=True)
class Counters:
    """What the page store has done since it opened (part of `Database.metrics()`). Attributes,
    not a dict: four of them change on every commit."""

    commits: int = 0
    commits_fast: int = 0
    commits_in_place: int = 0
    commits_staged: int = 0
    pages_committed: int = 0
    max_commit_pages: int = 0
    stage_batches: int = 0
    compactions: int = 0
    pages_compacted: int = 0
    compaction_bytes_written: int = 0
    compaction_round_trips: int = 0
    orphan_cleanups: int = 0
    pages_preloaded: int = 0
    hints_saved: int = 0
    hint_save_errors: int = 0


@dataclass(slots=True, init=False)
class _Pending:
    """The transaction being built: dirty pages and whatever was already staged to KV.

    `reset` empties it for the next transaction; `__init__` is written out, as `WriteBatch`'s
    is (compiled, a dataclass's generated one runs interpreted)."""

    dirty: dict[int, bytes]
    staged: dict[int, int]
    """Staged page -> chunk number under the pending txid."""
    parts: list[list[tuple[int, int]]]
    shrinks: list[Shrink]
    chunks: int
    floor: int | None
    """Lowest page count the file shrank to; committed pages above it are hidden."""

    def __init__(self) -> None:
        self.dirty = {}
        self.staged = {}
        self.parts = []
        self.shrinks = []
        self.chunks = 0
        self.floor = None

    def reset(self) -> None:
        """Empty it in place, as a new one would be, but making only the containers that were
        used: a one-page commit fills `dirty` alone, and making the four anew was 3% of its
        time. `parts` and `shrinks` are replaced, not cleared: the page index keeps them."""
        self.dirty.clear()
        if self.staged:
            self.staged = {}
        if self.parts:
            self.parts = []
        if self.shrinks:
            self.shrinks = []
        self.chunks = 0
        self.floor = None


class PageStore:
    """One open database file's pages over `kv`.

    SQLite calls it from one thread at a time, but `Database.compact()` and `metrics()` may come
    from any thread, so the methods they and the file call (`read`, `write`, `truncate`, `sync`,
    `compact`, `finish_commit`, `take_last_error`, `metrics`) hold `_lock`; the others expect it
    held, or only read. The lock is `librt`'s, not `threading`'s: compiled, a `with` block on it
    costs about 20 ns instead of 260 (an `RLock`), and a commit takes it several times. It is not
    reentrant, which is why `finish_commit` calls `_sync` and `_compact`, never `sync` and
    `compact`.
    """

    def __init__(self, kv: ActorKv, *, read_only: bool = False, options: Options = Options()):
        self.kv = CountingKv(kv)
        self.limits = kv.limits
        self.read_only = read_only
        self.options = options
        self._lock = Lock()
        self.cache = PageCache(options.cache_pages)
        self._planner = BatchPlanner(self.limits)  # before the takeover: bad limits change nothing
        limits = self.limits
        self._in_place_pages = min(
            limits.max_batch_entries - 1,
            (limits.max_batch_bytes - _IN_PLACE_HEAD_BYTES) // _BASE_ENTRY_BYTES,
        )
        """Most pages an in-place commit writes: with the head, one batch within the limits."""
        self.dead: BaseException | None = None
        self.last_error: BaseException | None = None
        self.counters = Counters()
        recovered = recover(self.kv, read_only=read_only)
        self.generation = recovered.generation
        self.head = recovered.head
        self.index = recovered.index
        self.counters.orphan_cleanups = recovered.orphans_removed + recovered.leftovers_removed
        self.size = self.head.size
        self._pending = _Pending()
        self._refused = False
        """Whether the last commit was refused with nothing written (`_drop_unchanged`)."""
        self._read_ahead = ReadAhead()
        use_hints = options.preload_hints
        budget = min(MAX_HINT_PAGES, self.limits.max_batch_entries - 1) if use_hints else 0
        self.hints = PreloadHints(recovered.hints if use_hints else (), budget)
        self._preload()
        self.counters.pages_preloaded = len(self.cache)

    # -- reads ------------------------------------------------------------------------------

    def read(self, amount: int, offset: int) -> bytes:
        """Bytes `offset..offset+amount`, short if the file ends first."""
        with self._lock:
            self._check_alive()
            end = offset + amount
            hints = self.hints
            if amount == PAGE_SIZE and not offset % PAGE_SIZE and end <= self.size:
                pgno = end // PAGE_SIZE
                if hints.learning:
                    hints.note(pgno)
                return self.read_page(pgno)  # SQLite's page reads: no copy
            end = min(end, self.size)
            out = bytearray()
            pos = offset
            while pos < end:
                pgno, start = divmod(pos, PAGE_SIZE)
                if hints.learning:
                    hints.note(pgno + 1)
                take = min(PAGE_SIZE - start, end - pos)
                out += self.read_page(pgno + 1)[start : start + take]
                pos += take
            return bytes(out)

    def read_page(self, pgno: int, *, mixed: bool = True) -> bytes:
        pending = self._pending
        if pgno > self._pages() or pgno == LOCK_BYTE_PAGE:
            return ZERO_PAGE
        data = pending.dirty.get(pgno)
        if data is not None:
            return data
        chunk = pending.staged.get(pgno)
        if chunk is not None:
            return self._fetch_staged(pgno, chunk)
        if pending.floor is not None and pgno > pending.floor:
            return ZERO_PAGE
        return self._committed_page(pgno, mixed)

    def _committed_page(self, pgno: int, mixed: bool = True) -> bytes:
        """Page `pgno` (at most `head.pages`, not the lock-byte page) as the head has it."""
        data = self.cache.get(pgno)
        if data is not None:
            return data
        if pgno in self.index.deltas or pgno <= self.index.base_limit:
            return self._fetch(pgno, mixed=mixed)
        return ZERO_PAGE

    def _fetch(self, pgno: int, *, mixed: bool = True) -> bytes:
        """Read `pgno` and the read-ahead window after it: the delta chunks holding the window's
        delta pages in one `get`, its base pages in one range `list`. The kind `pgno` is not of
        is fetched only if `mixed` and it fills a quarter of the window, so a point read costs
        one round trip. Caches every current page it brings."""
        index = self.index
        stop = min(pgno + self._read_ahead.window(pgno), self.head.pages + 1)
        per_chunk = self._planner.per_chunk
        max_chunks = min((stop - pgno) // per_chunk + 1, self.limits.max_batch_entries)
        chunks: dict[tuple[int, int], None] = {}
        base: Sequence[int]
        if index.deltas:
            listed: list[int] = []
            for page in range(pgno, stop):
                loc = index.deltas.get(page)
                if loc is not None:
                    if len(chunks) < max_chunks:
                        chunks[loc] = None
                elif page <= index.base_limit and page != LOCK_BYTE_PAGE:
                    listed.append(page)
            base = listed
        else:  # all base pages (the lock-byte page, never stored, needs no exclusion)
            base = range(pgno, min(stop, index.base_limit + 1))
        quarter = (stop - pgno) // 4 if mixed else stop
        fetched: dict[int, bytes] = {}
        in_delta = pgno in index.deltas
        if chunks and (in_delta or len(chunks) * per_chunk >= quarter):
            fetched.update(self._get_chunks(list(chunks)))
        if base and (not in_delta or len(base) >= quarter):
            fetched.update(self._list_base(base[0], base[-1] + 1))
        self.cache.put_many(fetched)
        end = stop if fetched.keys() >= set(range(pgno, stop)) else pgno
        while end in fetched:
            end += 1
        self._read_ahead.fetched(end)
        wanted = fetched.get(pgno)
        if wanted is None:
            where = index.deltas.get(pgno, "the base pages")
            raise self._missing(f"page {pgno} below EOF (expected in {where})")
        self.cache.put(pgno, wanted)
        return wanted

    def _get_chunks(self, locs: list[tuple[int, int]]) -> dict[int, bytes]:
        """The current pages held by delta chunks `locs` (one `get`)."""
        pages: dict[int, bytes] = {}
        raws = self.kv.get([delta_key(*loc) for loc in locs])
        for loc, raw in zip(locs, raws, strict=True):
            if raw is None:
                raise self._missing(f"delta chunk {loc[1]} of txid {loc[0]}")
            self._chunk_pages(loc, raw, pages)
        return pages

    def _chunk_pages(self, loc: tuple[int, int], raw: bytes, into: dict[int, bytes]) -> None:
        """Put into `into` the pages of chunk `loc` that are current: none if a later generation
        wrote it (`_base_page` says why)."""
        chunk = decode_chunk(loc[0], raw)
        if chunk.generation > self.generation:
            return
        for page, data in chunk.pages.items():
            if self.index.deltas.get(page) == loc:
                into[page] = data

    def _list_base(self, start: int, stop: int) -> dict[int, bytes]:
        """The current base pages in `start..stop-1` (one range `list`)."""
        pages: dict[int, bytes] = {}
        for key, raw in self.kv.list(start=base_key(start), end=base_key(stop)):
            page = parse_base_key(key)
            data = self._base_page(page, raw)
            if data is not None:
                pages[page] = data
        return pages

    def _base_page(self, page: int, raw: bytes) -> bytes | None:
        """Base page `page` if it is the current version: not superseded by a delta, not past a
        shrink, not written by a compaction pass whose head move has not happened, and not
        written by a generation later than this store's.

        Transaction numbers start again at 1 in a namespace that was dropped and written anew,
        but generations never do (a drop keeps the namespace's generation, and the new writer
        takes it over). So a page of a later generation is either a takeover's (this writer is
        stale) or another incarnation's (this snapshot is): either way not this store's."""
        if page in self.index.deltas or page > self.index.base_limit:
            return None
        generation, txid, data = decode_base(page, raw)
        return data if txid <= self.head.compacted and generation <= self.generation else None

    def _preload(self) -> None:
        """Page 1 and the hinted pages, in one `get` of their chunks and base pages; without
        hints, or when the first read-ahead window covers the file, page 1 and the pages after
        it in one range read; a snapshot of a small database, all of it (`_read_all`). Pages it
        cannot vouch for (absent, superseded) are left to the read path, which reports them."""
        pages = self.head.pages
        if self.read_only and 0 < pages <= _READ_ALL_PAGES and self._read_all():
            return
        hinted = [p for p in self.hints.stored if 1 < p <= pages and p != LOCK_BYTE_PAGE]
        if not hinted or pages <= self._read_ahead.first:
            self.read_page(1, mixed=False)
            return
        index = self.index
        locs: dict[tuple[int, int], None] = {}
        base: list[int] = []
        for page in [1, *hinted]:
            if len(locs) + len(base) == self.limits.max_batch_entries:
                break
            loc = index.deltas.get(page)
            if loc is not None:
                locs[loc] = None
            elif page <= index.base_limit:
                base.append(page)
        raws = self.kv.get([delta_key(*loc) for loc in locs] + [base_key(p) for p in base])
        fetched: dict[int, bytes] = {}
        for loc, raw in zip(locs, raws[: len(locs)], strict=True):
            if raw is not None:
                self._chunk_pages(loc, raw, fetched)
        for page, raw in zip(base, raws[len(locs) :], strict=True):
            data = self._base_page(page, raw) if raw is not None else None
            if data is not None:
                fetched[page] = data
        self.cache.put_many(fetched)

    def _read_all(self) -> bool:
        """A snapshot of a database of at most `_READ_ALL_PAGES`: read all of it in one range
        read (base pages, delta chunks, head, index parts, hints), and adopt the head
        it holds. One `list` is atomic, so a writer committing meanwhile (in place, or by
        compaction) cannot overtake the snapshot, and SQLite needs no other read; reading the
        head, then the pages, a snapshot of a busy writer's database failed most of the time.
        False, with nothing changed, when the range holds more entries than the head read at
        recovery led to expect (the writer grew the database or its deltas meanwhile)."""
        index = self.index
        expected = self.head.base_pages + sum(index.chunks.values()) + len(index.chunks) + 2
        limit = expected + _READ_ALL_SLACK
        rows = self.kv.list(start=base_key(1), end=HINTS_END, limit=limit)
        if len(rows) >= limit:
            return False
        at_head = bisect.bisect_left(rows, (HEAD_KEY,))
        stored = read_stored(rows[at_head:])
        self.head, self.index, self.size = stored.head, stored.index, stored.head.size
        pages: dict[int, bytes] = {}  # a page is current in a chunk or as a base page, not both
        for key, raw in rows[:at_head]:
            if key.startswith(DELTA_PREFIX):
                self._chunk_pages(parse_txid_key(key), raw, pages)
            else:
                page = parse_base_key(key)
                data = self._base_page(page, raw)
                if data is not None:
                    pages[page] = data
        self.cache.put_many(pages)
        return True

    def _fetch_staged(self, pgno: int, chunk: int) -> bytes:
        """A page this transaction staged early; only this generation may have written it."""
        txid = self.head.txid + 1
        raw = self.kv.get([delta_key(txid, chunk)])[0]
        staged = decode_chunk(txid, raw) if raw is not None else None
        if staged is None or staged.generation != self.generation or pgno not in staged.pages:
            raise self._missing(f"staged chunk {chunk} of txid {txid} holding page {pgno}")
        return staged.pages[pgno]

    def _missing(self, what: str) -> Exception:
        """The error for a stored copy that is not there.

        A snapshot's pages can be compacted away; a writer's can only vanish if another
        instance took the namespace over, and then the writer must die, not report corruption.
        """
        if self.read_only:
            return SnapshotExpired(
                f"{what} was rewritten or compacted since this snapshot; reopen the database"
            )
        current = self.kv.generation()
        if current != self.generation:
            return self._die(FenceMismatch(self.generation, current))
        return StorageCorrupt(f"{what} is missing")

    # -- writes -----------------------------------------------------------------------------

    def write(self, data: bytes, offset: int) -> None:
        with self._lock:
            self._check_writable()
            pending = self._pending
            pos, end = offset, offset + len(data)
            if len(data) == PAGE_SIZE and not offset % PAGE_SIZE:
                # SQLite's page writes: no slice, and APSW's bytes kept (compiled, `bytes(data)`
                # is a generic call that costs 0.8k instructions even when it returns `data`)
                page = data if type(data) is bytes else bytes(data)
                if self._refused and self._unchanged(end // PAGE_SIZE, page):
                    pending.dirty.pop(end // PAGE_SIZE, None)  # see `_drop_unchanged`
                else:
                    pending.dirty[end // PAGE_SIZE] = page
                pos = end
            while pos < end:
                pgno, start = divmod(pos, PAGE_SIZE)
                take = min(PAGE_SIZE - start, end - pos)
                chunk = data[pos - offset : pos - offset + take]
                if take == PAGE_SIZE:
                    page = bytes(chunk)
                else:
                    page = self._page_for_update(pgno + 1)
                    page = page[:start] + bytes(chunk) + page[start + take :]
                pending.dirty[pgno + 1] = page
                pos += take
            self.size = max(self.size, end)
            # Not while SQLite rolls a refused transaction back: those pages would meet the
            # refusal again (SQLite holds them all in its in-memory journal anyway).
            if len(pending.dirty) >= self.options.stage_pages and not self._refused:
                self._stage()

    def _page_for_update(self, pgno: int) -> bytes:
        """Current content of a page about to be partly overwritten (zeros past EOF)."""
        return self.read_page(pgno) if (pgno - 1) * PAGE_SIZE < self.size else ZERO_PAGE

    def truncate(self, size: int) -> None:
        with self._lock:
            self._check_writable()
            self._truncate(size)

    def _truncate(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cannot truncate to {size} bytes")
        pending = self._pending
        pages = -(-size // PAGE_SIZE)
        if size < self.size:
            if size % PAGE_SIZE and pages <= self._pages():
                keep = size % PAGE_SIZE
                pending.dirty[pages] = self.read_page(pages)[:keep] + bytes(PAGE_SIZE - keep)
            for pgno in [p for p in pending.dirty if p > pages]:
                del pending.dirty[pgno]
            dropped = [p for p in pending.staged if p > pages]
            for pgno in dropped:
                del pending.staged[pgno]
            if dropped or pages < self.head.pages:
                self._record_shrink(pages)
        self.size = size

    def _shrink_to_header_size(self) -> None:
        """Take into this commit the truncation SQLite makes just after `SQLITE_FCNTL_SYNC`
        when a commit shrinks the file (VACUUM, auto_vacuum), so that the commit stays one KV
        write: the new size is already in page 1's header, which the commit rewrote. The
        truncate that follows then changes nothing. Only a valid header size counts (a SQLite
        header whose version-valid-for equals its change counter), and not one SQLite would
        adjust (the lock-byte page): any other truncate still works, as a second write."""
        page1 = self._pending.dirty.get(1)
        if page1 is None or not page1.startswith(_MAGIC) or page1[24:28] != page1[92:96]:
            return
        pages = int.from_bytes(page1[28:32], "big")
        if 0 < pages < self._pages() and pages != LOCK_BYTE_PAGE:
            self._truncate(pages * PAGE_SIZE)

    def _record_shrink(self, pages: int) -> None:
        pending = self._pending
        after = len(pending.parts)
        if pending.shrinks and pending.shrinks[-1].after_part == after:
            pages = min(pages, pending.shrinks[-1].pages)
            pending.shrinks.pop()
        pending.shrinks.append(Shrink(self.head.txid + 1, after, pages))
        pending.floor = pages if pending.floor is None else min(pending.floor, pages)

    def _pages(self) -> int:
        return -(-self.size // PAGE_SIZE)

    def _dirty_pages(self) -> list[tuple[int, bytes]]:
        """The dirty pages to store, in page order: none past EOF, never the lock-byte page."""
        dirty = list(self._pending.dirty.items())
        if len(dirty) > 1:
            dirty.sort()  # compiled, `sorted` looks `sort` up by name: 0.8k of a one-page commit
        pages = self._pages()
        if dirty and (dirty[-1][0] > pages or LOCK_BYTE_PAGE in self._pending.dirty):
            return [(p, d) for p, d in dirty if p <= pages and p != LOCK_BYTE_PAGE]
        return dirty

    def _stage(self) -> None:
        """Write the dirty pages under the pending txid now, to bound memory."""
        txid = self.head.txid + 1
        pending = self._pending
        try:
            batches = self._planner.plan(self._dirty_pages(), 0)
            self._check_quota(batches)
            for batch in batches:
                puts, entries = self._encode(txid, batch)
                self.kv.write(put=puts, fence=self.generation)
                self.counters.stage_batches += 1
                pending.parts.append(entries)
                pending.staged.update(entries)
        except BaseException as e:
            self._write_failed(e, txid, stored=bool(pending.parts))
            raise
        pending.dirty.clear()

    def _encode(self, txid: int, batch: Batch) -> tuple[dict[bytes, bytes], list[tuple[int, int]]]:
        pending = self._pending
        puts, entries = encode_batch(
            self.generation, txid, len(pending.parts), pending.chunks, batch
        )
        pending.chunks += len(batch.chunks)
        return puts, entries

    # -- commit -----------------------------------------------------------------------------

    def has_pending(self) -> bool:
        p = self._pending
        return bool(p.dirty or p.parts or p.shrinks or self.size != self.head.size)

    def sync(self) -> None:
        """The commit point: make everything written since the last commit visible at once."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        self._check_alive()
        if self.read_only or not self.has_pending():
            return
        self._shrink_to_header_size()
        if self._refused:
            self._refused = False
            self._drop_unchanged()
            if not self.has_pending():
                return
        pending = self._pending
        txid = self.head.txid + 1
        old = self.head
        dirty = self._dirty_pages()
        in_place = self._in_place(dirty)
        if in_place:
            head = Head(txid, self.size, txid, max(old.base_pages, self._pages()), ())
        else:
            shrinks = old.shrinks + tuple(pending.shrinks) if pending.shrinks else old.shrinks
            head = Head(txid, self.size, old.compacted, old.base_pages, shrinks)
        head_raw = head.encode()
        batches: list[Batch] = []
        if not in_place:
            batches = self._planner.plan(dirty, len(HEAD_KEY) + len(head_raw)) or [Batch([])]
        staged_before = bool(pending.parts)
        written = 0
        try:
            self._check_quota(batches)
            if in_place:
                generation = self.generation
                puts = {
                    base_key(pgno): encode_base(generation, txid, pgno, data)
                    for pgno, data in dirty
                }
                puts[HEAD_KEY] = head_raw
                self.kv.write(put=puts, fence=self.generation)
            for number, batch in enumerate(batches):
                puts = {}
                if batch.chunks:
                    puts, entries = self._encode(txid, batch)
                    pending.parts.append(entries)
                if number == len(batches) - 1:
                    puts[HEAD_KEY] = head_raw
                self.kv.write(put=puts, fence=self.generation)
                written += 1
        except BaseException as e:
            self._write_failed(e, txid, stored=bool(written) or staged_before)
            raise
        if in_place:
            self.index.base_limit = head.base_pages
        else:
            self.index.apply_commit(txid, pending.parts, pending.shrinks)
        # The cache may hold the previous version of any page this commit wrote: a staged
        # page can have been brought in by a read-ahead after it was staged.
        if pending.floor is not None:
            self.cache.drop_above(pending.floor)
        for pgno in pending.staged:
            self.cache.discard(pgno)
        for pgno, data in dirty:
            self.cache.put(pgno, data)
        self.head = head
        counters = self.counters
        counters.commits += 1
        if staged_before or len(batches) > 1:
            counters.commits_staged += 1
        else:
            counters.commits_fast += 1
            if in_place:
                counters.commits_in_place += 1
        n_pages = len(dirty) if in_place else 0
        for part in pending.parts:
            n_pages += len(part)
        counters.pages_committed += n_pages
        counters.max_commit_pages = max(counters.max_commit_pages, n_pages)
        pending.reset()

    def _drop_unchanged(self) -> None:
        """Forget dirty pages whose writes change nothing SQLite can see.

        SQLite answers a refused commit (a quota or limit error, `_refuse`) by writing the
        rolled-back pages again from its journal and syncing. Those writes restore what the head
        has, except on freelist leaf pages, whose content SQLite never reads and does not
        journal faithfully. As a commit they would add a delta of every page, which meets the
        same quota: SQLite's pager would stay in its error state and fail every statement. So
        pages equal to the head's are dropped, and so are changed freelist leaves when nothing
        else changed (a leaf put to use always changes its parent and the freelist too). Called
        at the sync after a refusal, and `write` drops unchanged pages as they come until then:
        commits that follow no refusal never pay for the comparison."""
        pending = self._pending
        if pending.parts or pending.shrinks:
            return
        for pgno, data in list(pending.dirty.items()):
            if self._unchanged(pgno, data):
                del pending.dirty[pgno]
        if pending.dirty and self.size == self.head.size:
            leaves = self._free_leaves()
            if all(pgno in leaves for pgno in pending.dirty):
                pending.dirty.clear()

    def _unchanged(self, pgno: int, data: bytes) -> bool:
        """Whether page `pgno` holds `data` in the head's database."""
        return (
            pgno <= self.head.pages
            and pgno != LOCK_BYTE_PAGE
            and (data == self._committed_page(pgno))
        )

    def _free_leaves(self) -> set[int]:
        """The freelist leaf pages of the head's database, read from page 1 and the trunks."""
        page1 = self._committed_page(1)
        if not page1.startswith(_MAGIC):
            return set()
        leaves: set[int] = set()
        trunk = int.from_bytes(page1[32:36], "big")
        for _ in range(self.head.pages):  # a trunk chain is never longer (and never a cycle)
            if not 1 < trunk <= self.head.pages:
                break
            data = self._committed_page(trunk)
            count = min(int.from_bytes(data[4:8], "big"), PAGE_SIZE // 4 - 2)
            leaves.update(int.from_bytes(data[8 + 4 * i : 12 + 4 * i], "big") for i in range(count))
            trunk = int.from_bytes(data[:4], "big")
        return leaves

    def _in_place(self, dirty: list[tuple[int, bytes]]) -> bool:
        """Whether this commit can write its pages over their base pages, in one batch with a
        head that stays fully compacted (`compacted == txid`, no shrinks), instead of as a delta.

        It can when the head is fully compacted, nothing of the transaction was staged or
        shrunk, the pages fit one batch, and every page past the base pages is among them (the
        base pages must be contiguous, and a commit only writes pages below its EOF). The batch
        is atomic and fenced like any commit; only readers of an older head see the difference,
        and a base page newer than their head's `compacted` is refused by `_base_page`."""
        head = self.head
        pending = self._pending
        if (
            not self.options.in_place_commits
            or head.compacted != head.txid
            or head.shrinks
            or pending.parts
            or pending.shrinks
            or len(dirty) > self._in_place_pages
        ):
            return False
        base = self.index.base_limit
        if base != head.base_pages:
            return False
        new_pages = self._pages() - base
        if new_pages <= 0:
            return True
        if base < LOCK_BYTE_PAGE <= base + new_pages:
            new_pages -= 1  # never stored
        for pgno, _ in dirty:
            if pgno > base:
                new_pages -= 1
        return new_pages == 0

    def save_hints(self) -> None:
        """Store the pages learned since the open for the next one (at close).

        Advisory, so a KV failure is kept in `last_error` and counted, not raised: every commit
        is already durable, and the next open works without hints (or with the older ones).
        """
        with self._lock:
            if self.read_only or self.dead is not None or self.head.pages <= self._read_ahead.first:
                return  # (a file the first read-ahead window covers is preloaded whole)
            pages = self.hints.to_save()
            if pages is None:
                return
            try:
                self.kv.write(put={HINTS_KEY: encode_hints(pages)}, fence=self.generation)
            except KvError as e:
                self.last_error = e
                self.counters.hint_save_errors += 1
                return
            self.hints.saved(pages)
            self.counters.hints_saved += 1

    def _check_quota(self, batches: list[Batch]) -> None:
        """Refuse a run of several writes whose chunks and index parts would take the store's
        usage past the quota, before the first of them: one extra round trip, on this path
        only (a single batch is checked by the store as it is written, atomically).

        Without it the writes before the one the store refuses would be wasted, and have to be
        deleted again (`_write_failed`). The store still enforces the quota on each batch:
        another writer of the namespace can take the room between this check and a later
        batch, and the head's growth (a shrink's few bytes) is left to the store's check."""
        if len(batches) > 1:
            check_quota(self.limits, self.kv.used_bytes(), self._planner.stored_bytes(batches))

    def _write_failed(self, error: BaseException, txid: int, *, stored: bool) -> None:
        """Deal with `error`, raised by a write of transaction `txid` (or by the check before
        it), before the caller re-raises it; `stored` says whether earlier writes of the
        transaction went through (staged chunks and index parts).

        A refusal (`LimitError`: the quota or a limit; nothing of that write was applied, and
        the store works) rolls the transaction back, deleting what it staged first, so the
        connection goes on as after a one-batch refusal. `KvUnavailable` is a refusal too while
        nothing is stored; after that, the store that failed would have to delete the staged
        chunks, so the database dies and the next open reaps them. Any other error may have
        left anything: the database dies."""
        refused = isinstance(error, LimitError) or (not stored and isinstance(error, KvUnavailable))
        if not refused:
            raise self._die(error) from error
        if stored:
            self._delete_staged(txid)
        self._refuse(error)

    def _delete_staged(self, txid: int) -> None:
        """Delete every chunk and index part written under `txid`, the pending txid: no head
        names it, so no reader or recovery uses them, and the next transaction, which reuses
        it, must find none. If a delete fails the database dies, leaving them to the next
        open (which deletes whatever lies above the head)."""
        try:
            delete_txids(self.kv, self.generation, txid, txid)
        except BaseException as e:
            raise self._die(e) from e

    def _refuse(self, error: BaseException) -> None:
        """A write of this transaction was refused, and nothing of it is stored (none was, or
        `_delete_staged` deleted it): the transaction is rolled back here, and SQLite, which
        gets the error, rolls back its side (`_drop_unchanged`)."""
        self.last_error = error
        self._discard_pending()
        self._refused = True

    def _discard_pending(self) -> None:
        self._pending.reset()
        self.size = self.head.size

    # -- compaction -------------------------------------------------------------------------

    def needs_compaction(self) -> bool:
        """When the head lists `COMPACT_SHRINKS` shrinks; and, with `auto_compact`, past a
        threshold of live deltas or delta pages, or when garbage outweighs the file: delta pages
        more than four times its pages, or base pages past its end (left by a shrink such as
        VACUUM) more than its pages, so that the stored bytes follow the file down."""
        head = self.head
        if len(head.shrinks) >= COMPACT_SHRINKS:
            return True
        if not self.options.auto_compact:
            return False
        threshold = self.options.compact_deltas
        live = head.txid - head.compacted
        entries = self.index.delta_entries
        past_end = head.base_pages - head.pages
        garbage = (entries > threshold and entries > 4 * head.pages) or (
            past_end > threshold and past_end > head.pages
        )
        return live >= threshold or entries >= self.options.compact_pages or garbage

    def compact(self) -> int:
        """Fold all committed deltas into base pages; return the pages written."""
        with self._lock:
            return self._compact()

    def _compact(self) -> int:
        self._check_writable()
        if self.has_pending():
            raise RuntimeError("cannot compact inside a transaction; commit or roll back first")
        head = self.head
        if head.compacted == head.txid and self.index.base_limit >= head.pages:
            return 0
        stats = self.kv.stats  # compaction's own share of the traffic, for write amplification
        written, round_trips = stats.bytes_written, stats.total
        with self._failures_kept(KvUnavailable, LimitError, StorageCorrupt):
            new_head, folded = compact(self.kv, self.generation, head, self.index, self.cache)
        self.head = new_head
        self.index.compacted(new_head.pages)
        try:
            with self._failures_kept(KvUnavailable):
                delete_folded(self.kv, self.generation, head)
        finally:
            counters = self.counters
            counters.compactions += 1
            counters.pages_compacted += folded
            counters.compaction_bytes_written += stats.bytes_written - written
            counters.compaction_round_trips += stats.total - round_trips
        return folded

    @contextlib.contextmanager
    def _failures_kept(self, *harmless: type[BaseException]) -> Iterator[None]:
        """An error in `harmless` left the store as it was: kept in `last_error` and raised.
        Any other error may have left it anything: it kills the database."""
        try:
            yield
        except harmless as e:
            self.last_error = e
            raise
        except BaseException as e:
            raise self._die(e) from e

    def finish_commit(self) -> None:
        """After SQLite's commit: flush what it wrote after the sync, then maybe compact.

        SQLite truncates the file (VACUUM, shrinking commits) after `SQLITE_FCNTL_SYNC`. It
        ignores an error at this point for the commit itself, which already happened, but
        puts its pager into the error state, so every later statement fails instead of being
        answered from SQLite's page cache: hence a failed flush kills the store and raises
        `DatabaseDead`, as does a compaction that kills it. Harmless auto-compaction failures are
        kept in `last_error` and retried after the next commit.
        """
        with self._lock:
            self._check_alive()
            if self.has_pending():
                try:
                    self._sync()
                except DatabaseDead:
                    raise
                except BaseException as e:
                    raise self._die(e) from e
            if self.needs_compaction():
                with contextlib.suppress(KvError, StorageCorrupt):
                    self._compact()

    # -- life and death ---------------------------------------------------------------------

    def _die(self, error: BaseException) -> DatabaseDead:
        if self.dead is None:
            self.dead = error
            self._discard_pending()
            self.cache.clear()
        self.last_error = error
        return self._dead_error()

    def _dead_error(self) -> DatabaseDead:
        assert self.dead is not None
        return DatabaseDead(self.dead)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self._dead_error()

    def _check_writable(self) -> None:
        self._check_alive()
        if self.read_only:
            raise PermissionError("this database was opened read-only")

    def take_last_error(self) -> BaseException | None:
        with self._lock:
            error, self.last_error = self.last_error, None
            return error

    def metrics(self) -> dict[str, object]:
        with self._lock:
            stats = self.kv.stats
            return {
                **asdict(self.counters),
                "round_trips": dict(stats.round_trips),
                "kv_bytes_written": stats.bytes_written,
                "kv_bytes_read": stats.bytes_read,
                "cache_hits": self.cache.hits,
                "cache_misses": self.cache.misses,
                "cached_pages": len(self.cache),
                "live_deltas": self.head.txid - self.head.compacted,
                "delta_pages": len(self.index.deltas),
                "head_txid": self.head.txid,
                "size_bytes": self.head.size,
                "generation": self.generation,
                "dead": self.dead is not None,
            }
