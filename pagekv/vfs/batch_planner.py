"""Packing a commit's pages into KV batches that respect every `KvLimits` bound.

A batch holds delta chunks (up to `pages_per_chunk` framed pages each, within the value limit) and
one index part listing the chunk of every page in it. Every batch reserves room for the head
record, so the last batch of a commit can always carry the head move: a small commit is exactly one
KV write, a large one is `len(batches)` writes of which only the last is visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagekv.kv import KvLimits
from pagekv.vfs.format import (
    CHUNK_HEADER_BYTES,
    DELTA_KEY_BYTES,
    FRAME_BYTES,
    INDEX_ENTRY_BYTES,
    INDEX_KEY_BYTES,
    VALUE_HEADER_BYTES,
    delta_key,
    encode_chunk,
    encode_index,
    index_key,
)

Page = tuple[int, bytes]


@dataclass(slots=True, init=False)
class Batch:
    """One KV write's worth of a commit's pages, in chunks. Made per commit, so `__init__` is
    written out, as `WriteBatch`'s is."""

    chunks: list[list[Page]]

    def __init__(self, chunks: list[list[Page]]) -> None:
        self.chunks = chunks


def pages_per_chunk(limits: KvLimits) -> int:
    n = (limits.max_value_bytes - CHUNK_HEADER_BYTES) // FRAME_BYTES
    if n < 1:
        raise ValueError(f"max_value_bytes={limits.max_value_bytes} cannot hold one framed page")
    return n


class BatchPlanner:
    """Splits a commit's pages into batches within `limits`. What the limits imply is worked out
    once per open database, not at every commit."""

    def __init__(self, limits: KvLimits) -> None:
        if limits.max_batch_entries < 3:
            raise ValueError(f"{limits} cannot hold a commit: chunk, index part and head")
        self.limits = limits
        self.per_chunk = pages_per_chunk(limits)
        self.max_index_entries = (limits.max_value_bytes - VALUE_HEADER_BYTES) // INDEX_ENTRY_BYTES
        self.new_chunk_bytes = DELTA_KEY_BYTES + CHUNK_HEADER_BYTES
        self.page_bytes = FRAME_BYTES + INDEX_ENTRY_BYTES
        self.one_chunk_pages = min(self.per_chunk, self.max_index_entries)
        self.one_batch_room = (
            limits.max_batch_bytes - INDEX_KEY_BYTES - VALUE_HEADER_BYTES - self.new_chunk_bytes
        )
        """Bytes left for reserve and pages in a batch of one chunk and one index part."""

    def plan(self, pages: list[Page], reserve_bytes: int) -> list[Batch]:
        """Split `pages` greedily into batches; each leaves `reserve_bytes` and one entry spare."""
        n = len(pages)
        if n <= self.one_chunk_pages and reserve_bytes + n * self.page_bytes <= self.one_batch_room:
            return [Batch([pages])] if pages else []  # what the loop below makes, sooner
        limits = self.limits
        base_bytes = INDEX_KEY_BYTES + VALUE_HEADER_BYTES + reserve_bytes
        if base_bytes + self.new_chunk_bytes + self.page_bytes > limits.max_batch_bytes:
            raise ValueError(f"{limits} cannot hold a one-page commit")
        batches: list[Batch] = []
        chunks: list[list[Page]] = []
        used = base_bytes
        n_pages = 0
        for page in pages:
            new_chunk = not chunks or len(chunks[-1]) >= self.per_chunk
            cost = self.page_bytes + (self.new_chunk_bytes if new_chunk else 0)
            full = (
                used + cost > limits.max_batch_bytes
                or (new_chunk and len(chunks) + 3 > limits.max_batch_entries)
                or n_pages + 1 > self.max_index_entries
            )
            if full:
                batches.append(Batch(chunks))
                chunks, used, n_pages, new_chunk = [], base_bytes, 0, True
                cost = self.page_bytes + self.new_chunk_bytes
            if new_chunk:
                chunks.append([])
            chunks[-1].append(page)
            used += cost
            n_pages += 1
        if chunks:
            batches.append(Batch(chunks))
        return batches

    def stored_bytes(self, batches: list[Batch]) -> int:
        """Bytes the chunks and index parts of `batches` add to the store's usage, exactly as
        `encode_batch` makes them and the quota charges them (`entry_size`: key plus value).

        Exact because every key is new: they are under the pending txid, which nothing holds
        (the open reaps an interrupted commit's, a refused transaction deletes its own). The
        head a last batch carries replaces the stored one and is not counted."""
        total = 0
        for batch in batches:
            total += INDEX_KEY_BYTES + VALUE_HEADER_BYTES
            for chunk in batch.chunks:
                total += self.new_chunk_bytes + len(chunk) * self.page_bytes
        return total


def encode_batch(
    generation: int, txid: int, part: int, first_chunk: int, batch: Batch
) -> tuple[dict[bytes, bytes], list[tuple[int, int]]]:
    """The puts of one batch (chunks numbered from `first_chunk`) and its index entries."""
    puts: dict[bytes, bytes] = {}
    entries: list[tuple[int, int]] = []
    for offset, chunk in enumerate(batch.chunks):
        number = first_chunk + offset
        puts[delta_key(txid, number)] = encode_chunk(generation, txid, chunk)
        entries.extend([(pgno, number) for pgno, _ in chunk])
    puts[index_key(txid, part)] = encode_index(entries)
    return puts, entries
