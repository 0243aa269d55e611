"""Wrappers that sit between a caller and any `ActorKv`: op counting and fault injection.

Both implement the `ActorKv` interface by delegation, so the VFS cannot tell them from a backend.
`CountingKv` is how tests and `pagekv bench` count round trips and bytes instead of timing;
`FaultyKv` is how the fault matrix and `pagekv fuzz` break a chosen operation on purpose.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, assert_never

from librt.threading import Lock
from mypy_extensions import mypyc_attr

from pagekv.kv.api import ActorKv, KvStore
from pagekv.kv.errors import KvIndeterminate, KvUnavailable
from pagekv.kv.limits import Entries, KvLimits, check_write, is_mapping
from pagekv.kv.namespace import KvNamespace, Shorthands

T = TypeVar("T")

WRITE_OPS: Final = frozenset({"write", "delete_range", "takeover", "drop"})
READ_OPS: Final = frozenset({"get", "list", "generation", "used_bytes"})
OPS: Final = (
    "get",
    "list",
    "write",
    "delete_range",
    "takeover",
    "generation",
    "used_bytes",
    "drop",
)
"""Every `ActorKv` call (`WRITE_OPS | READ_OPS`), in the order `KvStats.calls` counts them."""
_OP_INDEX: Final = {op: i for i, op in enumerate(OPS)}
_WRITE: Final = _OP_INDEX["write"]


@mypyc_attr(allow_interpreted_subclasses=True)
class KvWrapper(Shorthands):
    """Forwards every `ActorKv` call to `inner` through one hook, `_call`: override it to observe
    or alter calls (the base of every wrapper, and of users' own).

    Arguments are passed on unchecked, so a wrong type gets the inner store's `InvalidKey` or
    `InvalidArgument`. That is why range bounds, `limit`, `reverse` and `fence` are typed
    `object`: compiled, a typed parameter is checked on entry and would raise a `TypeError` of
    its own first (keys inside collections are not checked)."""

    def __init__(self, inner: ActorKv) -> None:
        self.inner = inner

    @property
    def limits(self) -> KvLimits:
        return self.inner.limits

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    def get(self, keys: Iterable[bytes]) -> list[bytes | None]:
        return self._call("get", self.inner.get, list(keys))

    def list(
        self,
        *,
        prefix: object = None,
        start: object = None,
        end: object = None,
        limit: object = None,
        reverse: object = False,
    ) -> list[tuple[bytes, bytes]]:
        return self._call(
            "list",
            self.inner.list,
            prefix=prefix,
            start=start,
            end=end,
            limit=limit,
            reverse=reverse,
        )

    def write(
        self, *, put: Entries = (), delete: Sequence[bytes] = (), fence: object = None
    ) -> None:
        put = dict(put.items()) if is_mapping(put) else list(put)
        self._call("write", self.inner.write, put=put, delete=list(delete), fence=fence)

    def delete_range(self, start: object, end: object, *, fence: object = None) -> None:
        self._call("delete_range", self.inner.delete_range, start, end, fence=fence)

    def takeover(self) -> int:
        return self._call("takeover", self.inner.takeover)

    def generation(self) -> int:
        return self._call("generation", self.inner.generation)

    def used_bytes(self) -> int:
        return self._call("used_bytes", self.inner.used_bytes)

    def drop(self, *, fence: object = None) -> None:
        self._call("drop", self.inner.drop, fence=fence)


def _given_size(put: Entries, delete: Sequence[Sized]) -> int:
    """Bytes of the keys and values of a write as given (a mapping or pairs, and delete keys),
    or 0 if one has no length: the store then rejects the write. Items are `Sized`, not
    `bytes`: any key or value with a length is counted, and the store judges its type."""
    pairs: Iterable[tuple[Sized, Sized]] = put.items() if is_mapping(put) else put
    try:
        return sum([len(k) + len(v) for k, v in pairs]) + sum([len(k) for k in delete])
    except TypeError:
        return 0


@dataclass
class KvStats:
    """Round trips by op, entries and bytes moved (keys + values).

    `calls` holds each op's round trips in `OPS` order, and `round_trips` reads them as a
    `Counter`: bumping an item of a list costs a few instructions, where a `Counter`'s item
    update cost 0.8k on every write."""

    calls: list[int] = field(default_factory=lambda: [0] * len(OPS))
    entries_written: int = 0
    bytes_written: int = 0
    entries_read: int = 0
    bytes_read: int = 0

    @property
    def round_trips(self) -> Counter[str]:
        return Counter({op: n for op, n in zip(OPS, self.calls, strict=True) if n})

    @property
    def writes(self) -> int:
        return sum(self.calls[_OP_INDEX[op]] for op in WRITE_OPS)

    @property
    def reads(self) -> int:
        return self.calls[_OP_INDEX["get"]] + self.calls[_OP_INDEX["list"]]

    @property
    def total(self) -> int:
        return sum(self.calls)


@mypyc_attr(allow_interpreted_subclasses=True)
class CountingKv(KvWrapper):
    """Counts every call that reaches the inner store, including calls that fail."""

    def __init__(self, inner: ActorKv) -> None:
        super().__init__(inner)
        self._lock = Lock()  # librt's: a compiled `with` on it is ~10x cheaper than threading's
        self.stats = KvStats()

    def reset(self) -> KvStats:
        """Start counting afresh; return what was counted so far."""
        with self._lock:
            old, self.stats = self.stats, KvStats()
        return old

    def write(
        self, *, put: Entries = (), delete: Sequence[bytes] = (), fence: object = None
    ) -> None:
        if not is_mapping(put):
            put = list(put)
        if delete:
            delete = list(delete)
        entries = len(put) + len(delete)
        inner = self.inner
        if not isinstance(inner, KvNamespace):
            self._count_write(entries, _given_size(put, delete))
            write: Callable[..., None] = inner.write  # `fence` unchecked, as in `_call`
            write(put=put, delete=delete, fence=fence)
            return
        # pagekv's own backends: the write is validated once, here, and sized from its batch
        # (the same bytes as given), then passed on as a compiled call without keywords
        try:
            batch = check_write(inner.limits, put, delete)
        except BaseException:
            self._count_write(entries, _given_size(put, delete))
            raise
        self._count_write(entries, batch.payload)
        inner.write_batch(batch, fence)

    def _count_write(self, entries: int, size: int) -> None:
        with self._lock:
            stats = self.stats
            stats.calls[_WRITE] += 1
            stats.entries_written += entries
            stats.bytes_written += size

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            self.stats.calls[_OP_INDEX[op]] += 1
        result = fn(*args, **kwargs)
        read: Any = result
        entries = size = 0
        if op == "list":
            for key, value in read:
                entries += 1
                size += len(key) + len(value)
        elif op == "get":
            for value in read:
                if value is not None:
                    entries += 1
                    size += len(value)
        else:
            return result
        with self._lock:
            self.stats.entries_read += entries
            self.stats.bytes_read += size
        return result


class FaultKind(enum.Enum):
    FAIL_BEFORE = "fail-before"
    """Raise `KvUnavailable` without calling the inner store: nothing is applied."""
    APPLY_THEN_RAISE = "apply-then-raise"
    """Call the inner store, then raise `KvIndeterminate`: applied, but the caller can't know."""


@dataclass(frozen=True)
class Fault:
    """Inject `kind` at the `at`-th (0-based) call counted among `ops`."""

    at: int
    kind: FaultKind
    ops: frozenset[str] = WRITE_OPS


@dataclass(frozen=True)
class FiredFault:
    index: int
    op: str
    kind: FaultKind


class InjectedUnavailable(KvUnavailable):
    """A `FAIL_BEFORE` fault: the store was never called."""


class InjectedIndeterminate(KvIndeterminate):
    """An `APPLY_THEN_RAISE` fault: the store applied the request, then the answer was lost."""


class FaultyKv(KvWrapper):
    """Injects faults by an explicit schedule and/or by seeded chance, plus optional latency.

    `faults` fire at fixed positions; `fail_rate` and `indeterminate_rate` draw from `seed`'s
    generator for every write op. `fired` records every injected fault, so a test can assert that
    the fault it meant to inject really happened.
    """

    def __init__(
        self,
        inner: ActorKv,
        *,
        faults: Iterable[Fault] = (),
        seed: int | None = None,
        fail_rate: float = 0.0,
        indeterminate_rate: float = 0.0,
        latency_ms: float = 0.0,
    ) -> None:
        super().__init__(inner)
        self._faults = list(faults)
        self._rng = random.Random(seed)
        self.fail_rate = fail_rate
        self.indeterminate_rate = indeterminate_rate
        self.latency_s = latency_ms / 1000
        self._lock = threading.Lock()
        self._counts: Counter[frozenset[str]] = Counter()
        self.calls = 0
        """Calls made while enabled; fault positions count only those."""
        self.fired: list[FiredFault] = []
        self.enabled = True

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def arm(self, kind: FaultKind, *, after: int = 0, ops: frozenset[str] = WRITE_OPS) -> None:
        """Inject `kind` at the `after`-th (0-based) of the upcoming calls among `ops`."""
        with self._lock:
            self._faults.append(Fault(self._counts[ops] + after, kind, ops))

    def _choose(self, op: str) -> FaultKind | None:
        with self._lock:
            if not self.enabled:
                return None
            index = self.calls
            self.calls += 1
            # Position of this call within each group it belongs to. Groups are visited in list
            # order (not set order, which varies with PYTHONHASHSEED), and when faults of several
            # groups are due at once the first one listed wins, so a schedule replays exactly.
            position: dict[frozenset[str], int] = {}
            for group in dict.fromkeys(f.ops for f in self._faults):
                if op in group:
                    position[group] = self._counts[group]
                    self._counts[group] += 1
            chosen: FaultKind | None = None
            for fault in self._faults:
                if position.get(fault.ops) == fault.at:
                    chosen = fault.kind
                    break
            if chosen is None and op in WRITE_OPS:
                draw = self._rng.random()
                if draw < self.fail_rate:
                    chosen = FaultKind.FAIL_BEFORE
                elif draw < self.fail_rate + self.indeterminate_rate:
                    chosen = FaultKind.APPLY_THEN_RAISE
            if chosen is not None:
                self.fired.append(FiredFault(index, op, chosen))
            return chosen

    def fired_count(self, kind: FaultKind | None = None) -> int:
        return sum(1 for f in self.fired if kind is None or f.kind is kind)

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.latency_s:
            time.sleep(self.latency_s)
        kind = self._choose(op)
        match kind:
            case None:
                return fn(*args, **kwargs)
            case FaultKind.FAIL_BEFORE:
                raise InjectedUnavailable(f"injected fault: {op} failed before it was applied")
            case FaultKind.APPLY_THEN_RAISE:
                fn(*args, **kwargs)
                raise InjectedIndeterminate(f"injected fault: {op} applied, then its answer lost")
            case _:
                assert_never(kind)


class FaultyStore:
    """A store whose namespaces are each wrapped in `FaultyKv` over `CountingKv` (one pair per
    namespace, kept across reopenings), so a test can count a namespace's writes in a clean run
    and then fail exactly one of them. Namespaces named in `exclude` are passed through."""

    def __init__(self, inner: KvStore, *, exclude: Iterable[str] = ()) -> None:
        self.inner = inner
        self.exclude = frozenset(exclude)
        self.faulty: dict[str, FaultyKv] = {}
        self.counting: dict[str, CountingKv] = {}

    def namespace(self, actor_id: str) -> ActorKv:
        kv = self.inner.namespace(actor_id)
        if actor_id in self.exclude:
            return kv
        if actor_id not in self.faulty:
            self.counting[actor_id] = CountingKv(kv)
            self.faulty[actor_id] = FaultyKv(self.counting[actor_id])
        return self.faulty[actor_id]

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> FaultyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
