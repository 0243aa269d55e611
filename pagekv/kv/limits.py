"""The KV limits and the one place where requests are checked against them.

Every backend calls these checks before it sends or writes anything, so a request that breaks a
limit, or passes an argument outside the contract, is rejected whole on every backend alike. The
quota check needs the stored sizes of the keys a write replaces, which only the backend knows
inside its transaction; it therefore passes them to `check_quota`, which is still the single rule.

Per-request limits count the request as given: a key that appears twice in one `get` or one
write's puts or deletes counts twice, in entries and in bytes, though it is read, stored or
deleted once (the last put of a key wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeGuard

from typing_extensions import TypeIs

from pagekv.kv.errors import (
    BatchTooLarge,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    NameTooLarge,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
)

Entries = Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]

INT64_MAX: Final = 2**63 - 1
"""The largest integer every backend stores and takes as a parameter (a PostgreSQL `bigint`, an
SQLite integer, `itertools.islice`'s stop): the bound of generations, fences and list limits.
Checked as `n >> 63 == 0` (for `0 <= n <= INT64_MAX`): compiled, a shift of a small int is one
instruction, while a comparison with this constant, too large for mypyc's tagged ints, is a
generic call (~15 ns on every fenced write)."""


@dataclass(frozen=True, slots=True)
class KvLimits:
    """Per-actor limits; the defaults are the documented ones."""

    max_key_bytes: int = 2048
    max_value_bytes: int = 128 * 1024
    max_batch_entries: int = 128
    """Puts plus deletes of one write, and keys of one `get`, each repeat counted."""
    max_batch_bytes: int = 976 * 1024
    """Keys and values of one write's puts plus the keys of its deletes, each repeat counted."""
    max_storage_bytes: int = 10 * 2**30
    max_name_bytes: int = 2048
    """A namespace name's UTF-8 bytes: room for every actor id whose registry entries fit the
    default key size, and within what PostgreSQL can index."""


@dataclass(slots=True, init=False)
class WriteBatch:
    """A validated write: puts (the last put of a key wins) and deletes of other keys, each key
    once (the backends' quota arithmetic relies on that). `puts` may be the caller's own dict:
    a backend reads it during the write and keeps no reference to it.

    One is made per write, so `__init__` is written out: mypyc compiles a written `__init__`,
    but a dataclass's generated one runs interpreted, about 6x slower (250 vs 40 ns).
    """

    puts: dict[bytes, bytes]
    deletes: tuple[bytes, ...]
    payload: int
    """Bytes of the request's keys and values (delete keys and repeats included): what
    `max_batch_bytes` caps, and an upper bound of how much the write can add to the usage."""

    def __init__(self, puts: dict[bytes, bytes], deletes: tuple[bytes, ...], payload: int) -> None:
        self.puts = puts
        self.deletes = deletes
        self.payload = payload


def is_mapping(entries: Entries) -> TypeIs[Mapping[bytes, bytes]]:
    """Whether `entries` is a mapping rather than pairs; a `dict` (what every caller in pagekv
    passes) is told without the `Mapping` ABC's check, which cost more than the rest of a test."""
    return type(entries) is dict or isinstance(entries, Mapping)


def entry_size(key: bytes, value: bytes) -> int:
    """Bytes an entry is charged against the storage quota."""
    return len(key) + len(value)


_BYTES_LIKE: Final = (bytes, bytearray, memoryview)
"""A tuple, not `bytes | bytearray | memoryview`: compiled, `isinstance` with a union builds the
union at every call. With that and no `bytes` fast path, `check_key` took 640 ns; now 32 ns for
`bytes` and 180 ns for the other two."""


def check_key(limits: KvLimits, key: object, what: str = "key") -> bytes:
    if type(key) is not bytes:
        if not isinstance(key, _BYTES_LIKE):
            raise InvalidKey(f"{what} must be bytes, not {type(key).__name__}")
        key = bytes(key)
    if not key:
        raise InvalidKey(f"{what} must not be empty")
    if len(key) > limits.max_key_bytes:
        raise KeyTooLarge(f"{what} of {len(key)} bytes", len(key), limits.max_key_bytes)
    return key


def check_keys(limits: KvLimits, keys: Iterable[object]) -> list[bytes]:
    """Validate the keys of a `get`: each key and their number."""
    checked = [check_key(limits, k) for k in keys]
    if len(checked) > limits.max_batch_entries:
        raise TooManyEntries(
            f"request of {len(checked)} keys", len(checked), limits.max_batch_entries
        )
    return checked


def check_bound(limits: KvLimits, key: object, what: str) -> bytes | None:
    """Validate an optional range bound or prefix."""
    return None if key is None else check_key(limits, key, what)


def check_limit(limit: object) -> int | None:
    """Validate `list`'s `limit`: None or a positive int (not a bool: `True` is no count).

    A limit past `INT64_MAX` is returned as None, i.e. all: no namespace holds that many
    entries, and no backend takes so large a number (PostgreSQL refused it as out of range).
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument(f"limit must be a positive int or None, got {limit!r}")
    return None if limit >> 63 else limit


def check_reverse(reverse: object) -> bool:
    """Validate `list`'s `reverse`: only a bool, so no backend has to guess what else means."""
    if not isinstance(reverse, bool):
        raise InvalidArgument(f"reverse must be True or False, got {reverse!r}")
    return reverse


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no upper bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def check_list(
    limits: KvLimits, prefix: object, start: object, end: object, limit: object, reverse: object
) -> tuple[bytes | None, bytes | None, int | None, bool] | None:
    """Validate `list`'s arguments: the half-open range `[lo, hi)` to list (None: unbounded on
    that side), the limit and the direction; None when the range is empty, so nothing is read."""
    checked_prefix = check_bound(limits, prefix, "prefix")
    lo = check_bound(limits, start, "start key")
    hi = check_bound(limits, end, "end key")
    checked_limit = check_limit(limit)
    checked_reverse = check_reverse(reverse)
    if checked_prefix is not None:
        if lo is not None or hi is not None:
            raise InvalidArgument("pass either prefix or start/end, not both")
        lo, hi = checked_prefix, prefix_end(checked_prefix)
    if lo is not None and hi is not None and lo >= hi:
        return None
    return lo, hi, checked_limit, checked_reverse


def check_fence_arg(fence: object) -> int | None:
    """Validate a write's `fence`: None (unfenced) or a generation, an int from 0 to
    `INT64_MAX`. Anything else was never a generation; PostgreSQL could not even take it as a
    parameter, so it is refused here instead of as a `FenceMismatch` on some backends only."""
    if fence is None:
        return None
    if isinstance(fence, bool) or not isinstance(fence, int) or fence >> 63:
        raise InvalidArgument(f"fence must be None or an int from 0 to {INT64_MAX}, got {fence!r}")
    return fence


def check_name(limits: KvLimits, name: object) -> str:
    """Validate a namespace name: a non-empty str, without NUL (PostgreSQL's text cannot hold
    it), encodable as UTF-8 (no lone surrogates: the file and PostgreSQL stores keep UTF-8),
    of at most `max_name_bytes` bytes in that form."""
    if not isinstance(name, str):
        raise InvalidArgument(f"namespace name must be str, not {type(name).__name__}")
    if not name:
        raise InvalidArgument("namespace name must not be empty")
    if "\x00" in name:
        raise InvalidArgument(f"namespace name {name[:32]!r} contains NUL")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"namespace name {name[:32]!r} has no UTF-8 form") from None
    if size > limits.max_name_bytes:
        raise NameTooLarge(f"namespace name of {size} bytes", size, limits.max_name_bytes)
    return name


