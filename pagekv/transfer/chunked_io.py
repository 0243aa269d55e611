"""A namespace's entries read, and written, in bounded pieces: for tools that move many (an
export's and an import's `ctx.kv` entries, a copy of a whole namespace)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from pagekv.kv import ActorKv, KvLimits, entry_size

READ_ROWS: Final = 128
"""Entries per `list` of `scan`: at most 16 MiB of values at the default value limit."""


def scan(
    kv: ActorKv, start: bytes | None = None, end: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The entries of `kv` from `start` to `end` (None: unbounded), in key order, `READ_ROWS`
    a `list`. Not one snapshot: an entry written meanwhile may or may not be seen."""
    while True:
        rows = kv.list(start=start, end=end, limit=READ_ROWS)
        yield from rows
        if len(rows) < READ_ROWS:
            return
        start = rows[-1][0] + b"\x00"


def batches(
    entries: Iterable[tuple[bytes, bytes]], limits: KvLimits
) -> Iterator[dict[bytes, bytes]]:
    """`entries` in order, as batches of at most `max_batch_entries` entries and
    `max_batch_bytes` bytes of keys and values. An entry too big for any batch is passed on
    alone, for the write to refuse it with the limit's own typed error."""
    batch: dict[bytes, bytes] = {}
    size = 0
    for key, value in entries:
        cost = entry_size(key, value)
        if batch and (
            len(batch) == limits.max_batch_entries or size + cost > limits.max_batch_bytes
        ):
            yield batch
            batch, size = {}, 0
        batch[key] = value
        size += cost
    if batch:
        yield batch
