"""One namespace's changes in the log's live epoch, kept in memory over the base.

A process computes them by replaying the epoch's records (`catch_up.py`) and by applying its own
writes (`append.py`); reads merge them over the base (`file_namespace.py`), and a fold writes them
into it (`Base.fold`). Nothing here does I/O or locking: the store's section guards all of it."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import assert_never

from pagekv.kv.file.log_records import Create, Range, Record, Takeover, Write
from pagekv.kv.limits import WriteBatch
from pagekv.kv.sorted_keys import SortedKeys


class Ranges:
    """Disjoint, sorted half-open key ranges (`None` end: unbounded); membership by bisection.

    Invariant: `_starts` is sorted and no two ranges overlap or touch (`add` merges them).
    Guarded by the store's section, as the `Pending` that holds it."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[bytes] = []
        self._ends: list[bytes | None] = []

    def __iter__(self) -> Iterator[tuple[bytes, bytes | None]]:
        return zip(self._starts, self._ends, strict=True)

    def __contains__(self, key: bytes) -> bool:
        i = bisect.bisect_right(self._starts, key) - 1
        if i < 0:
            return False
        end = self._ends[i]
        return end is None or key < end

    def gaps(
        self, start: bytes | None, end: bytes | None
    ) -> list[tuple[bytes | None, bytes | None]]:
        """The parts of `[start, end)` (None: unbounded) that no range covers, in key order."""
        out: list[tuple[bytes | None, bytes | None]] = []
        low = start
        for r_start, r_end in self:
            if end is not None and r_start >= end:
                break
            if low is not None and r_end is not None and r_end <= low:
                continue
            if low is None or r_start > low:
                out.append((low, r_start))
            if r_end is None:
                return out
            low = r_end if low is None else max(low, r_end)
        if end is None or low is None or low < end:
            out.append((low, end))
        return out

    def add(self, start: bytes, end: bytes | None) -> None:
        lo = bisect.bisect_left(self._starts, start)
        if lo > 0:
            previous_end = self._ends[lo - 1]
            if previous_end is None or previous_end >= start:  # overlaps or touches: merge
                lo -= 1
                start = self._starts[lo]
        hi = lo
        while hi < len(self._starts) and (end is None or self._starts[hi] <= end):
            other = self._ends[hi]
            end = None if end is None or other is None else max(end, other)
            hi += 1
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]


@dataclass(slots=True)
class Pending:
    """One namespace's changes in the current epoch, over the base.

    `entries` maps a key to its value, or None if deleted; `hidden` holds ranges that hide every
    base key in them (a key in `entries` is never hidden: it was written after the range).

    Usage is kept lazily, so a write never has to look up a key in the base: `used` is the exact
    usage plus the base sizes of the keys in `unresolved`, keys first changed this epoch whose
    old size is still owed. It is therefore an upper bound; `Base.resolve` makes it exact.

    Every field is guarded by the store's section (its thread lock and the log's `flock`).
    """

    generation: int
    used: int
    created: str | None = None
    """The name, if the namespace was created in this epoch (it has no row in the base yet)."""
    last: int = 0
    """The log position of the namespace's latest record in this epoch: whoever sees the
    state must wait until that position is durable."""
    entries: dict[bytes, bytes | None] = field(default_factory=dict)
    hidden: Ranges = field(default_factory=Ranges)
    unresolved: list[bytes] = field(default_factory=list)
    _keys: SortedKeys = field(default_factory=SortedKeys)
    """The keys of `entries`, for ranges."""

    def shadows(self, key: bytes) -> bool:
        """Whether the base's row for `key` is not what readers see."""
        return key in self.entries or key in self.hidden

    def old_size(self, key: bytes) -> int | None:
        """The charged size `key` has now; None if that is its base size, not yet looked up."""
        if key in self.entries:
            value = self.entries[key]
            return 0 if value is None else len(key) + len(value)
        return 0 if key in self.hidden else None

    def growth(self, batch: WriteBatch) -> tuple[int, list[bytes]]:
        """An upper bound of the batch's usage change, and the keys whose old size it omits."""
        delta, unknown = 0, []
        for key, value in batch.puts.items():
            old = self.old_size(key)
            delta += len(key) + len(value) - (old or 0)
            if old is None:
                unknown.append(key)
        for key in batch.deletes:
            old = self.old_size(key)
            delta -= old or 0
            if old is None:
                unknown.append(key)
        return delta, unknown

    def keys_in(self, start: bytes | None, end: bytes | None) -> list[bytes]:
        """The keys of `entries` in `[start, end)` (None: unbounded), in order."""
        keys, lo, hi = self._keys.bounds(start, end)
        return keys[lo:hi]

    def write(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        for key in deletes:
            self._set(key, None)
        for key, value in puts:
            self._set(key, value)

    def _set(self, key: bytes, value: bytes | None) -> None:
        """Record `key`'s new value (None: deleted) and keep `used` an upper bound."""
        entries = self.entries
        if key in entries:
            old = entries[key]
            if old is not None:
                self.used -= len(key) + len(old)
        else:
            self._keys.add(key)
            if key not in self.hidden:
                self.unresolved.append(key)
        if value is not None:
            self.used += len(key) + len(value)
        entries[key] = value

    def delete_range(self, start: bytes, end: bytes | None, refund: int) -> None:
        for key in self._keys.remove_range(start, end):
            del self.entries[key]
        self.hidden.add(start, end)
        self.used -= refund

    def take_over(self, generation: int) -> None:
        self.generation = generation

    def apply(self, record: Record) -> None:
        """Replay a decoded record: the same change its writer made."""
        match record:
            case Write():
                self.write(record.puts, record.deletes)
            case Range():
                self.delete_range(record.start, record.end, record.refund)
            case Takeover():
                self.take_over(record.generation)
            case Create():
                pass  # its state is the new `Pending` itself (`Epoch.add_created`)
            case unreachable:
                assert_never(unreachable)
