"""The page store: one database file's bytes over the actor KV.

This is everything the VFS file does, without APSW; `page_file.py` only adapts it to SQLite's
callbacks. `PageStore` takes the lock and hands each call to the piece that owns its state:
- `reads.py` (`PageReader`): the committed database (head, page index, page cache) and its reads;
- `transaction.py` (`Transaction`): the open transaction laid over it, as SQLite sees the file;
- `committer.py` (`Committer`): the transaction's KV writes, at the commit or staged early;
- `health.py` (`Health`): fatal-on-error, and the last storage error;
- `compaction.py`: folding deltas into base pages, which `PageStore` starts when they pile up.

Invariants (each piece's docstring has its own):
- Reads never see uncommitted data of another instance, and never rewind the head.
- A commit is visible exactly when the batch carrying its head record is applied.
- After a write whose outcome is unknown (or a fence mismatch) the store is dead: it drops its
  buffers and answers every call with `DatabaseDead`, and never resends the write.
- A transaction refused by a limit or the quota leaves nothing stored, and the store lives on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from typing import Final

from librt.threading import Lock

from pagekv.kv import ActorKv, CountingKv, KvError, KvUnavailable, LimitError
from pagekv.vfs.batch_planner import BatchPlanner
from pagekv.vfs.committer import Committer
from pagekv.vfs.compaction import compact, delete_folded
from pagekv.vfs.errors import DatabaseDead, StorageCorrupt
from pagekv.vfs.format import COMPACT_SHRINKS, HINTS_KEY, PAGE_SIZE, encode_hints
from pagekv.vfs.health import Health
from pagekv.vfs.options import Counters, Options
from pagekv.vfs.preload import MAX_HINT_PAGES, PreloadHints
from pagekv.vfs.reads import PageReader
from pagekv.vfs.recovery import recover
from pagekv.vfs.transaction import Transaction

_DEFAULT_OPTIONS: Final = Options()


class PageStore:
    """One open database file's pages over `kv`: the coordinator of its pieces.

    SQLite calls it from one thread at a time, but `Database.compact()` and `metrics()` may come
    from any thread, so the methods they and the file call take `_lock` (`has_pending` and
    `needs_compaction` expect it held, or only read), and the pieces, which are not thread-safe,
    are only called with it held: `_lock` guards all their state and this class's (`hints`,
    `counters`). It is `librt`'s lock, not `threading`'s: compiled, a `with` block on it costs
    about 20 ns instead of 260 (an `RLock`), and a commit takes it several times. It is not
    reentrant, which is why `finish_commit` calls `_sync` and `_compact`, never `sync` and
    `compact`.

    `reader`, `transaction`, `committer` and `health` are package-internal (`page_file.py`,
    `database.py` and the tests reach them); `kv`, `generation`, `read_only`, `options` and
    `counters` never change after the open (the counters' values do).
    """

    def __init__(
        self, kv: ActorKv, *, read_only: bool = False, options: Options = _DEFAULT_OPTIONS
    ):
        self.kv = CountingKv(kv)
        self.read_only = read_only
        self.options = options
        self._lock = Lock()
        planner = BatchPlanner(kv.limits)  # before the takeover: bad limits change nothing
        self.counters = Counters()
        self.health = Health(self._drop_buffers)
        recovered = recover(self.kv, read_only=read_only)
        self.generation = recovered.generation
        self.counters.orphan_cleanups = recovered.orphans_removed + recovered.leftovers_removed
        self.reader = PageReader(
            self.kv,
            self.generation,
            recovered.head,
            recovered.index,
            read_only=read_only,
            cache_pages=options.cache_pages,
            per_chunk=planner.per_chunk,
            health=self.health,
        )
        self.transaction = Transaction(self.reader, options.stage_pages)
        self.committer = Committer(
            self.kv,
            self.generation,
            planner,
            self.reader,
            self.transaction,
            self.health,
            self.counters,
            in_place_commits=options.in_place_commits,
        )
        use_hints = options.preload_hints
        budget = min(MAX_HINT_PAGES, kv.limits.max_batch_entries - 1) if use_hints else 0
        self.hints = PreloadHints(recovered.hints if use_hints else (), budget)
        self.reader.preload(self.hints.stored)
        self.transaction.roll_back()  # the size of the head a snapshot's preload may have read
        self.counters.pages_preloaded = len(self.reader.cache)

    # -- SQLite's file ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The file's size in bytes, as SQLite sees it."""
        return self.transaction.size

    def read(self, amount: int, offset: int) -> bytes:
        """Bytes `offset..offset+amount`, short if the file ends first."""
        with self._lock:
            self.health.check_alive()
            transaction = self.transaction
            end = offset + amount
            hints = self.hints
            if amount == PAGE_SIZE and not offset % PAGE_SIZE and end <= transaction.size:
                pgno = end // PAGE_SIZE
                if hints.learning:
                    hints.note(pgno)
                return transaction.page(pgno)  # SQLite's page reads: no copy
            end = min(end, transaction.size)
            out = bytearray()
            pos = offset
            while pos < end:
                pgno, start = divmod(pos, PAGE_SIZE)
                if hints.learning:
                    hints.note(pgno + 1)
                take = min(PAGE_SIZE - start, end - pos)
                out += transaction.page(pgno + 1)[start : start + take]
                pos += take
            return bytes(out)

    def write(self, data: bytes, offset: int) -> None:
        with self._lock:
            self._check_writable()
            self.transaction.write(data, offset)
            if self.transaction.should_stage():
                self.committer.stage()

    def truncate(self, size: int) -> None:
        with self._lock:
            self._check_writable()
            self.transaction.truncate(size)

    def has_pending(self) -> bool:
        return self.transaction.has_pending()

    def sync(self) -> None:
        """The commit point: make everything written since the last commit visible at once."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        self.health.check_alive()
        if self.read_only or not self.transaction.has_pending():
            return
        self.committer.commit()

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
            self.health.check_alive()
            if self.transaction.has_pending():
                try:
                    self._sync()
                except DatabaseDead:
                    raise
                except BaseException as e:
                    raise self.health.die(e) from e
            if self.needs_compaction():
                with contextlib.suppress(KvError, StorageCorrupt):
                    self._compact()

    # -- compaction ---------------------------------------------------------------------------

    def needs_compaction(self) -> bool:
        """When the head lists `COMPACT_SHRINKS` shrinks; and, with `auto_compact`, past a
        threshold of live deltas or delta pages, or when garbage outweighs the file: delta pages
        more than four times its pages, or base pages past its end (left by a shrink such as
        VACUUM) more than its pages, so that the stored bytes follow the file down."""
        head = self.reader.head
        if len(head.shrinks) >= COMPACT_SHRINKS:
            return True
        if not self.options.auto_compact:
            return False
        threshold = self.options.compact_deltas
        live = head.txid - head.compacted
        entries = self.reader.index.delta_entries
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
        if self.transaction.has_pending():
            raise RuntimeError("cannot compact inside a transaction; commit or roll back first")
        reader = self.reader
        head = reader.head
        if head.compacted == head.txid and reader.index.base_limit >= head.pages:
            return 0
        stats = self.kv.stats  # compaction's own share of the traffic, for write amplification
        written, round_trips = stats.bytes_written, stats.total
        with self._failures_kept(KvUnavailable, LimitError, StorageCorrupt):
            new_head, folded = compact(self.kv, self.generation, head, reader.index, reader.cache)
        reader.head = new_head
        reader.index.compacted(new_head.pages)
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
            self.health.last_error = e
            raise
        except BaseException as e:
            raise self.health.die(e) from e

    # -- life, hints and metrics --------------------------------------------------------------

    def _check_writable(self) -> None:
        self.health.check_alive()
        if self.read_only:
            raise PermissionError("this database was opened read-only")

    def _drop_buffers(self) -> None:
        """What dying drops (`Health.die`): the open transaction and the page cache."""
        self.transaction.roll_back()
        self.reader.cache.clear()

    def save_hints(self) -> None:
        """Store the pages learned since the open for the next one (at close).

        Advisory, so a KV failure is kept in `last_error` and counted, not raised: every commit
        is already durable, and the next open works without hints (or with the older ones).
        """
        with self._lock:
            if self.read_only or self.health.dead is not None or self.reader.covers_whole_file():
                return  # (a file the first read-ahead window covers is preloaded whole)
            pages = self.hints.to_save()
            if pages is None:
                return
            try:
                self.kv.write(put={HINTS_KEY: encode_hints(pages)}, fence=self.generation)
            except KvError as e:
                self.health.last_error = e
                self.counters.hint_save_errors += 1
                return
            self.hints.saved(pages)
            self.counters.hints_saved += 1

    def take_last_error(self) -> BaseException | None:
        with self._lock:
            health = self.health
            error, health.last_error = health.last_error, None
            return error

    def metrics(self) -> dict[str, object]:
        with self._lock:
            stats = self.kv.stats
            head = self.reader.head
            cache = self.reader.cache
            return {
                **asdict(self.counters),
                "round_trips": dict(stats.round_trips),
                "kv_bytes_written": stats.bytes_written,
                "kv_bytes_read": stats.bytes_read,
                "cache_hits": cache.hits,
                "cache_misses": cache.misses,
                "cached_pages": len(cache),
                "live_deltas": head.txid - head.compacted,
                "delta_pages": len(self.reader.index.deltas),
                "head_txid": head.txid,
                "size_bytes": head.size,
                "generation": self.generation,
                "dead": self.health.dead is not None,
            }
