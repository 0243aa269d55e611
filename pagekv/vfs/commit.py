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


@dataclass(frozen=True, slots=True)
class Batch:
    chunks: list[list[Page]]


def pages_per_chunk(limits: KvLimits) -> int:
    n = (limits.max_value_bytes - CHUNK_HEADER_BYTES) // FRAME_BYTES
    if n < 1:
        raise ValueError(f"max_value_bytes={limits.max_value_bytes} cannot hold one framed page")
    return n


def plan_batches(pages: list[Page], limits: KvLimits, reserve_bytes: int) -> list[Batch]:
    """Split `pages` greedily into batches; each leaves `reserve_bytes` and one entry spare."""
    per_chunk = pages_per_chunk(limits)
    max_index_entries = (limits.max_value_bytes - VALUE_HEADER_BYTES) // INDEX_ENTRY_BYTES
    base_bytes = INDEX_KEY_BYTES + VALUE_HEADER_BYTES + reserve_bytes
    new_chunk_bytes = DELTA_KEY_BYTES + CHUNK_HEADER_BYTES
    page_bytes = FRAME_BYTES + INDEX_ENTRY_BYTES
    if base_bytes + new_chunk_bytes + page_bytes > limits.max_batch_bytes or (
        limits.max_batch_entries < 3
    ):
        raise ValueError(f"{limits} cannot hold a one-page commit")
    n = len(pages)
    fits_one_chunk = n <= min(per_chunk, max_index_entries)
    if fits_one_chunk and base_bytes + new_chunk_bytes + n * page_bytes <= limits.max_batch_bytes:
        return [Batch([pages])] if pages else []  # what the loop below makes, sooner
    batches: list[Batch] = []
    chunks: list[list[Page]] = []
    used = base_bytes
    n_pages = 0
    for page in pages:
        new_chunk = not chunks or len(chunks[-1]) >= per_chunk
        cost = page_bytes + (new_chunk_bytes if new_chunk else 0)
        full = (
            used + cost > limits.max_batch_bytes
            or (new_chunk and len(chunks) + 3 > limits.max_batch_entries)
            or n_pages + 1 > max_index_entries
        )
        if full:
            batches.append(Batch(chunks))
            chunks, used, n_pages, new_chunk = [], base_bytes, 0, True
            cost = page_bytes + new_chunk_bytes
        if new_chunk:
            chunks.append([])
        chunks[-1].append(page)
        used += cost
        n_pages += 1
    if chunks:
        batches.append(Batch(chunks))
    return batches


def encode_batch(
    generation: int, txid: int, part: int, first_chunk: int, batch: Batch
) -> tuple[dict[bytes, bytes], list[tuple[int, int]]]:
    """The puts of one batch (chunks numbered from `first_chunk`) and its index entries."""
    puts: dict[bytes, bytes] = {}
    entries: list[tuple[int, int]] = []
    for offset, chunk in enumerate(batch.chunks):
        number = first_chunk + offset
        puts[delta_key(txid, number)] = encode_chunk(generation, txid, chunk)
        entries.extend((pgno, number) for pgno, _ in chunk)
    puts[index_key(txid, part)] = encode_index(entries)
    return puts, entries