def _check_value(key: bytes, value: object) -> bytes:
    if not isinstance(value, _BYTES_LIKE):
        raise InvalidKey(f"value of key {key[:32]!r} must be bytes, not {type(value).__name__}")
    return bytes(value)


def _is_plain_key(key: object, limits: KvLimits) -> TypeGuard[bytes]:
    """A key that needs no conversion and breaks no limit (the common case, told cheaply)."""
    return type(key) is bytes and 0 < len(key) <= limits.max_key_bytes


def _check_put(
    limits: KvLimits, puts: dict[bytes, bytes], raw_key: object, raw_value: object
) -> int:
    """Check one put and add it to `puts`; return its keys' and values' bytes."""
    key = raw_key if _is_plain_key(raw_key, limits) else check_key(limits, raw_key)
    value = raw_value if type(raw_value) is bytes else _check_value(key, raw_value)
    if len(value) > limits.max_value_bytes:
        raise ValueTooLarge(
            f"value of {len(value)} bytes for key {key[:32]!r}", len(value), limits.max_value_bytes
        )
    puts[key] = value
    return len(key) + len(value)


def _plain_size(limits: KvLimits, put: dict[object, object]) -> int:
    """Bytes of the keys and values of `put` if each is `bytes` within its limit, else -1 (the
    checked path then converts or rejects)."""
    size = 0
    for key, value in put.items():
        if not (
            _is_plain_key(key, limits)
            and type(value) is bytes
            and len(value) <= limits.max_value_bytes
        ):
            return -1
        size += len(key) + len(value)
    return size


