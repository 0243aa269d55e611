"""In-process backend: a sorted map per namespace, optionally with simulated round-trip latency.

Used by tests and benchmarks, and as the model of "a remote KV" when `latency_ms` is set: every
data operation and takeover sleeps that long once, as one round trip would (`generation()` and
`used_bytes()` are treated as cached metadata and do not).
"""

from __future__ import annotations

import time

from librt.threading import Lock

from pagekv.kv.fence import check_fence
from pagekv.kv.limits import (
    KvLimits,
    WriteBatch,
    check_name,
    check_quota,
    entry_size,
    quota_delta,
)
from pagekv.kv.namespace import KvNamespace
from pagekv.kv.sorted_keys import SortedKeys


class _MemoryData:
    """One namespace's contents; survives `MemoryNamespace` objects so reopening sees it.

    Invariant: `keys` holds exactly the keys of `values`."""

    def __init__(self) -> None:
        self.keys = SortedKeys()
        self.values: dict[bytes, bytes] = {}
        self.generation = 0
        self.used = 0
        self.lock = Lock()


class MemoryNamespace(KvNamespace):
    def __init__(
        self, actor_id: str, data: _MemoryData, limits: KvLimits, latency_s: float
    ) -> None:
        super().__init__(actor_id, limits)
        self._d = data
        self._latency_s = latency_s

    def _round_trip(self) -> None:
        if self._latency_s:
            time.sleep(self._latency_s)

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        self._round_trip()
        with self._d.lock:
            return [self._d.values.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        self._round_trip()
        d = self._d
        with d.lock:
            ordered, lo, hi = d.keys.bounds(start, end)
            if reverse:
                stop = lo if limit is None else max(lo, hi - limit)
                keys = ordered[stop:hi][::-1]
            else:
                stop = hi if limit is None else min(hi, lo + limit)
                keys = ordered[lo:stop]
            return list(zip(keys, map(d.values.__getitem__, keys), strict=True))

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        self._round_trip()
        d = self._d
        with d.lock:
            check_fence(fence, d.generation)
            d.used = check_quota(self._limits, d.used, quota_delta(batch, d.values))
            for key in batch.deletes:
                if key in d.values:
                    del d.values[key]
                    d.keys.remove(key)
            values = d.values
            for key, value in batch.puts.items():
                before = len(values)
                values[key] = value
                if len(values) != before:  # a new key (told without a second lookup)
                    d.keys.add(key)

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        self._round_trip()
        d = self._d
        with d.lock:
            check_fence(fence, d.generation)
            if start >= end:
                return
            values = d.values
            for key in d.keys.remove_range(start, end):
                d.used -= entry_size(key, values[key])
                del values[key]  # not `pop`: compiled, `pop` is a generic method call

    def takeover(self) -> int:
        self._round_trip()
        with self._d.lock:
            self._d.generation += 1
            return self._d.generation

    def generation(self) -> int:
        with self._d.lock:
            return self._d.generation

    def used_bytes(self) -> int:
        with self._d.lock:
            return self._d.used

    def _drop(self, fence: int | None) -> None:
        self._round_trip()
        d = self._d
        with d.lock:
            check_fence(fence, d.generation)
            d.keys.clear()
            d.values.clear()
            d.used = 0


class MemoryStore:
    """Namespaces held in this process; `latency_ms` is slept once per round trip."""

    def __init__(self, *, limits: KvLimits | None = None, latency_ms: float = 0.0) -> None:
        self.limits = limits or KvLimits()
        self.latency_ms = latency_ms
        self.never_waits = latency_ms == 0
        """No operation sleeps or does I/O: callers may run them on an event loop
        (`KvStore`)."""
        self._data: dict[str, _MemoryData] = {}
        self._lock = Lock()

    def namespace(self, actor_id: object) -> MemoryNamespace:
        name = check_name(self.limits, actor_id)
        with self._lock:
            data = self._data.setdefault(name, _MemoryData())
        return MemoryNamespace(name, data, self.limits, self.latency_ms / 1000)

    def actor_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._data)

    def close(self) -> None:
        """Nothing to release; the data lives as long as the store object."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
