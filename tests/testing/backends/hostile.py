"""Backends that are correct but odd, and ones that are hostile: what `check_backend` must judge
without crashing, hanging, or convicting the correct ones.

Correct but odd (`check_backend` must not fail them): `flaky_store` (transient errors the
contract allows), `offset_store` (fresh namespaces at generation 1000), `exclusive_store`
(refuses a second store at a location in use). Hostile ones (each must get a verdict naming the
call): `bytearray_store` and `list_pairs_store` (results of the wrong type), `Exits` (a call
raising `SystemExit`), `Hangs` (a call that never returns).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

from pagekv.kv import FenceMismatch, KvIndeterminate, KvLimits, KvUnavailable
from pagekv.kv.limits import INT64_MAX
from pagekv.kv.wrappers import WRITE_OPS, KvWrapper
from tests.testing.backends.plain import PlainKv, PlainStore, plain_namespace

T = TypeVar("T")
UNAVAILABLE: Final = 20
"""`flaky_store(mode="unavailable")`: one call in this many raises `KvUnavailable` unsent."""
INDETERMINATE: Final = 50
"""`flaky_store(mode="indeterminate")`: one write in this many applies, then raises
`KvIndeterminate`."""


class _Store:
    """A store whose namespaces are its inner store's, each wrapped by `wrap`."""

    def __init__(self, inner: PlainStore, wrap: Callable[[Any], Any]) -> None:
        self.inner = inner
        self.limits = inner.limits
        self._wrap = wrap

    def namespace(self, name: str) -> Any:
        return self._wrap(self.inner.namespace(name))

    def close(self) -> None:
        self.inner.close()


class Flaky(KvWrapper):
    """Fails as a remote store does now and then: `unavailable`, a call raises `KvUnavailable`
    before it is sent; `indeterminate`, a write is applied and its answer lost."""

    raised: ClassVar[Counter[str]] = Counter()
    """How many times each mode failed a call (in this process: a kill's child counts apart)."""

    def __init__(self, inner: Any, mode: str, rng: random.Random) -> None:
        super().__init__(inner)
        self.mode = mode
        self.rng = rng

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.mode == "unavailable" and self._fails(UNAVAILABLE):
            self.raised[self.mode] += 1
            raise KvUnavailable(f"flaky: {op} was not sent")
        result = fn(*args, **kwargs)
        lost = self.mode == "indeterminate" and op in WRITE_OPS
        if lost and self._fails(INDETERMINATE):
            self.raised[self.mode] += 1
            raise KvIndeterminate(f"flaky: {op} was applied, its answer lost")
        return result

    def _fails(self, one_in: int) -> bool:
        """1 call in `one_in` at random, and always the first this process makes in the mode:
        a part that runs few calls in its time (a loaded machine) still meets the fault its test
        asserts it handled."""
        return self.rng.randrange(one_in) == 0 or not self.raised[self.mode]


def flaky_store(mode: str) -> Callable[..., _Store]:
    """A durable plain store failing transiently in `mode`, seeded by the location."""

    def factory(location: Path, limits: KvLimits | None = None) -> _Store:
        rng = random.Random(f"{mode}:{Path(location).name}")
        return _Store(PlainStore(location, limits), lambda kv: Flaky(kv, mode, rng))

    return factory


class Offset(KvWrapper):
    """Generations 1000 above the inner namespace's: a fresh namespace starts at 1000 (a fence
    below that is passed on as one the inner namespace never reaches, so it is stale there too;
    a fence that is no generation at all is passed on as it is, to be refused). A stale fence's
    `FenceMismatch` names the fence and generation as this namespace numbers them."""

    OFFSET: Final = 1000

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        fence = kwargs.get("fence")
        if type(fence) is int and 0 <= fence <= INT64_MAX:
            kwargs["fence"] = fence - self.OFFSET if fence >= self.OFFSET else INT64_MAX - fence
        try:
            result = fn(*args, **kwargs)
        except FenceMismatch as e:
            raise FenceMismatch(fence, e.current + self.OFFSET) from None  # type: ignore[arg-type]
        if op in ("takeover", "generation"):
            return result + self.OFFSET  # type: ignore[operator, no-any-return]
        return result


def offset_store(location: Path, limits: KvLimits | None = None) -> _Store:
    return _Store(PlainStore(location, limits), Offset)


class ExclusiveStore(PlainStore):
    """Refuses to open a location another store of this process has open, as a store holding
    an exclusive file lock does."""

    held: ClassVar[set[Path]] = set()
    _held_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, location: Path, limits: KvLimits | None = None) -> None:
        path = Path(location).resolve()
        with self._held_lock:
            if path in self.held:
                raise BlockingIOError(f"{location} is locked by another store")
            self.held.add(path)
        self._locked: Path | None = path
        super().__init__(location, limits)

    def close(self) -> None:
        super().close()
        with self._held_lock:
            if self._locked is not None:
                self.held.discard(self._locked)
                self._locked = None


def exclusive_store(location: Path, limits: KvLimits | None = None) -> ExclusiveStore:
    return ExclusiveStore(location, limits)


class BytearrayValues(PlainKv):
    """Returns values as bytearrays: equal to bytes, but not the contract's type."""

    def get(self, keys: Any) -> list[Any]:
        return [None if v is None else bytearray(v) for v in super().get(keys)]


class ListPairs(PlainKv):
    """Returns list entries as [key, value] lists, not (key, value) tuples."""

    def list(self, **kwargs: Any) -> list[Any]:
        return [list(pair) for pair in super().list(**kwargs)]


def _store_of(kv_class: type[PlainKv]) -> Callable[..., PlainStore]:
    store = type(f"{kv_class.__name__}Store", (PlainStore,), {"kv_class": kv_class})

    def factory(location: Path, limits: KvLimits | None = None) -> PlainStore:
        return store(location, limits)  # type: ignore[no-any-return]

    return factory


bytearray_store = _store_of(BytearrayValues)
list_pairs_store = _store_of(ListPairs)


class Exits:
    """A namespace whose `list()` raises `SystemExit(7)`, as code calling `sys.exit` does."""

    def __init__(self, limits: KvLimits | None = None) -> None:
        self.inner = plain_namespace(limits)
        self.limits = self.inner.limits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list(self, **kwargs: Any) -> Any:
        raise SystemExit(7)


class Hangs:
    """A namespace one of whose methods waits for `release` forever, as one waiting on a lock
    it never gets. `hanging(method)` makes the factory."""

    def __init__(self, method: str, release: threading.Event, limits: KvLimits | None) -> None:
        self.inner = plain_namespace(limits)
        self.limits = self.inner.limits
        self._method = method
        self._release = release

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self._method:
            return attr

        def stuck(*args: Any, **kwargs: Any) -> Any:
            self._release.wait()
            return attr(*args, **kwargs)

        return stuck


def hanging(method: str) -> tuple[Callable[..., Hangs], threading.Event]:
    """A factory of namespaces whose `method` never returns, and the event that releases them."""
    release = threading.Event()

    def factory(limits: KvLimits | None = None) -> Hangs:
        return Hangs(method, release, limits)

    return factory, release