def check_write(limits: KvLimits, put: Entries, delete: Sequence[object]) -> WriteBatch:
    """Validate one write batch against every per-batch limit, counting repeats as given.

    On every write of every backend, so the common case, a `dict` of bytes keys and values
    within limits, is checked in one pass and becomes the batch's `puts` as it is: copying it
    was a fifth of the KV layer's time in a one-row commit. Anything else takes the checked
    path. Keys and values are typed `object` here: this is where a caller's wrong types become
    `InvalidKey`.
    """
    puts: dict[bytes, bytes]
    if type(put) is dict and (payload := _plain_size(limits, put)) >= 0:
        puts, n_entries = put, len(put)
    else:
        puts, n_entries, payload = {}, 0, 0
        pairs: Iterable[tuple[object, object]] = put.items() if is_mapping(put) else put
        for raw_key, raw_value in pairs:
            payload += _check_put(limits, puts, raw_key, raw_value)
            n_entries += 1
    deletes: tuple[bytes, ...] = ()
    if delete:
        checked = [check_key(limits, k) for k in delete]
        deletes = tuple(dict.fromkeys(checked))
        both = puts.keys() & set(deletes)
        if both:
            raise InvalidKey(f"key {min(both)[:32]!r} is both put and deleted in one batch")
        n_entries += len(checked)
        payload += sum(map(len, checked))
    if n_entries > limits.max_batch_entries:
        raise TooManyEntries(f"batch of {n_entries} entries", n_entries, limits.max_batch_entries)
    if payload > limits.max_batch_bytes:
        raise BatchTooLarge(f"batch of {payload} bytes", payload, limits.max_batch_bytes)
    return WriteBatch(puts, deletes, payload)


def check_quota(limits: KvLimits, used: int, delta: int) -> int:
    """Return the namespace's usage after a write that changes it by `delta` bytes."""
    after = used + delta
    if delta > 0 and after > limits.max_storage_bytes:
        raise StorageQuotaExceeded(
            f"storage after write of {after} bytes", after, limits.max_storage_bytes
        )
    return after


def quota_delta(batch: WriteBatch, stored: dict[bytes, bytes]) -> int:
    """Exact change in stored bytes: overwrites are charged their difference, deletes refunded.

    `stored` maps keys to their stored values; it must hold every key of the batch that exists
    (a backend can pass its whole map, since only the batch's keys are looked up). A `dict`, not
    a `Mapping`: compiled, its lookups are then direct calls (1.8k -> 1.2k instructions a commit).
    """
    delta = 0
    for key, value in batch.puts.items():
        old = stored.get(key)
        delta += len(value) - len(old) if old is not None else len(key) + len(value)
    for key in batch.deletes:
        old = stored.get(key)
        if old is not None:
            delta -= len(key) + len(old)
    return delta
