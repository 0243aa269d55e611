"""Turning the open transaction into KV writes: the commit protocol, and early staging.

Why apart: this is the one place that writes the pages of a transaction, and where an error
decides between a refusal (the database lives on, as SQLite does) and death. A commit is three
steps, each short enough to check on its own:

- plan (`_plan`): decide the new head and the batches from the dirty pages; reads, changes
  nothing. A small commit is one batch (one KV round trip) carrying the head; a commit in place
  (`in_place`) is that one batch with its pages written over their base pages; a large one is
  several batches of which only the last, carrying the head, makes it visible.
- write (`_write`): the KV round trips, encoding each batch as it goes (a huge commit is never
  held encoded whole); on error nothing is applied.
- apply (`_apply`): only after the last write returned, move the reader's index, cache and head
  forward and empty the transaction.

Invariants:
- Nothing is applied before the write carrying the head returned; everything before it is
  written under `head.txid + 1`, which readers and recovery ignore until then.
- After a write whose outcome is unknown (or a fence mismatch) the database dies, and the write
  is never sent again.
- A transaction refused by a limit or the quota, at any of its batches, leaves nothing stored:
  a run of several batches is checked against the usage first (`_check_quota`), and what a
  refused one had written is deleted (`_write_failed`). The database lives on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pagekv.kv import CountingKv, KvUnavailable, LimitError, check_quota
from pagekv.vfs.batch_planner import Batch, BatchPlanner, Page, encode_batch
from pagekv.vfs.format import HEAD_KEY, LOCK_BYTE_PAGE, ZERO_PAGE, Head, base_key, encode_base
from pagekv.vfs.health import Health
from pagekv.vfs.options import Counters
from pagekv.vfs.reads import PageReader
from pagekv.vfs.recovery import delete_txids
from pagekv.vfs.transaction import Transaction

_IN_PLACE_HEAD_BYTES: Final = len(HEAD_KEY) + len(Head().encode())
"""The key and value of a head without shrinks, the only kind an in-place commit writes."""
_BASE_ENTRY_BYTES: Final = len(base_key(1)) + len(encode_base(0, 0, 1, ZERO_PAGE))


@dataclass(slots=True, init=False)
class CommitPlan:
    """What one commit writes, decided before its first write. Made per commit, so `__init__`
    is written out, as `Batch`'s is."""

    txid: int
    head: Head
    head_raw: bytes
    dirty: list[Page]
    """The dirty pages to store, in page order."""
    in_place: bool
    batches: list[Batch]
    """The delta batches (none in place), the last one carrying the head."""
    staged_before: bool
    """Whether part of the transaction was staged before the commit."""

    def __init__(
        self,
        txid: int,
        head: Head,
        head_raw: bytes,
        dirty: list[Page],
        in_place: bool,
        batches: list[Batch],
        staged_before: bool,
    ) -> None:
        self.txid = txid
        self.head = head
        self.head_raw = head_raw
        self.dirty = dirty
        self.in_place = in_place
        self.batches = batches
        self.staged_before = staged_before


