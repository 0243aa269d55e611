"""A backend as a careful author writes one without pagekv's `KvNamespace`: the proof's control.

`PlainKv` implements the `ActorKv` methods over a dict, a sorted key list and one lock, and
validates with the helpers `pagekv.kv` exports for backends, so it refuses what every backend
refuses. `PlainStore` holds its namespaces; given a location it keeps an append-only log of
JSON records there, one per acknowledged change, fsynced before the call returns and replayed
at open, so a SIGKILL loses nothing acknowledged. `check_backend` must pass both factories; the
variants in `broken.py` each change one seam of these classes.

Invariants: a `NamespaceState`'s `keys` are its `values`' keys in order, `used` their exact size;
a change is logged before it is applied, under the store's lock, so memory never holds an
unlogged change.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from pagekv.kv import (
    Entries,
    KvLimits,
    KvUnavailable,
    WriteBatch,
    check_fence,
    check_fence_arg,
    check_key,
    check_keys,
    check_list,
    check_name,
    check_quota,
    check_write,
    entry_size,
    quota_delta,
)

Record = dict[str, Any]
"""One logged change: `op` (write, range, takeover, drop), the namespace `ns`, its arguments."""


@dataclass(eq=False)
class NamespaceState:
    """One namespace's contents, shared by every handle of it."""

    values: dict[bytes, bytes] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)
    generation: int = 0
    used: int = 0


class PlainKv:
    """One namespace of a `PlainStore`: validate outside the lock, check the fence and quota,
    log and apply inside it."""

    def __init__(self, name: str, store: PlainStore, state: NamespaceState) -> None:
        self._name = name
        self._store = store
        self._ns = state
        self._lock = store.lock
        self._limits = store.limits

    @property
    def limits(self) -> KvLimits:
        return self._limits

    def get(self, keys: Any) -> list[bytes | None]:
        checked = check_keys(self._limits, keys)
        with self._lock:
            return [self._ns.values.get(k) for k in checked]

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
        lo, hi, n, backwards = checked
        with self._lock:
            i, j = self._span(lo, hi)
            return [(k, self._ns.values[k]) for k in self._select(i, j, n, backwards)]

    def write(self, *, put: Entries = (), delete: Any = (), fence: object = None) -> None:
        batch = self._validate(put, delete)
        checked = check_fence_arg(fence)
        with self._lock:
            check_fence(checked, self._ns.generation)
            used = check_quota(self._limits, self._ns.used, self._charge(batch))
            puts = [[k, v] for k, v in batch.puts.items()]
            self._commit({"op": "write", "put": puts, "del": list(batch.deletes), "used": used})

    def put(self, entries: Entries, *, fence: object = None) -> None:
        self.write(put=entries, fence=fence)

    def delete(self, keys: Any, *, fence: object = None) -> None:
        self.write(delete=keys, fence=fence)

    def delete_range(self, start: object, end: object, *, fence: object = None) -> None:
        lo = check_key(self._limits, start, "start key")
        hi = check_key(self._limits, end, "end key")
        checked = check_fence_arg(fence)
        with self._lock:
            check_fence(checked, self._ns.generation)
            i, j = self._span(lo, hi)
            if i < j:
                self._commit({"op": "range", "start": lo, "end": hi})

    def takeover(self) -> int:
        with self._lock:
            self._commit({"op": "takeover", "gen": self._ns.generation + 1})
            return self._ns.generation

    def generation(self) -> int:
        with self._lock:
            return self._ns.generation

    def used_bytes(self) -> int:
        with self._lock:
            return self._ns.used

    def drop(self, *, fence: object = None) -> None:
        checked = check_fence_arg(fence)
        with self._lock:
            check_fence(checked, self._ns.generation)
            self._commit({"op": "drop"})

    # --- the seams `broken.py` changes -------------------------------------------------------

    def _validate(self, put: Entries, delete: Any) -> WriteBatch:
        return check_write(self._limits, put, delete)

    def _charge(self, batch: WriteBatch) -> int:
        """What `batch` changes the usage by: overwrites credited, deletes refunded."""
        return quota_delta(batch, self._ns.values)

    def _pos(self, key: bytes) -> int:
        """Where `key` is or would go in the sorted keys."""
        return bisect.bisect_left(self._ns.keys, key)

    def _span(self, lo: bytes | None, hi: bytes | None) -> tuple[int, int]:
        """The positions of the keys in [lo, hi) (None: unbounded)."""
        return (0 if lo is None else self._pos(lo)), (
            len(self._ns.keys) if hi is None else self._pos(hi)
        )

    def _select(self, i: int, j: int, n: int | None, backwards: bool) -> list[bytes]:
        """The first `n` keys of positions [i, j) in the asked direction."""
        chosen = self._ns.keys[i:j]
        return (chosen[::-1] if backwards else chosen)[:n]

    def _commit(self, record: Record) -> None:
        """Log a change, then apply it (the caller holds the lock)."""
        self._store.log({"ns": self._name, **record})
        self.apply(record)

    def apply(self, record: Record) -> None:
        """Apply a logged change: when it is made, and when the log is replayed at open."""
        ns = self._ns
        match record["op"]:
            case "write":
                for key in record["del"]:
                    if ns.values.pop(key, None) is not None:
                        del ns.keys[self._pos(key)]
                for key, value in record["put"]:
                    if key not in ns.values:
                        ns.keys.insert(self._pos(key), key)
                    ns.values[key] = value
                ns.used = record["used"]
            case "range":
                i, j = self._span(record["start"], record["end"])
                for key in ns.keys[i:j]:
                    ns.used -= self._refund(key, ns.values.pop(key))
                del ns.keys[i:j]
            case "takeover":
                ns.generation = record["gen"]
            case "drop":
                ns.values.clear()
                ns.keys.clear()
                ns.used = 0

    def _refund(self, key: bytes, value: bytes) -> int:
        return entry_size(key, value)


