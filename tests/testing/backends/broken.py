"""`plain.py` with one realistic bug each: what `check_backend` must catch, and which part does.

Each variant changes one seam of `PlainKv` or `PlainStore`, the way such bugs ship: a bound
computed by hand, a check made outside the transaction, a cache, a log written later. Its
factory has `plain_store`'s signature, and `BROKEN` maps its name to the factory and the part
of the check expected to catch it (`contract`, `concurrent`, `restart` or `fuzz`).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pagekv.kv import (
    BatchTooLarge,
    Entries,
    KeyTooLarge,
    KvLimits,
    StorageQuotaExceeded,
    WriteBatch,
    check_fence,
    check_fence_arg,
    check_keys,
    check_write,
    entry_size,
    quota_delta,
)
from pagekv.kv.limits import INT64_MAX
from tests.testing.backends.plain import NamespaceState, PlainKv, PlainStore, Record

Factory = Callable[..., PlainStore]
_RACE: Final = 1e-4
"""The round trip a racy variant takes between its read and its write (a remote store's)."""

# --- contract: atomicity, order, ranges --------------------------------------------------------


class EntryByEntry(PlainKv):
    """Sends a batch as one write per entry: a rejected entry midway leaves the earlier applied."""

    def write(self, *, put: Entries = (), delete: Any = (), fence: object = None) -> None:
        pairs = put.items() if isinstance(put, dict) else put
        for key, value in pairs:
            super().write(put={key: value}, fence=fence)
        for key in delete:
            super().write(delete=[key], fence=fence)


class SignedOrder(PlainKv):
    """Orders keys by signed bytes (a C `char` comparison): 0x80-0xff sort before 0x00."""

    def _pos(self, key: bytes) -> int:
        return bisect.bisect_left(self._ns.keys, _signed(key), key=_signed)


def _signed(key: bytes) -> bytes:
    return bytes(b ^ 0x80 for b in key)


class RangeEndInclusive(PlainKv):
    """Ends a range after its end key (`bisect_right`): list and delete_range include `end`."""

    def _span(self, lo: bytes | None, hi: bytes | None) -> tuple[int, int]:
        i, j = super()._span(lo, hi)
        return i, j if hi is None else bisect.bisect_right(self._ns.keys, hi)


class ReverseLimitWrongEnd(PlainKv):
    """`list(reverse=True, limit=n)` takes the first n keys of the range, then reverses them."""

    def _select(self, i: int, j: int, n: int | None, backwards: bool) -> list[bytes]:
        chosen = self._ns.keys[i:j][:n]
        return chosen[::-1] if backwards else chosen


class PrefixOfAllFfEndsEarly(PlainKv):
    """Turns a prefix into a range itself, and ends an all-0xff prefix at the prefix plus 0xff
    where the range has no end."""

    def list(self, *, prefix: object = None, **bounds: Any) -> list[tuple[bytes, bytes]]:
        if not isinstance(prefix, bytes) or not prefix or {"start", "end"} & bounds.keys():
            return super().list(prefix=prefix, **bounds)
        stripped = prefix.rstrip(b"\xff")
        end = stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else prefix + b"\xff"
        return super().list(start=prefix, end=end, **bounds)


# --- contract: limits ------------------------------------------------------------------------


class ValuesTruncated(PlainKv):
    """Stores values in a 64 KiB column: longer ones (the limit says 128 KiB) come back cut."""

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        batch = super()._validate(put, delete)
        batch.puts = {k: v[: 64 * 1024] for k, v in batch.puts.items()}
        return batch


class KeyLimitOffByOne(PlainKv):
    """Refuses a key of exactly `max_key_bytes` (`>=` where `>` is meant)."""

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        batch = super()._validate(put, delete)
        for key in (*batch.puts, *batch.deletes):
            if len(key) >= self._limits.max_key_bytes:
                raise KeyTooLarge(f"key of {len(key)} bytes", len(key), self._limits.max_key_bytes)
        return batch


class BatchEntriesUnlimited(PlainKv):
    """Never refuses a batch for its number of entries (`max_batch_entries` not enforced)."""

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        unlimited = dataclasses.replace(self._limits, max_batch_entries=INT64_MAX)
        return check_write(unlimited, put, delete)


class BatchBytesWithoutDeletes(PlainKv):
    """Counts a batch's bytes as its puts' keys and values only, leaving out the delete keys."""

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        batch = check_write(
            dataclasses.replace(self._limits, max_batch_bytes=INT64_MAX), put, delete
        )
        size = sum(entry_size(k, v) for k, v in batch.puts.items())
        if size > self._limits.max_batch_bytes:
            raise BatchTooLarge(f"batch of {size} bytes", size, self._limits.max_batch_bytes)
        return batch


class GetKeysUnlimited(PlainKv):
    """Never refuses a `get` for its number of keys (`max_batch_entries` not applied to reads)."""

    def get(self, keys: Any) -> list[bytes | None]:
        checked = check_keys(dataclasses.replace(self._limits, max_batch_entries=INT64_MAX), keys)
        with self._lock:
            return [self._ns.values.get(k) for k in checked]


# --- contract: quota -------------------------------------------------------------------------


class OverwriteNotCredited(PlainKv):
    """Charges an overwrite its whole size, as if the key were new: the usage only grows."""

    def _charge(self, batch: WriteBatch) -> int:
        return quota_delta(batch, {}) - quota_delta(
            WriteBatch({}, batch.deletes, 0), self._ns.values
        )


class DeleteNotRefunded(PlainKv):
    """Never gives back the bytes of deleted keys (by delete or delete_range)."""

    def _charge(self, batch: WriteBatch) -> int:
        return quota_delta(WriteBatch(batch.puts, (), 0), self._ns.values)

    def _refund(self, key: bytes, value: bytes) -> int:
        return 0


class QuotaExactRefused(PlainKv):
    """Refuses a write that fills the quota exactly (`>=` where `>` is meant)."""

    def _charge(self, batch: WriteBatch) -> int:
        delta = super()._charge(batch)
        after = self._ns.used + delta
        if delta > 0 and after >= self._limits.max_storage_bytes:
            raise StorageQuotaExceeded("storage", after, self._limits.max_storage_bytes)
        return delta


# --- contract: fencing, takeover, drop -------------------------------------------------------


class RangeIgnoresFence(PlainKv):
    """`delete_range` drops its `fence`: a stale owner's range delete goes through."""

    def delete_range(self, start: object, end: object, *, fence: object = None) -> None:
        check_fence_arg(fence)
        super().delete_range(start, end)


class DropIgnoresFence(PlainKv):
    """`drop` drops its `fence`: a stale owner can drop the namespace."""

    def drop(self, *, fence: object = None) -> None:
        check_fence_arg(fence)
        super().drop()


class DropResetsGeneration(PlainKv):
    """`drop` deletes the namespace's row, generation included: the next takeover returns 1."""

    def apply(self, record: Record) -> None:
        super().apply(record)
        if record["op"] == "drop":
            self._ns.generation = 0


# --- concurrent ------------------------------------------------------------------------------


class FenceBySeparateRead(PlainKv):
    """Checks the fence in one round trip and writes in the next: a takeover between is missed."""

    def write(self, *, put: Entries = (), delete: Any = (), fence: object = None) -> None:
        batch = self._validate(put, delete)
        checked = check_fence_arg(fence)
        with self._lock:
            check_fence(checked, self._ns.generation)
        time.sleep(_RACE)
        super().write(put=batch.puts, delete=batch.deletes)


class TakeoverNotAtomic(PlainKv):
    """Takes over by reading the generation and writing it plus one, two round trips."""

    def takeover(self) -> int:
        current = self.generation()
        time.sleep(_RACE)
        with self._lock:
            self._commit({"op": "takeover", "gen": current + 1})
        return current + 1


class TornBatch(PlainKv):
    """Logs a batch whole but applies it key by key, letting go of the lock between keys (the
    first key is applied with the fence check): readers see half of it."""

    def _commit(self, record: Record) -> None:
        if record["op"] != "write":
            super()._commit(record)
            return
        self._store.log({"ns": self._name, **record})
        pieces = [WriteBatch({}, (key,), 0) for key in record["del"]]
        pieces += [WriteBatch({key: value}, (), 0) for key, value in record["put"]]
        for n, piece in enumerate(pieces):
            if n:
                self._lock.release()
                time.sleep(0)
                self._lock.acquire()
            used = self._ns.used + quota_delta(piece, self._ns.values)
            puts = [[k, v] for k, v in piece.puts.items()]
            self.apply({"op": "write", "put": puts, "del": piece.deletes, "used": used})


_CACHES: weakref.WeakKeyDictionary[NamespaceState, dict[bytes, bytes | None]] = (
    weakref.WeakKeyDictionary()
)


class DropKeepsCache(PlainKv):
    """Serves `get` from a read cache that every change invalidates except `drop`."""

    def get(self, keys: Any) -> list[bytes | None]:
        checked = check_keys(self._limits, keys)
        with self._lock:
            cache = _CACHES.setdefault(self._ns, {})
            for key in checked:
                if key not in cache:
                    cache[key] = self._ns.values.get(key)
            return [cache[k] for k in checked]

    def apply(self, record: Record) -> None:
        if record["op"] in ("write", "range"):
            _CACHES.pop(self._ns, None)
        super().apply(record)


# --- restart ---------------------------------------------------------------------------------


class GenerationNotLogged(PlainKv):
    """Keeps the generation in memory only: a reopened store starts again at generation 0."""

    def takeover(self) -> int:
        with self._lock:
            self.apply({"op": "takeover", "gen": self._ns.generation + 1})
            return self._ns.generation


class RangeNotLogged(PlainKv):
    """Applies `delete_range` without logging it: the deleted keys come back at reopen."""

    def _commit(self, record: Record) -> None:
        if record["op"] == "range":
            self.apply(record)
        else:
            super()._commit(record)


class WriteBehindStore(PlainStore):
    """Acknowledges a change at once and logs it from a thread every 50 ms: a kill loses up to
    50 ms of acknowledged changes (a clean close logs them all)."""

    def __init__(self, location: Path | str | None = None, limits: KvLimits | None = None) -> None:
        super().__init__(location, limits)
        self._pending: list[Record] = []
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_every, args=(0.05,), daemon=True)
        self._flusher.start()

    def log(self, record: Record) -> None:
        self._pending.append(record)

    def _flush_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._flush()

    def _flush(self) -> None:
        with self.lock:
            pending, self._pending = self._pending, []
            for record in pending:
                super().log(record)

    def close(self) -> None:
        self._stop.set()
        self._flusher.join()
        self._flush()
        super().close()


