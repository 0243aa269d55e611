"""Opening a database's storage: take over, read the head, rebuild the index, reap leftovers.

Round trips are bounded and independent of the database's size: one takeover, one range read of
the head, all index parts (the index is 8 bytes per page of the live deltas, which compaction
bounds) and the preload hints, and at most four fenced range deletes when an interrupted commit or
compaction left orphans behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagekv.kv import ActorKv
from pagekv.vfs.format import (
    DELTA_END,
    DELTA_PREFIX,
    HEAD_KEY,
    HINTS_END,
    HINTS_KEY,
    INDEX_END,
    INDEX_PREFIX,
    MAX_TXID,
    Head,
    decode_hints,
    decode_index,
    parse_txid_key,
    txid_bound,
)
from pagekv.vfs.page_index import PageIndex


@dataclass(frozen=True, slots=True)
class Recovered:
    generation: int
    head: Head
    index: PageIndex
    orphans_removed: bool
    leftovers_removed: bool
    hints: tuple[int, ...]


def recover(kv: ActorKv, *, read_only: bool) -> Recovered:
    """Take over (unless `read_only`) and load a consistent view of the stored database."""
    generation = kv.generation() if read_only else kv.takeover()
    stored = read_stored(kv.list(start=HEAD_KEY, end=HINTS_END))
    head, orphans, leftovers = stored.head, stored.orphans, stored.leftovers
    if not read_only:
        if orphans:
            delete_txids(kv, generation, head.txid + 1, MAX_TXID)
        if leftovers:
            delete_txids(kv, generation, 0, head.compacted)
    return Recovered(
        generation,
        head,
        stored.index,
        orphans and not read_only,
        leftovers and not read_only,
        stored.hints,
    )


@dataclass(frozen=True, slots=True)
class Stored:
    """What the head, index parts and hints of one range read say."""

    head: Head
    index: PageIndex
    hints: tuple[int, ...]
    orphans: bool
    """Index parts of txids above the head: an interrupted commit's."""
    leftovers: bool
    """Index parts of txids at or below `compacted`: a finished compaction's."""


def read_stored(rows: list[tuple[bytes, bytes]]) -> Stored:
    """Parse the rows of a range read from `HEAD_KEY` to `HINTS_END`, in key order."""
    head = Head()
    if rows and rows[0][0] == HEAD_KEY:
        head = Head.decode(rows[0][1])
        rows = rows[1:]
    hints: tuple[int, ...] = ()
    if rows and rows[-1][0] == HINTS_KEY:
        hints = decode_hints(rows[-1][1])
        rows = rows[:-1]
    parts: dict[int, dict[int, list[tuple[int, int]]]] = {}
    orphans = leftovers = False
    for key, value in rows:
        txid, part = parse_txid_key(key)
        if txid <= head.compacted:
            leftovers = True
        elif txid > head.txid:
            orphans = True
        else:
            parts.setdefault(txid, {})[part] = decode_index(value)
    return Stored(head, PageIndex.build(head, parts), hints, orphans, leftovers)


def delete_txids(kv: ActorKv, fence: int, first: int, last: int) -> None:
    """Delete the chunks, then the index parts, of txids `first..last`.

    Chunks go first: a crash in between leaves index parts without chunks, which the next open
    sees and deletes again, never chunks that no index part points at.
    """
    for prefix, end in ((DELTA_PREFIX, DELTA_END), (INDEX_PREFIX, INDEX_END)):
        stop = end if last == MAX_TXID else txid_bound(prefix, last + 1)
        kv.delete_range(txid_bound(prefix, first), stop, fence=fence)