class _Shared:
    """What every store open at one location in this process shares: namespaces, lock, log."""

    def __init__(self) -> None:
        self.states: dict[str, NamespaceState] = {}
        self.lock = threading.Lock()
        self.file: BinaryIO | None = None
        self.opened = 0


_OPEN: dict[Path, _Shared] = {}
"""The locations open in this process, so two stores at one location see one namespace."""
_OPEN_LOCK = threading.Lock()


class PlainStore:
    """Namespaces of `kv_class` in memory, or durable in `location` (one log of every change).

    Stores open at one location in one process share it; one process at a time may open a
    location. The log's last line may be torn by a kill (it was never acknowledged): it is cut
    off at open, so later records are not appended after it.
    """

    kv_class: ClassVar[type[PlainKv]] = PlainKv
    log_name: ClassVar[str] = "plain.log"

    def __init__(self, location: Path | str | None = None, limits: KvLimits | None = None) -> None:
        self.limits = limits or KvLimits()
        self._path = None if location is None else Path(location).resolve()
        self._closed = False
        self._shared = _Shared()
        if self._path is None:
            return
        with _OPEN_LOCK:
            shared = _OPEN.get(self._path)
            if shared is None:
                self._shared.file = self._open_log(self._path)
                shared = _OPEN[self._path] = self._shared
            shared.opened += 1
        self._shared = shared

    @property
    def lock(self) -> threading.Lock:
        return self._shared.lock

    def namespace(self, name: str) -> PlainKv:
        checked = check_name(self.limits, name)
        with self.lock:
            state = self._shared.states.setdefault(checked, NamespaceState())
        return self.kv_class(checked, self, state)

    def log(self, record: Record) -> None:
        """Make `record` durable (a no-op in memory): written and fsynced before it counts."""
        if self._path is None:
            return
        file = self._shared.file
        if file is None or self._closed:
            raise KvUnavailable(f"the store at {self._path} is closed")
        file.write(json.dumps(_encode(record)).encode() + b"\n")
        file.flush()
        os.fsync(file.fileno())

    def close(self) -> None:
        if self._path is None or self._closed:
            return
        self._closed = True
        with _OPEN_LOCK, self.lock:
            self._shared.opened -= 1
            if self._shared.opened == 0:
                del _OPEN[self._path]
                assert self._shared.file is not None
                self._shared.file.close()
                self._shared.file = None

    def _open_log(self, location: Path) -> BinaryIO:
        """Replay the log into this store's namespaces; the log, open for appending after its last
        whole record."""
        location.mkdir(parents=True, exist_ok=True)
        path = location / self.log_name
        good = 0
        if path.exists():
            with path.open("rb") as f:
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    record = _decode(json.loads(line))
                    state = self._shared.states.setdefault(record["ns"], NamespaceState())
                    self.kv_class(record["ns"], self, state).apply(record)
                    good += len(line)
        file = path.open("ab")
        file.truncate(good)
        os.fsync(file.fileno())
        dir_fd = os.open(location, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return file


def _encode(value: Any) -> Any:
    """JSON for a record: bytes as `{"x": hex}`."""
    if isinstance(value, bytes):
        return {"x": value.hex()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"x"}:
            return bytes.fromhex(value["x"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def plain_namespace(limits: KvLimits | None = None) -> PlainKv:
    """A fresh in-memory namespace (a store of its own)."""
    return PlainStore(None, limits).namespace("plain")


def plain_store(location: Path, limits: KvLimits | None = None) -> PlainStore:
    """The store at `location`: fresh when it is empty, else what was acknowledged there."""
    return PlainStore(location, limits)
