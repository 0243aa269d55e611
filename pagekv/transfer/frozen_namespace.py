"""`FrozenNamespace`: a namespace as one `list` read it, served from memory, read only.

A read-only snapshot of a database (`open_database(kv, read_only=True)`) of over 4 MiB reads
its pages as SQLite asks, and a writer that rewrites a page in place before the snapshot read it
overtakes it (`SnapshotExpired`): a busy actor may overtake every snapshot of a long read. One
`list` of the whole namespace is atomic in every backend (one statement, one lock), so a
snapshot opened on its result holds one committed state of the database and of the actor's
`ctx.kv` entries together, and never expires, at the cost of holding the namespace in memory
(`FROZEN_MAX_BYTES` bounds what the tools read so).

The generation is read after the `list`: every value the `list` returned was written by that
generation or an earlier one, which is all a snapshot asks of it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Final

from pagekv.kv import ActorKv, Entries, InvalidArgument, KvLimits, check_keys, check_list

FROZEN_MAX_BYTES: Final = 256 * 2**20
"""Namespaces up to this many stored bytes are read in one `list` by the export."""


class FrozenNamespace:
    """The `ActorKv` read methods over one consistent state of `kv`; every write is refused."""

    def __init__(self, kv: ActorKv) -> None:
        rows = kv.list()
        self._generation = kv.generation()
        self._limits = kv.limits
        self._keys = [key for key, _ in rows]
        self._values = dict(rows)
        self._used = sum(len(key) + len(value) for key, value in rows)

    @property
    def limits(self) -> KvLimits:
        return self._limits

    def get(self, keys: Iterable[bytes]) -> list[bytes | None]:
        return [self._values.get(key) for key in check_keys(self._limits, keys)]

    def list(
        self,
        *,
        prefix: bytes | None = None,
        start: bytes | None = None,
        end: bytes | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        checked = check_list(self._limits, prefix, start, end, limit, reverse)
        if checked is None:
            return []
        lo_key, hi_key, count, backwards = checked
        lo = 0 if lo_key is None else bisect.bisect_left(self._keys, lo_key)
        hi = len(self._keys) if hi_key is None else bisect.bisect_left(self._keys, hi_key)
        keys = self._keys[lo:hi][::-1] if backwards else self._keys[lo:hi]
        keys = keys[:count]
        return [(key, self._values[key]) for key in keys]

    def generation(self) -> int:
        return self._generation

    def used_bytes(self) -> int:
        return self._used

    def takeover(self) -> int:
        raise _refused()

    def write(
        self, *, put: Entries = (), delete: Sequence[bytes] = (), fence: int | None = None
    ) -> None:
        raise _refused()

    def put(self, entries: Entries, *, fence: int | None = None) -> None:
        raise _refused()

    def delete(self, keys: Sequence[bytes], *, fence: int | None = None) -> None:
        raise _refused()

    def delete_range(self, start: bytes, end: bytes, *, fence: int | None = None) -> None:
        raise _refused()

    def drop(self, *, fence: int | None = None) -> None:
        raise _refused()


def _refused() -> InvalidArgument:
    return InvalidArgument("a frozen namespace is read only")


def frozen_if_small(kv: ActorKv, max_bytes: int | None = None) -> ActorKv:
    """`kv` frozen (one consistent read) if it stores at most `max_bytes` (default
    `FROZEN_MAX_BYTES`), else `kv` itself."""
    limit = FROZEN_MAX_BYTES if max_bytes is None else max_bytes
    return FrozenNamespace(kv) if kv.used_bytes() <= limit else kv
