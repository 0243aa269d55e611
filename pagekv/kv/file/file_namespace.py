"""One namespace of the `file:` store: reads merge its pending state over the base, writes check
the fence and the quota against the pending state and append one record."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any, Final

from pagekv.kv.fence import check_fence
from pagekv.kv.file.base import SIZE, Base
from pagekv.kv.file.log_records import encode_range, encode_takeover, encode_write
from pagekv.kv.file.pending import Pending
from pagekv.kv.file.sections import Sections
from pagekv.kv.limits import KvLimits, WriteBatch, check_quota
from pagekv.kv.namespace import KvNamespace

MAX_GAPS: Final = 16
"""Reads that would query more gaps between hidden ranges than this read the span at once."""


class FileNamespace(KvNamespace):
    """A namespace of a `FileStore`, by its row id. Every method runs in one section of the
    store (`Sections`), which guards the state it reads; the namespace holds none of its own."""

    def __init__(
        self, actor_id: str, limits: KvLimits, sections: Sections, base: Base, ns_id: int
    ) -> None:
        super().__init__(actor_id, limits)
        self._sections = sections
        self._base = base
        self._id = ns_id

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        sections, base, ns = self._sections, self._base, self._id
        with sections.shared:
            pending = sections.seen(ns)
            if pending is None:
                found = base.values(ns, keys, "value")
            else:
                found = {k: pending.entries[k] for k in keys if k in pending.entries}
                missing = [k for k in keys if not pending.shadows(k)]
                if missing:
                    found.update(base.values(ns, missing, "value"))
            return [found.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        sections, base, ns = self._sections, self._base, self._id
        with sections.shared:
            pending = sections.seen(ns)
            if pending is None:
                return list(base.range(ns, "value", start, end, reverse, limit))
            rows = _visible_base(base, ns, pending, "value", start, end, reverse)
            merged = heapq.merge(
                _unshadowed(rows, pending),
                _pending_items(pending, start, end, reverse),
                reverse=reverse,
            )
            return list(itertools.islice(merged, limit))

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        sections, ns = self._sections, self._id
        with sections.exclusive:
            pending = sections.for_write(ns)
            check_fence(fence, pending.generation)
            if not batch.puts and not batch.deletes:
                return
            puts, deletes = batch.puts, batch.deletes
            limits = self.limits
            limit = limits.max_storage_bytes
            # The batch's bytes bound its growth, so the exact check is rarely needed.
            if pending.used + batch.payload > limit:
                growth, unknown = pending.growth(batch)
                if growth > 0 and pending.used + growth > limit:
                    self._base.resolve(ns, pending)
                    owed = self._base.values(ns, unknown, SIZE)
                    check_quota(limits, pending.used, growth - sum(owed.values()))
            sections.append(
                ns, encode_write(ns, puts, deletes), lambda p: p.write(puts.items(), deletes)
            )

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        sections, ns = self._sections, self._id
        with sections.exclusive:
            pending = sections.for_write(ns)
            check_fence(fence, pending.generation)
            if start >= end:
                return
            entries = pending.entries
            sizes = [
                len(k) + len(v)
                for k in pending.keys_in(start, end)
                if (v := entries[k]) is not None
            ]
            rows = _visible_base(self._base, ns, pending, SIZE, start, end, reverse=False)
            sizes += [size for key, size in rows if key not in pending.entries]
            if sizes:
                refund = sum(sizes)
                body = encode_range(ns, start, end, refund)
                sections.append(ns, body, lambda p: p.delete_range(start, end, refund))

    def takeover(self) -> int:
        sections, ns = self._sections, self._id
        with sections.exclusive:
            pending = sections.for_write(ns)
            generation = pending.generation + 1
            sections.append(ns, encode_takeover(ns, generation), lambda p: p.take_over(generation))
            return generation

    def generation(self) -> int:
        sections = self._sections
        with sections.shared:
            pending = sections.seen(self._id)
            if pending is None:
                return self._base.head(self._id)[0]
            return pending.generation

    def used_bytes(self) -> int:
        sections = self._sections
        with sections.shared:
            pending = sections.seen(self._id)
            if pending is None:
                return self._base.head(self._id)[1]
            self._base.resolve(self._id, pending)
            return pending.used

    def _drop(self, fence: int | None) -> None:
        sections, ns = self._sections, self._id
        with sections.exclusive:
            pending = sections.for_write(ns)
            check_fence(fence, pending.generation)
            self._base.resolve(ns, pending)
            if pending.used:
                used = pending.used
                body = encode_range(ns, b"", None, used)
                sections.append(ns, body, lambda p: p.delete_range(b"", None, used))


def _pending_items(
    pending: Pending, start: bytes | None, end: bytes | None, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    """The pending namespace's live entries in `[start, end)`, in key order."""
    keys = pending.keys_in(start, end)
    for key in reversed(keys) if reverse else keys:
        value = pending.entries[key]
        if value is not None:
            yield key, value


def _unshadowed(rows: Iterator[tuple[bytes, Any]], pending: Pending) -> Iterator[tuple[bytes, Any]]:
    """The base `rows` whose keys the pending state does not hold, read lazily.

    A generator function, not a generator expression: mypyc compiles a generator expression
    as a list comprehension, which would read the whole rest of the range for `list(limit=1)`.
    """
    entries = pending.entries
    for row in rows:
        if row[0] not in entries:
            yield row


def _visible_base(
    base: Base,
    ns: int,
    pending: Pending,
    column: str,
    start: bytes | None,
    end: bytes | None,
    reverse: bool,
) -> Iterator[tuple[bytes, Any]]:
    """The base's rows in `[start, end)` outside the pending state's hidden ranges, in key order.

    Reads only between the hidden ranges, so a range delete or drop of many keys costs nothing
    to later reads of the same epoch. Past `MAX_GAPS` gaps (many small range deletes, such as
    one per actor in the registry's index) one query per gap costs more than reading the hidden
    rows too, so the span is read at once and the hidden rows are skipped.
    """
    hidden = pending.hidden
    gaps = hidden.gaps(start, end)
    if len(gaps) > MAX_GAPS:
        for row in base.range(ns, column, start, end, reverse):
            if row[0] not in hidden:
                yield row
        return
    for low, high in reversed(gaps) if reverse else gaps:
        if low is None or high is None or low < high:
            yield from base.range(ns, column, low, high, reverse)
