"""The open transaction: the pages SQLite wrote since the last commit, over the committed ones.

Why apart: what SQLite sees between two commits is the committed database (reads.py) with this
overlay on top: dirty pages held in memory, pages already staged to KV under the pending txid (a
huge transaction's, to bound memory), truncations recorded as shrinks, and the file's size. The
committer (committer.py) turns it into KV writes; until then nothing of it is visible elsewhere.

Invariants:
- A page reads as its newest version in this transaction: dirty, else staged, else zeros above
  the lowest size the file shrank to (`floor`), else the committed page.
- `staged`, `parts` and `chunks` describe what is stored under `head.txid + 1` and nothing else;
  no head names that txid, so readers and recovery ignore it until the commit's head move.
- `size != head.size` or any dirty page, part or shrink means there is something to commit.
"""

from __future__ import annotations

from typing import Final

from pagekv.vfs.batch_planner import Page
from pagekv.vfs.format import LOCK_BYTE_PAGE, PAGE_SIZE, ZERO_PAGE, Shrink
from pagekv.vfs.reads import PageReader

MAGIC: Final = b"SQLite format 3\x00"
"""The start of SQLite's database header, on page 1."""


class Transaction:
    """The transaction being built: dirty pages, whatever was already staged to KV, the
    truncations, and the file's size as SQLite sees it.

    Not thread-safe: every field is guarded by the page store's lock, which its callers hold.
    The fields are package-internal: the committer reads them to plan and write a commit, and
    records what it stored (`stored`).
    """

    def __init__(self, reader: PageReader, stage_pages: int) -> None:
        self._reader = reader
        self._stage_pages = stage_pages
        self.size = reader.head.size
        """The file's size in bytes, with this transaction's writes and truncations."""
        self.dirty: dict[int, bytes] = {}
        self.staged: dict[int, int] = {}
        """Staged page -> chunk number under the pending txid."""
        self.parts: list[list[tuple[int, int]]] = []
        """The index entries of each batch staged so far, in order."""
        self.shrinks: list[Shrink] = []
        self.chunks = 0
        """Chunks staged so far (the next one's number)."""
        self.floor: int | None = None
        """Lowest page count the file shrank to; committed pages above it are hidden."""
        self.refused = False
        """Whether the last commit was refused with nothing written (`drop_unchanged`)."""

    # -- SQLite's view ------------------------------------------------------------------------

    def page(self, pgno: int, mixed: bool = True) -> bytes:
        """Page `pgno` as SQLite sees it now (zeros past EOF and for the lock-byte page)."""
        if pgno > self.pages() or pgno == LOCK_BYTE_PAGE:
            return ZERO_PAGE
        data = self.dirty.get(pgno)
        if data is not None:
            return data
        chunk = self.staged.get(pgno)
        if chunk is not None:
            return self._reader.staged_page(pgno, chunk)
        if self.floor is not None and pgno > self.floor:
            return ZERO_PAGE
        return self._reader.page(pgno, mixed)

    def pages(self) -> int:
        return -(-self.size // PAGE_SIZE)

    def has_pending(self) -> bool:
        return bool(self.dirty or self.parts or self.shrinks or self.size != self._reader.head.size)

    def write(self, data: bytes, offset: int) -> None:
        pos, end = offset, offset + len(data)
        if len(data) == PAGE_SIZE and not offset % PAGE_SIZE:
            # SQLite's page writes: no slice, and APSW's bytes kept (compiled, `bytes(data)`
            # is a generic call that costs 0.8k instructions even when it returns `data`)
            page = data if type(data) is bytes else bytes(data)
            if self.refused and self._unchanged(end // PAGE_SIZE, page):
                self.dirty.pop(end // PAGE_SIZE, None)  # see `drop_unchanged`
            else:
                self.dirty[end // PAGE_SIZE] = page
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
            self.dirty[pgno + 1] = page
            pos += take
        self.size = max(self.size, end)

    def should_stage(self) -> bool:
        """Whether the dirty pages reached `stage_pages`. Not while SQLite rolls a refused
        transaction back: those pages would meet the refusal again (SQLite holds them all in its
        in-memory journal anyway)."""
        return len(self.dirty) >= self._stage_pages and not self.refused

    def _page_for_update(self, pgno: int) -> bytes:
        """Current content of a page about to be partly overwritten (zeros past EOF)."""
        return self.page(pgno) if (pgno - 1) * PAGE_SIZE < self.size else ZERO_PAGE

    def truncate(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cannot truncate to {size} bytes")
        pages = -(-size // PAGE_SIZE)
        if size < self.size:
            if size % PAGE_SIZE and pages <= self.pages():
                keep = size % PAGE_SIZE
                self.dirty[pages] = self.page(pages)[:keep] + bytes(PAGE_SIZE - keep)
            for pgno in [p for p in self.dirty if p > pages]:
                del self.dirty[pgno]
            dropped = [p for p in self.staged if p > pages]
            for pgno in dropped:
                del self.staged[pgno]
            if dropped or pages < self._reader.head.pages:
                self._record_shrink(pages)
        self.size = size

    def _record_shrink(self, pages: int) -> None:
        after = len(self.parts)
        if self.shrinks and self.shrinks[-1].after_part == after:
            pages = min(pages, self.shrinks[-1].pages)
            self.shrinks.pop()
        self.shrinks.append(Shrink(self._reader.head.txid + 1, after, pages))
        self.floor = pages if self.floor is None else min(self.floor, pages)

    # -- before a commit ----------------------------------------------------------------------

    def shrink_to_header_size(self) -> None:
        """Take into this commit the truncation SQLite makes just after `SQLITE_FCNTL_SYNC`
        when a commit shrinks the file (VACUUM, auto_vacuum), so that the commit stays one KV
        write: the new size is already in page 1's header, which the commit rewrote. The
        truncate that follows then changes nothing. Only a valid header size counts (a SQLite
        header whose version-valid-for equals its change counter), and not one SQLite would
        adjust (the lock-byte page): any other truncate still works, as a second write."""
        page1 = self.dirty.get(1)
        if page1 is None or not page1.startswith(MAGIC) or page1[24:28] != page1[92:96]:
            return
        pages = int.from_bytes(page1[28:32], "big")
        if 0 < pages < self.pages() and pages != LOCK_BYTE_PAGE:
            self.truncate(pages * PAGE_SIZE)

    def dirty_pages(self) -> list[Page]:
        """The dirty pages to store, in page order: none past EOF, never the lock-byte page."""
        dirty = list(self.dirty.items())
        if len(dirty) > 1:
            dirty.sort()  # compiled, `sorted` looks `sort` up by name: 0.8k of a one-page commit
        pages = self.pages()
        if dirty and (dirty[-1][0] > pages or LOCK_BYTE_PAGE in self.dirty):
            return [(p, d) for p, d in dirty if p <= pages and p != LOCK_BYTE_PAGE]
        return dirty

    def drop_unchanged(self) -> None:
        """Forget dirty pages whose writes change nothing SQLite can see.

        SQLite answers a refused commit (a quota or limit error, `Committer._refuse`) by writing
        the rolled-back pages again from its journal and syncing. Those writes restore what the
        head has, except on freelist leaf pages, whose content SQLite never reads and does not
        journal faithfully. As a commit they would add a delta of every page, which meets the
        same quota: SQLite's pager would stay in its error state and fail every statement. So
        pages equal to the head's are dropped, and so are changed freelist leaves when nothing
        else changed (a leaf put to use always changes its parent and the freelist too). Called
        at the sync after a refusal, and `write` drops unchanged pages as they come until then:
        commits that follow no refusal never pay for the comparison."""
        if self.parts or self.shrinks:
            return
        for pgno, data in list(self.dirty.items()):
            if self._unchanged(pgno, data):
                del self.dirty[pgno]
        if self.dirty and self.size == self._reader.head.size:
            leaves = self._free_leaves()
            if all(pgno in leaves for pgno in self.dirty):
                self.dirty.clear()

    def _unchanged(self, pgno: int, data: bytes) -> bool:
        """Whether page `pgno` holds `data` in the head's database."""
        return (
            pgno <= self._reader.head.pages
            and pgno != LOCK_BYTE_PAGE
            and (data == self._reader.page(pgno))
        )

    def _free_leaves(self) -> set[int]:
        """The freelist leaf pages of the head's database, read from page 1 and the trunks."""
        reader = self._reader
        page1 = reader.page(1)
        if not page1.startswith(MAGIC):
            return set()
        leaves: set[int] = set()
        pages = reader.head.pages
        trunk = int.from_bytes(page1[32:36], "big")
        for _ in range(pages):  # a trunk chain is never longer (and never a cycle)
            if not 1 < trunk <= pages:
                break
            data = reader.page(trunk)
            count = min(int.from_bytes(data[4:8], "big"), PAGE_SIZE // 4 - 2)
            leaves.update(int.from_bytes(data[8 + 4 * i : 12 + 4 * i], "big") for i in range(count))
            trunk = int.from_bytes(data[:4], "big")
        return leaves

    # -- after a commit or a staging write ----------------------------------------------------

    def stored(self, entries: list[tuple[int, int]], chunks: int) -> None:
        """A write of `chunks` chunks under the pending txid, holding the pages `entries`
        lists (its index part), returned."""
        self.parts.append(entries)
        self.chunks += chunks

    def reset(self) -> None:
        """Empty it for the next transaction, as a new one would be, keeping the size (after a
        commit, the new head's), and making only the containers that were used: a one-page
        commit fills `dirty` alone, and making the four anew was 3% of its time. `parts` and
        `shrinks` are replaced, not cleared: the page index keeps them."""
        self.dirty.clear()
        if self.staged:
            self.staged = {}
        if self.parts:
            self.parts = []
        if self.shrinks:
            self.shrinks = []
        self.chunks = 0
        self.floor = None

    def roll_back(self) -> None:
        """Drop the transaction: the file is the head's again."""
        self.reset()
        self.size = self._reader.head.size
