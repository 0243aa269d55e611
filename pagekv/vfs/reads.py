"""The committed database as one open instance sees it, and every read of it from KV.

Why apart: reads are most of what SQLite asks, and what they may return is decided by the head,
the page index and the page cache alone; the open transaction (transaction.py) lays its dirty
pages over them, and a commit (committer.py) moves them forward only once its write returned.

Invariants:
- `head` is the newest commit this instance applied or read; reads never rewind it (only a commit,
  a compaction or a snapshot's whole read at its open changes it).
- A page in `index` is durable: its chunk or base page was stored before the head that names it.
- A cached page equals the newest committed version of that page (`PageCache`); a page of a later
  generation, or of a compaction pass whose head move this instance has not seen, is never taken.
- A stored copy that should be there and is not is reported, never answered with zeros: a
  snapshot's as `SnapshotExpired`, a writer's as a takeover (the database dies) or corruption.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final

from pagekv.kv import CountingKv, FenceMismatch
from pagekv.vfs.errors import SnapshotExpired, StorageCorrupt
from pagekv.vfs.format import (
    DELTA_PREFIX,
    HEAD_KEY,
    HINTS_END,
    LOCK_BYTE_PAGE,
    ZERO_PAGE,
    Head,
    base_key,
    decode_base,
    decode_chunk,
    delta_key,
    parse_base_key,
    parse_txid_key,
)
from pagekv.vfs.health import Health
from pagekv.vfs.page_cache import PageCache
from pagekv.vfs.page_index import PageIndex
from pagekv.vfs.read_ahead import ReadAhead
from pagekv.vfs.recovery import read_stored

_READ_ALL_PAGES: Final = 1024
"""A snapshot reads a database of up to 4 MiB whole, at its open (`PageReader._read_all`)."""
_READ_ALL_SLACK: Final = 32
"""Entries a snapshot's whole read (`PageReader._read_all`) allows beyond what it expects."""