# --- fuzz ------------------------------------------------------------------------------------


class ValuesLoseTrailingZeros(PlainKv):
    """Stores values as NUL-terminated strings: trailing zero bytes (a page's free space) vanish."""

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        batch = super()._validate(put, delete)
        batch.puts = {k: v.rstrip(b"\x00") for k, v in batch.puts.items()}
        return batch


class ListCappedAt100(PlainKv):
    """Returns at most 100 entries from a `list` without a limit (a server's page size)."""

    def _select(self, i: int, j: int, n: int | None, backwards: bool) -> list[bytes]:
        return super()._select(i, j, 100 if n is None else n, backwards)


class ListCappedAt1000(PlainKv):
    """Returns at most 1,000 entries from any `list` (a page of S3's size, the continuation
    dropped)."""

    def _select(self, i: int, j: int, n: int | None, backwards: bool) -> list[bytes]:
        return super()._select(i, j, 1000 if n is None else min(n, 1000), backwards)


# --- factories -------------------------------------------------------------------------------


def _factory(
    name: str, kv: type[PlainKv] = PlainKv, store: type[PlainStore] = PlainStore
) -> Factory:
    """A factory with `plain_store`'s signature for a store of `kv` namespaces, named `name`."""
    cls = type(f"{kv.__name__}Store", (store,), {"kv_class": kv}) if kv is not PlainKv else store

    def factory(location: Path, limits: KvLimits | None = None) -> PlainStore:
        return cls(location, limits)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = (kv if kv is not PlainKv else store).__doc__
    return factory


