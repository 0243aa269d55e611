"""Keys kept in order for range reads and range deletes, cheap to add to one at a time.

Both stores keep their keys in a dict for point lookups and need them in order only for ranges,
which come far less often than writes (the VFS lists at open and deletes a range per compaction;
the file store's epoch is asked for ranges by reads that cross it).
"""

from __future__ import annotations

import bisect
from typing import Final

_INSERT_MAX: Final = 32
"""Up to this many new keys are inserted one by one into the sorted keys; more by one sort."""


class SortedKeys:
    """A set of keys in order, kept by its owner in step with the owner's map.

    Invariant: the owner adds only keys not present and removes only keys present. Adding
    appends to a side list, so a write costs no move of the keys after it; the first ordered
    access merges the new keys in: a few by bisection, more by one sort (which merges two sorted
    runs), so a range never costs a pass over every key. A range removal only splits the new
    keys, without ordering them.
    """

    __slots__ = ("_fresh", "_sorted")

    def __init__(self) -> None:
        self._sorted: list[bytes] = []
        self._fresh: list[bytes] = []

    def add(self, key: bytes) -> None:
        self._fresh.append(key)

    def bounds(self, start: bytes | None, end: bytes | None) -> tuple[list[bytes], int, int]:
        """All keys in order, and where `[start, end)` (None: unbounded) lies in them.

        The list is the set's own: slice it, never change or keep it."""
        keys, fresh = self._sorted, self._fresh
        if fresh:
            if len(fresh) <= _INSERT_MAX:
                for key in fresh:
                    bisect.insort(keys, key)
            else:
                keys += fresh
                keys.sort()
            fresh.clear()
        lo = 0 if start is None else bisect.bisect_left(keys, start)
        hi = len(keys) if end is None else bisect.bisect_left(keys, end)
        return keys, lo, hi

    def remove(self, key: bytes) -> None:
        keys, lo, _ = self.bounds(key, None)
        del keys[lo]

    def remove_range(self, start: bytes | None, end: bytes | None) -> list[bytes]:
        """Remove the keys in `[start, end)`; return them, in no particular order.

        New keys are not merged in first, only split by the range: a compaction's range deletes
        remove what the commits since the last one added, so sorting them would be wasted."""
        kept: list[bytes] = []
        gone: list[bytes] = []
        for key in self._fresh:
            if (start is None or start <= key) and (end is None or key < end):
                gone.append(key)
            else:
                kept.append(key)
        self._fresh = kept
        keys = self._sorted
        lo = 0 if start is None else bisect.bisect_left(keys, start)
        hi = len(keys) if end is None else bisect.bisect_left(keys, end)
        gone += keys[lo:hi]
        del keys[lo:hi]
        return gone

    def clear(self) -> None:
        self._sorted.clear()
        self._fresh.clear()