class PageReader:
    """The committed pages of one open database: where each lives, which are cached, and the
    reads that bring the others (a read-ahead window per miss, one round trip each).

    Not thread-safe: every field is guarded by the page store's lock, which its callers hold.
    `head`, `index` and `cache` are package-internal: the committer's apply step and the store's
    compaction move them forward, after the write that made the change durable returned.
    """

    def __init__(
        self,
        kv: CountingKv,
        generation: int,
        head: Head,
        index: PageIndex,
        *,
        read_only: bool,
        cache_pages: int,
        per_chunk: int,
        health: Health,
    ) -> None:
        self._kv = kv
        self._max_entries = kv.limits.max_batch_entries
        self._generation = generation
        self._read_only = read_only
        self._per_chunk = per_chunk
        self._health = health
        self._read_ahead = ReadAhead()
        self.head = head
        self.index = index
        self.cache = PageCache(cache_pages)

    def page(self, pgno: int, mixed: bool = True) -> bytes:
        """Page `pgno` (at most `head.pages`, not the lock-byte page) as the head has it."""
        data = self.cache.get(pgno)
        if data is not None:
            return data
        if pgno in self.index.deltas or pgno <= self.index.base_limit:
            return self._fetch(pgno, mixed=mixed)
        return ZERO_PAGE

    def staged_page(self, pgno: int, chunk: int) -> bytes:
        """A page the open transaction staged early; only this generation may have written it."""
        txid = self.head.txid + 1
        raw = self._kv.get([delta_key(txid, chunk)])[0]
        staged = decode_chunk(txid, raw) if raw is not None else None
        if staged is None or staged.generation != self._generation or pgno not in staged.pages:
            raise self._missing(f"staged chunk {chunk} of txid {txid} holding page {pgno}")
        return staged.pages[pgno]

    def covers_whole_file(self) -> bool:
        """Whether the first read-ahead window covers the file, so an open preloads all of it."""
        return self.head.pages <= self._read_ahead.first

    def _fetch(self, pgno: int, *, mixed: bool = True) -> bytes:
        """Read `pgno` and the read-ahead window after it: the delta chunks holding the window's
        delta pages in one `get`, its base pages in one range `list`. The kind `pgno` is not of
        is fetched only if `mixed` and it fills a quarter of the window, so a point read costs
        one round trip. Caches every current page it brings."""
        index = self.index
        stop = min(pgno + self._read_ahead.window(pgno), self.head.pages + 1)
        per_chunk = self._per_chunk
        max_chunks = min((stop - pgno) // per_chunk + 1, self._max_entries)
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
        raws = self._kv.get([delta_key(*loc) for loc in locs])
        for loc, raw in zip(locs, raws, strict=True):
            if raw is None:
                raise self._missing(f"delta chunk {loc[1]} of txid {loc[0]}")
            self._chunk_pages(loc, raw, pages)
        return pages

    def _chunk_pages(self, loc: tuple[int, int], raw: bytes, into: dict[int, bytes]) -> None:
        """Put into `into` the pages of chunk `loc` that are current: none if a later generation
        wrote it (`_base_page` says why)."""
        chunk = decode_chunk(loc[0], raw)
        if chunk.generation > self._generation:
            return
        for page, data in chunk.pages.items():
            if self.index.deltas.get(page) == loc:
                into[page] = data

    def _list_base(self, start: int, stop: int) -> dict[int, bytes]:
        """The current base pages in `start..stop-1` (one range `list`)."""
        pages: dict[int, bytes] = {}
        for key, raw in self._kv.list(start=base_key(start), end=base_key(stop)):
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
        return data if txid <= self.head.compacted and generation <= self._generation else None

    def preload(self, hints: tuple[int, ...]) -> None:
        """Page 1 and the hinted pages, in one `get` of their chunks and base pages; without
        hints, or when the first read-ahead window covers the file, page 1 and the pages after
        it in one range read; a snapshot of a small database, all of it (`_read_all`). Pages it
        cannot vouch for (absent, superseded) are left to the read path, which reports them."""
        pages = self.head.pages
        if self._read_only and 0 < pages <= _READ_ALL_PAGES and self._read_all():
            return
        hinted = [p for p in hints if 1 < p <= pages and p != LOCK_BYTE_PAGE]
        if not hinted or self.covers_whole_file():
            if pages >= 1:
                self.page(1, mixed=False)
            return
        index = self.index
        locs: dict[tuple[int, int], None] = {}
        base: list[int] = []
        for page in [1, *hinted]:
            if len(locs) + len(base) == self._max_entries:
                break
            loc = index.deltas.get(page)
            if loc is not None:
                locs[loc] = None
            elif page <= index.base_limit:
                base.append(page)
        raws = self._kv.get([delta_key(*loc) for loc in locs] + [base_key(p) for p in base])
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
        recovery led to expect (the writer grew the database or its deltas meanwhile).

        The adopted head may differ from the one recovery read: the caller takes the file's
        size from `head` after the preload."""
        index = self.index
        expected = self.head.base_pages + sum(index.chunks.values()) + len(index.chunks) + 2
        limit = expected + _READ_ALL_SLACK
        rows = self._kv.list(start=base_key(1), end=HINTS_END, limit=limit)
        if len(rows) >= limit:
            return False
        at_head = bisect.bisect_left(rows, (HEAD_KEY,))
        stored = read_stored(rows[at_head:])
        self.head, self.index = stored.head, stored.index
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

    def _missing(self, what: str) -> Exception:
        """The error for a stored copy that is not there.

        A snapshot's pages can be compacted away; a writer's can only vanish if another
        instance took the namespace over, and then the writer must die, not report corruption.
        """
        if self._read_only:
            return SnapshotExpired(
                f"{what} was rewritten or compacted since this snapshot; reopen the database"
            )
        current = self._kv.generation()
        if current != self._generation:
            return self._health.die(FenceMismatch(self._generation, current))
        return StorageCorrupt(f"{what} is missing")