class Committer:
    """Writes the open transaction: all of it at a commit, or its dirty pages early (`stage`).

    Not thread-safe: it is called with the page store's lock held, which guards everything it
    touches (the transaction, the reader's head, index and cache, the counters, the health).
    """

    def __init__(
        self,
        kv: CountingKv,
        generation: int,
        planner: BatchPlanner,
        reader: PageReader,
        transaction: Transaction,
        health: Health,
        counters: Counters,
        *,
        in_place_commits: bool,
    ) -> None:
        self._kv = kv
        self._generation = generation
        self._planner = planner
        self._reader = reader
        self._transaction = transaction
        self._health = health
        self._counters = counters
        self._in_place_commits = in_place_commits
        limits = kv.limits
        self._in_place_pages = min(
            limits.max_batch_entries - 1,
            (limits.max_batch_bytes - _IN_PLACE_HEAD_BYTES) // _BASE_ENTRY_BYTES,
        )
        """Most pages an in-place commit writes: with the head, one batch within the limits."""

    def commit(self) -> None:
        """The commit point: make the transaction durable and visible at once. The caller has
        checked that the database lives, is writable and has a transaction."""
        transaction = self._transaction
        transaction.shrink_to_header_size()
        if transaction.refused:
            transaction.refused = False
            transaction.drop_unchanged()
            if not transaction.has_pending():
                return
        plan = self._plan()
        self._write(plan)
        self._apply(plan)

    def stage(self) -> None:
        """Write the dirty pages under the pending txid now, to bound memory."""
        transaction = self._transaction
        txid = self._reader.head.txid + 1
        try:
            batches = self._planner.plan(transaction.dirty_pages(), 0)
            self._check_quota(batches)
            for batch in batches:
                entries = self._write_batch(txid, batch, None)
                self._counters.stage_batches += 1
                transaction.staged.update(entries)
        except BaseException as e:
            self._write_failed(e, txid)
            raise
        transaction.dirty.clear()

    # -- plan ---------------------------------------------------------------------------------

    def _plan(self) -> CommitPlan:
        """The new head and the batches that carry the transaction (changes nothing)."""
        transaction = self._transaction
        old = self._reader.head
        txid = old.txid + 1
        dirty = transaction.dirty_pages()
        in_place = self.in_place(dirty)
        if in_place:
            base_pages = max(old.base_pages, transaction.pages())
            head = Head(txid, transaction.size, txid, base_pages, ())
        else:
            shrinks = old.shrinks
            if transaction.shrinks:
                shrinks = old.shrinks + tuple(transaction.shrinks)
            head = Head(txid, transaction.size, old.compacted, old.base_pages, shrinks)
        head_raw = head.encode()
        batches: list[Batch] = []
        if not in_place:
            batches = self._planner.plan(dirty, len(HEAD_KEY) + len(head_raw)) or [Batch([])]
        return CommitPlan(txid, head, head_raw, dirty, in_place, batches, bool(transaction.parts))

    def in_place(self, dirty: list[Page]) -> bool:
        """Whether this commit can write its pages over their base pages, in one batch with a
        head that stays fully compacted (`compacted == txid`, no shrinks), instead of as a delta.

        It can when the head is fully compacted, nothing of the transaction was staged or
        shrunk, the pages fit one batch, and every page past the base pages is among them (the
        base pages must be contiguous, and a commit only writes pages below its EOF). The batch
        is atomic and fenced like any commit; only readers of an older head see the difference,
        and a base page newer than their head's `compacted` is refused by the reader.
        (Package-internal: a test checks the rule on its own.)"""
        head = self._reader.head
        transaction = self._transaction
        if (
            not self._in_place_commits
            or head.compacted != head.txid
            or head.shrinks
            or transaction.parts
            or transaction.shrinks
            or len(dirty) > self._in_place_pages
        ):
            return False
        base = self._reader.index.base_limit
        if base != head.base_pages:
            return False
        new_pages = transaction.pages() - base
        if new_pages <= 0:
            return True
        if base < LOCK_BYTE_PAGE <= base + new_pages:
            new_pages -= 1  # never stored
        for pgno, _ in dirty:
            if pgno > base:
                new_pages -= 1
        return new_pages == 0

    # -- write --------------------------------------------------------------------------------

    def _write(self, plan: CommitPlan) -> None:
        """The round trips of `plan`; on an error, `_write_failed` decides what it means for
        the transaction and the database before the error is raised again."""
        try:
            self._check_quota(plan.batches)
            if plan.in_place:
                generation = self._generation
                puts = {
                    base_key(pgno): encode_base(generation, plan.txid, pgno, data)
                    for pgno, data in plan.dirty
                }
                puts[HEAD_KEY] = plan.head_raw
                self._kv.write(put=puts, fence=generation)
            last = len(plan.batches) - 1
            for number, batch in enumerate(plan.batches):
                self._write_batch(plan.txid, batch, plan.head_raw if number == last else None)
        except BaseException as e:
            self._write_failed(e, plan.txid)
            raise

    def _write_batch(
        self, txid: int, batch: Batch, head_raw: bytes | None
    ) -> list[tuple[int, int]]:
        """Write `batch` (its chunks numbered on from those stored, its index part next), with
        the head if given; once written, the transaction records it. Returns its index entries."""
        transaction = self._transaction
        puts: dict[bytes, bytes]
        entries: list[tuple[int, int]]
        if batch.chunks:
            puts, entries = encode_batch(
                self._generation, txid, len(transaction.parts), transaction.chunks, batch
            )
        else:
            puts, entries = {}, []
        if head_raw is not None:
            puts[HEAD_KEY] = head_raw
        self._kv.write(put=puts, fence=self._generation)
        if batch.chunks:
            transaction.stored(entries, len(batch.chunks))
        return entries

    def _check_quota(self, batches: list[Batch]) -> None:
        """Refuse a run of several writes whose chunks and index parts would take the store's
        usage past the quota, before the first of them: one extra round trip, on this path
        only (a single batch is checked by the store as it is written, atomically).

        Without it the writes before the one the store refuses would be wasted, and have to be
        deleted again (`_write_failed`). The store still enforces the quota on each batch:
        another writer of the namespace can take the room between this check and a later
        batch, and the head's growth (a shrink's few bytes) is left to the store's check."""
        if len(batches) > 1:
            check_quota(self._kv.limits, self._kv.used_bytes(), self._planner.stored_bytes(batches))

    def _write_failed(self, error: BaseException, txid: int) -> None:
        """Deal with `error`, raised by a write of transaction `txid` (or by the check before
        it), before the caller re-raises it.

        A refusal (`LimitError`: the quota or a limit; nothing of that write was applied, and
        the store works) rolls the transaction back, deleting what it stored first (staged
        chunks and index parts), so the connection goes on as after a one-batch refusal.
        `KvUnavailable` is a refusal too while nothing is stored; after that, the store that
        failed would have to delete the staged chunks, so the database dies and the next open
        reaps them. Any other error may have left anything: the database dies."""
        stored = bool(self._transaction.parts)
        refused = isinstance(error, LimitError) or (not stored and isinstance(error, KvUnavailable))
        if not refused:
            raise self._health.die(error) from error
        if stored:
            self._delete_staged(txid)
        self._refuse(error)

    def _delete_staged(self, txid: int) -> None:
        """Delete every chunk and index part written under `txid`, the pending txid: no head
        names it, so no reader or recovery uses them, and the next transaction, which reuses
        it, must find none. If a delete fails the database dies, leaving them to the next
        open (which deletes whatever lies above the head)."""
        try:
            delete_txids(self._kv, self._generation, txid, txid)
        except BaseException as e:
            raise self._health.die(e) from e

    def _refuse(self, error: BaseException) -> None:
        """A write of this transaction was refused, and nothing of it is stored (none was, or
        `_delete_staged` deleted it): the transaction is rolled back here, and SQLite, which
        gets the error, rolls back its side (`Transaction.drop_unchanged`)."""
        self._health.last_error = error
        self._transaction.roll_back()
        self._transaction.refused = True

    # -- apply --------------------------------------------------------------------------------

    def _apply(self, plan: CommitPlan) -> None:
        """The commit is durable: move the index, the cache and the head to it, count it, and
        empty the transaction."""
        reader = self._reader
        transaction = self._transaction
        if plan.in_place:
            reader.index.base_limit = plan.head.base_pages
        else:
            reader.index.apply_commit(plan.txid, transaction.parts, transaction.shrinks)
        # The cache may hold the previous version of any page this commit wrote: a staged
        # page can have been brought in by a read-ahead after it was staged.
        cache = reader.cache
        if transaction.floor is not None:
            cache.drop_above(transaction.floor)
        for pgno in transaction.staged:
            cache.discard(pgno)
        for pgno, data in plan.dirty:
            cache.put(pgno, data)
        reader.head = plan.head
        self._count(plan)
        transaction.reset()

    def _count(self, plan: CommitPlan) -> None:
        counters = self._counters
        counters.commits += 1
        if plan.staged_before or len(plan.batches) > 1:
            counters.commits_staged += 1
        else:
            counters.commits_fast += 1
            if plan.in_place:
                counters.commits_in_place += 1
        n_pages = len(plan.dirty) if plan.in_place else 0
        for part in self._transaction.parts:
            n_pages += len(part)
        counters.pages_committed += n_pages
        counters.max_commit_pages = max(counters.max_commit_pages, n_pages)