entry_by_entry = _factory("entry_by_entry", EntryByEntry)
signed_order = _factory("signed_order", SignedOrder)
range_end_inclusive = _factory("range_end_inclusive", RangeEndInclusive)
reverse_limit_wrong_end = _factory("reverse_limit_wrong_end", ReverseLimitWrongEnd)
prefix_of_all_ff_ends_early = _factory("prefix_of_all_ff_ends_early", PrefixOfAllFfEndsEarly)
values_truncated = _factory("values_truncated", ValuesTruncated)
key_limit_off_by_one = _factory("key_limit_off_by_one", KeyLimitOffByOne)
batch_entries_unlimited = _factory("batch_entries_unlimited", BatchEntriesUnlimited)
batch_bytes_without_deletes = _factory("batch_bytes_without_deletes", BatchBytesWithoutDeletes)
get_keys_unlimited = _factory("get_keys_unlimited", GetKeysUnlimited)
overwrite_not_credited = _factory("overwrite_not_credited", OverwriteNotCredited)
delete_not_refunded = _factory("delete_not_refunded", DeleteNotRefunded)
quota_exact_refused = _factory("quota_exact_refused", QuotaExactRefused)
range_ignores_fence = _factory("range_ignores_fence", RangeIgnoresFence)
drop_ignores_fence = _factory("drop_ignores_fence", DropIgnoresFence)
drop_resets_generation = _factory("drop_resets_generation", DropResetsGeneration)
fence_by_separate_read = _factory("fence_by_separate_read", FenceBySeparateRead)
takeover_not_atomic = _factory("takeover_not_atomic", TakeoverNotAtomic)
torn_batch = _factory("torn_batch", TornBatch)
drop_keeps_cache = _factory("drop_keeps_cache", DropKeepsCache)
generation_not_logged = _factory("generation_not_logged", GenerationNotLogged)
range_not_logged = _factory("range_not_logged", RangeNotLogged)
write_behind = _factory("write_behind", store=WriteBehindStore)
values_lose_trailing_zeros = _factory("values_lose_trailing_zeros", ValuesLoseTrailingZeros)
list_capped_at_100 = _factory("list_capped_at_100", ListCappedAt100)
list_capped_at_1000 = _factory("list_capped_at_1000", ListCappedAt1000)

