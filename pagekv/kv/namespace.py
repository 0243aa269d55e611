"""The shared front half of every backend: `KvNamespace` validates, the backend applies.

`KvNamespace` checks every request against `KvLimits` (see `limits.py`) and hands the backend
only requests that are already known to be within bounds. Compiled with the backends, so a write
reaches a backend's `_write` without an interpreted call in between.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterable, Sequence

from mypy_extensions import mypyc_attr

from pagekv.kv.limits import (
    Entries,
    KvLimits,
    WriteBatch,
    check_fence_arg,
    check_key,
    check_keys,
    check_list,
    check_write,
)


@mypyc_attr(allow_interpreted_subclasses=True)
class Shorthands:
    """`put` and `delete` as spelled-out forms of `write`, shared by backends and wrappers."""

    def write(
        self, *, put: Entries = (), delete: Sequence[bytes] = (), fence: object = None
    ) -> None:
        raise NotImplementedError

    def put(self, entries: Entries, *, fence: object = None) -> None:
        self.write(put=entries, fence=fence)

    def delete(self, keys: Sequence[bytes], *, fence: object = None) -> None:
        self.write(delete=keys, fence=fence)


@mypyc_attr(allow_interpreted_subclasses=True)
class KvNamespace(Shorthands, abc.ABC):
    """Validating front of a backend namespace; subclasses implement the `_`-methods atomically.

    Invariant: a `_`-method is only called with a request that passed every `KvLimits` check except
    the quota, which the backend checks with `limits.check_quota` inside its own transaction.

    Keys, bounds and options are typed `object` here: compiled code checks its parameters' types
    on entry, and this is where a wrong type must become `InvalidKey` or `InvalidArgument`, not a
    `TypeError` (and the same on every backend, compiled or not).
    """

    def __init__(self, actor_id: str, limits: KvLimits) -> None:
        self.actor_id = actor_id
        self._limits = limits

    @property
    def limits(self) -> KvLimits:
        return self._limits

    def get(self, keys: Iterable[bytes]) -> list[bytes | None]:
        return self._get(check_keys(self._limits, keys))

    def list(
        self,
        *,
        prefix: object = None,
        start: object = None,
        end: object = None,
        limit: object = None,
        reverse: object = False,
    ) -> list[tuple[bytes, bytes]]:
        checked = check_list(self._limits, prefix, start, end, limit, reverse)
        if checked is None:
            return []
        lo, hi, checked_limit, checked_reverse = checked
        return self._list(lo, hi, checked_limit, checked_reverse)

    def write(
        self, *, put: Entries = (), delete: Sequence[object] = (), fence: object = None
    ) -> None:
        self.write_batch(check_write(self._limits, put, delete), fence)

    def write_batch(self, batch: WriteBatch, fence: object = None) -> None:
        """`write` of a batch that `check_write` made against these limits: for a wrapper that
        validates a write itself (`CountingKv` sizes it from the batch), so it is done once."""
        checked_fence = check_fence_arg(fence)
        if batch.puts or batch.deletes or checked_fence is not None:
            self._write(batch, checked_fence)

    def delete_range(self, start: object, end: object, *, fence: object = None) -> None:
        lo = check_key(self._limits, start, "start key")
        hi = check_key(self._limits, end, "end key")
        self._delete_range(lo, hi, check_fence_arg(fence))

    def drop(self, *, fence: object = None) -> None:
        self._drop(check_fence_arg(fence))

    @abc.abstractmethod
    def _get(self, keys: builtins.list[bytes]) -> builtins.list[bytes | None]: ...

    @abc.abstractmethod
    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> builtins.list[tuple[bytes, bytes]]: ...

    @abc.abstractmethod
    def _write(self, batch: WriteBatch, fence: int | None) -> None: ...

    @abc.abstractmethod
    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None: ...

    @abc.abstractmethod
    def takeover(self) -> int: ...

    @abc.abstractmethod
    def generation(self) -> int: ...

    @abc.abstractmethod
    def used_bytes(self) -> int: ...

    @abc.abstractmethod
    def _drop(self, fence: int | None) -> None: ...
