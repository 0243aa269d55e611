"""The `ActorKv` interface: what the VFS and the tools ask of a namespace.

`ActorKv` is a structural protocol: the VFS and the tools accept any object with these methods, so
wrappers and test doubles can sit underneath. Our backends implement it on `KvNamespace`
(`namespace.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pagekv.kv.limits import Entries, KvLimits


@runtime_checkable
class ActorKv(Protocol):
    """One actor's ordered, fenced key-value namespace. Synchronous and thread-safe."""

    @property
    def limits(self) -> KvLimits: ...

    def get(self, keys: Iterable[bytes]) -> list[bytes | None]: ...

    def list(
        self,
        *,
        prefix: bytes | None = None,
        start: bytes | None = None,
        end: bytes | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[bytes, bytes]]: ...

    def write(
        self, *, put: Entries = (), delete: Sequence[bytes] = (), fence: int | None = None
    ) -> None: ...

    def put(self, entries: Entries, *, fence: int | None = None) -> None: ...

    def delete(self, keys: Sequence[bytes], *, fence: int | None = None) -> None: ...

    def delete_range(self, start: bytes, end: bytes, *, fence: int | None = None) -> None: ...

    def takeover(self) -> int: ...

    def generation(self) -> int: ...

    def used_bytes(self) -> int: ...

    def drop(self, *, fence: int | None = None) -> None: ...


ACTOR_KV_METHODS: tuple[str, ...] = tuple(n for n in vars(ActorKv) if not n.startswith("_"))
"""The names an object must have to serve as an `ActorKv` (checked by name, not by type)."""


class KvStore(Protocol):
    """A store of many actors' namespaces. The stores `open_kv` opens are context managers too
    (`with open_kv(url) as store:` closes it); the contract needs only `close`.

    A store may also say `never_waits = True`: its operations (and `namespace`) complete on the
    calling thread without I/O, sleeping or waiting on another process, in a few µs, so a caller
    may run them on its event loop rather than hand them to a thread (the actor runtime does).
    Without the attribute a store is taken to wait."""

    def namespace(self, actor_id: str) -> ActorKv: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class FlushCounts:
    """What a durable store has done since it was opened, in this process: `writes` records
    made durable (one per acknowledged write, takeover or namespace creation), `flushes` durable
    syncs of its log (group commit lets one flush cover many writes), `folds` of the log into the
    base. `flushes / writes` is the figure group commit drives down."""

    writes: int
    flushes: int
    folds: int