BROKEN: Final[dict[str, tuple[Factory, str]]] = {
    "entry_by_entry": (entry_by_entry, "contract"),
    "signed_order": (signed_order, "contract"),
    "range_end_inclusive": (range_end_inclusive, "contract"),
    "reverse_limit_wrong_end": (reverse_limit_wrong_end, "contract"),
    "prefix_of_all_ff_ends_early": (prefix_of_all_ff_ends_early, "contract"),
    "values_truncated": (values_truncated, "contract"),
    "key_limit_off_by_one": (key_limit_off_by_one, "contract"),
    "batch_entries_unlimited": (batch_entries_unlimited, "contract"),
    "batch_bytes_without_deletes": (batch_bytes_without_deletes, "contract"),
    "get_keys_unlimited": (get_keys_unlimited, "contract"),
    "overwrite_not_credited": (overwrite_not_credited, "contract"),
    "delete_not_refunded": (delete_not_refunded, "contract"),
    "quota_exact_refused": (quota_exact_refused, "contract"),
    "range_ignores_fence": (range_ignores_fence, "contract"),
    "drop_ignores_fence": (drop_ignores_fence, "contract"),
    "drop_resets_generation": (drop_resets_generation, "contract"),
    "fence_by_separate_read": (fence_by_separate_read, "concurrent"),
    "takeover_not_atomic": (takeover_not_atomic, "concurrent"),
    "torn_batch": (torn_batch, "concurrent"),
    "drop_keeps_cache": (drop_keeps_cache, "concurrent"),
    "generation_not_logged": (generation_not_logged, "restart"),
    "range_not_logged": (range_not_logged, "restart"),
    "write_behind": (write_behind, "restart"),
    "values_lose_trailing_zeros": (values_lose_trailing_zeros, "fuzz"),
    "list_capped_at_100": (list_capped_at_100, "fuzz"),
    "list_capped_at_1000": (list_capped_at_1000, "contract"),
}
"""Every broken backend: its factory and the part of the check that must catch it."""
