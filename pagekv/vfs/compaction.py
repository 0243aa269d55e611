"""Folding committed deltas into base pages, in bounded, fenced, idempotent batches.

A pass folds every live delta up to the head. If the file shrank since the last pass, it first
deletes the base pages past EOF (no reader looks there). Then it writes the newest version of each
delta page as a base page (and zero pages for holes), the last batch carrying the head move
(`compacted` and `base_pages` set, `shrinks` cleared), so a small pass writes once before it
deletes the folded chunks and index parts (`delete_folded`, once the writer has adopted the new
head). Until the head moves, readers still prefer the deltas, so the base writes are invisible;
after it moves the deltas are ignored, so the deletes are invisible. A crash at any point leaves a
readable database, and a pass repeated after a crash writes the same bytes again.

Invariant: when the head has no shrinks, no base page lies past EOF. A shrink is recorded in the
head until the pass that deletes what lies past EOF moves the head, so skipping the range delete
of a pass without shrinks (most passes) leaves nothing behind. Pages are taken from the page cache
where it holds them (a cached page is the newest committed version, the one the index points at),
so a pass over recently written pages reads nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from pagekv.kv import ActorKv, KvLimits
from pagekv.vfs.errors import StorageCorrupt
from pagekv.vfs.format import (
    BASE_END,
    HEAD_KEY,
    LOCK_BYTE_PAGE,
    ZERO_PAGE,
    Head,
    base_key,
    decode_chunk,
    delta_key,
    encode_base,
)
from pagekv.vfs.page_cache import PageCache
from pagekv.vfs.page_index import DeltaLoc, PageIndex
from pagekv.vfs.recovery import delete_txids

_CHUNKS_PER_READ: Final = 8


class _BatchWriter:
    """Accumulates puts and flushes each batch before it would break a limit."""

    def __init__(self, kv: ActorKv, fence: int, limits: KvLimits) -> None:
        self.kv, self.fence, self.limits = kv, fence, limits
        self.puts: dict[bytes, bytes] = {}
        self.bytes = 0
        self.writes = 0

    def put(self, key: bytes, value: bytes) -> None:
        size = len(key) + len(value)
        if len(self.puts) + 1 > self.limits.max_batch_entries or (
            self.bytes + size > self.limits.max_batch_bytes
        ):
            self.flush()
        self.puts[key] = value
        self.bytes += size

    def flush(self) -> None:
        if self.puts:
            self.kv.write(put=self.puts, fence=self.fence)
            self.writes += 1
            self.puts, self.bytes = {}, 0


def compact(
    kv: ActorKv, fence: int, head: Head, index: PageIndex, cache: PageCache
) -> tuple[Head, int]:
    """Fold all live deltas up to the head move; return the new head and the pages written.
    The folded deltas stay until `delete_folded`."""
    pages = head.pages
    if head.shrinks:
        kv.delete_range(base_key(pages + 1), BASE_END, fence=fence)
    writer = _BatchWriter(kv, fence, kv.limits)
    by_chunk: dict[DeltaLoc, list[int]] = {}
    for pgno, loc in index.deltas.items():
        data = cache.peek(pgno)
        if data is None:
            by_chunk.setdefault(loc, []).append(pgno)
        else:
            writer.put(base_key(pgno), encode_base(fence, loc[0], pgno, data))
    folded = len(index.deltas) - sum(map(len, by_chunk.values()))
    ordered = sorted(by_chunk)
    per_read = min(_CHUNKS_PER_READ, kv.limits.max_batch_entries)
    for i in range(0, len(ordered), per_read):
        locs = ordered[i : i + per_read]
        raws = kv.get([delta_key(*loc) for loc in locs])
        for (txid, chunk), raw in zip(locs, raws, strict=True):
            if raw is None:
                raise StorageCorrupt(f"delta chunk {chunk} of txid {txid} is missing")
            frames = decode_chunk(txid, raw).pages
            for pgno in by_chunk[(txid, chunk)]:
                writer.put(base_key(pgno), encode_base(fence, txid, pgno, frames[pgno]))
                folded += 1
    for pgno in range(index.base_limit + 1, pages + 1):
        if pgno not in index.deltas and pgno != LOCK_BYTE_PAGE:
            writer.put(base_key(pgno), encode_base(fence, head.txid, pgno, ZERO_PAGE))
            folded += 1
    new_head = replace(head, compacted=head.txid, base_pages=pages, shrinks=())
    writer.put(HEAD_KEY, new_head.encode())
    writer.flush()
    return new_head, folded


def delete_folded(kv: ActorKv, fence: int, folded: Head) -> None:
    """Delete the chunks and index parts a pass folded (those up to `folded.txid`, the head it
    started from). A separate step, taken once the writer has adopted the new head: if it fails,
    the new head is already the truth, and the next pass (or open) deletes what is left."""
    delete_txids(kv, fence, 0, folded.txid)
