"""The backend under check: a user's factory, what it can do, and a recording view of its calls.

The factory contract (README, "Writing a backend"): `factory()` returns a fresh, empty namespace
(any object with the `ActorKv` methods) or a fresh, empty store (`namespace(name)`, `close()`).
It is called with the keyword arguments it declares, of these two:

- `limits`: the `KvLimits` to apply. Without it the clauses that need small limits (an exact
  quota, say) cannot fill them and are reported as not checked.
- `location`: a directory, fresh and empty for a fresh store. A factory that declares it and
  returns a store must reopen the same data when called again with the same location after the
  store is closed (or its process killed): the restart checks need that.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from pagekv.kv import ACTOR_KV_METHODS, ActorKv, KvLimits
from pagekv.testing.report import Call

Factory = Callable[..., Any]

NAMESPACE: Final = "pagekv-check"
"""The namespace a check uses in a store it opened (a fresh store per check)."""


class UsageError(Exception):
    """The factory could not be loaded or called as the contract says (exit status 2)."""


def load_factory(spec: str) -> Factory:
    """`MODULE:CALLABLE` (`CALLABLE` may be dotted) to the callable it names."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise UsageError(f"factory {spec!r} must be MODULE:CALLABLE, e.g. mykv:make_namespace")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"cannot import {module_name!r} for factory {spec!r}: {e}") from e
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no {attr!r} (factory {spec!r})") from None
    if not callable(target):
        raise UsageError(f"factory {spec!r} is a {type(target).__name__}, not a callable")
    return target


def factory_name(factory: Factory) -> str:
    """The `MODULE:CALLABLE` a factory is known by in reports and replay files."""
    module = getattr(factory, "__module__", None) or "?"
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{module}:{name}"


def is_namespace(obj: object) -> bool:
    return all(callable(getattr(obj, n, None)) or n == "limits" for n in ACTOR_KV_METHODS) and (
        hasattr(obj, "limits")
    )


def is_store(obj: object) -> bool:
    return callable(getattr(obj, "namespace", None)) and callable(getattr(obj, "close", None))


def _declares(factory: Factory, name: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


class Subject:
    """A factory under check: opens fresh namespaces and stores, and closes all it opened.

    Thread-safe: the concurrent part opens handles from several threads.
    """

    def __init__(self, factory: Factory, name: str | None = None) -> None:
        self.factory = factory
        self.name = name or factory_name(factory)
        self.takes_limits = _declares(factory, "limits")
        self.takes_location = _declares(factory, "location")
        self._root: Path | None = None
        self._locations = itertools.count()
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        try:
            self.returns_store = self._probe_kind()
        except BaseException:
            self.close()
            raise

    def _probe_kind(self) -> bool:
        obj = self._call(None, None)
        if is_store(obj) and not is_namespace(obj):
            self._close(obj)
            return True
        if is_namespace(obj):
            self._drop_quietly(obj)
            return False
        missing = [n for n in ACTOR_KV_METHODS if not hasattr(obj, n)]
        raise UsageError(
            f"factory {self.name} returned {type(obj).__name__} {obj!r:.40}, neither a namespace "
            f"(it lacks {', '.join(missing)}) nor a store (namespace(name) and close())"
        )

    @property
    def reopens(self) -> bool:
        """Whether the same data can be opened again: a store factory taking `location`."""
        return self.returns_store and self.takes_location

    def location(self) -> Path:
        """A fresh, empty directory for a new store (removed by `close`)."""
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="pagekv-check-"))
            path = self._root / f"store-{next(self._locations)}"
        path.mkdir()
        return path

    def _call(self, limits: KvLimits | None, location: Path | None) -> Any:
        kwargs: dict[str, Any] = {}
        if self.takes_limits and limits is not None:
            kwargs["limits"] = limits
        if self.takes_location:
            kwargs["location"] = location if location is not None else self.location()
        try:
            return self.factory(**kwargs)
        except TypeError as e:
            raise UsageError(f"factory {self.name} cannot be called with {kwargs}: {e}") from e

    def open_store(
        self, limits: KvLimits | None = None, location: Path | None = None, *, track: bool = True
    ) -> Any:
        """A store (only when the factory returns stores), closed by `close` unless `track` is
        False: a caller that opens and closes many stores (the restart part) closes its own,
        since a store's `close` need not be idempotent."""
        assert self.returns_store
        store = self._call(limits, location)
        if track:
            with self._lock:
                self._opened.append(store)
        return store

    def namespace(self, limits: KvLimits | None = None) -> ActorKv:
        """A fresh, empty namespace."""
        if self.returns_store:
            return self.open_store(limits).namespace(NAMESPACE)  # type: ignore[no-any-return]
        ns = self._call(limits, None)
        with self._lock:
            self._opened.append(ns)
        return ns  # type: ignore[no-any-return]

    def limits_of(self, kv: ActorKv, asked: KvLimits | None) -> KvLimits:
        """The limits a namespace advertises; those asked for, if it advertises none."""
        limits = getattr(kv, "limits", None)
        return limits if isinstance(limits, KvLimits) else (asked or KvLimits())

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
            root, self._root = self._root, None
        for obj in reversed(opened):
            self._close(obj)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    @staticmethod
    def _close(obj: Any) -> None:
        close = getattr(obj, "close", None)
        if callable(close):
            close()

    @staticmethod
    def _drop_quietly(ns: Any) -> None:
        close = getattr(ns, "close", None)
        if callable(close):
            close()


class Probe:
    """A namespace whose every call is recorded in `calls` (shared by a check's handles), so a
    report can name the call that broke the contract and the calls before it."""

    def __init__(self, inner: ActorKv, calls: list[Call], handle: str = "kv") -> None:
        self.inner = inner
        self.calls = calls
        self.handle = handle

    @property
    def limits(self) -> KvLimits:
        return self.inner.limits

    def _record(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call = Call(method, args, kwargs, self.handle)
        self.calls.append(call)
        try:
            call.returned = getattr(self.inner, method)(*args, **kwargs)
        except BaseException as e:
            call.raised = e
            raise
        return call.returned

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method not in ACTOR_KV_METHODS:
            raise AttributeError(method)
        return lambda *args, **kwargs: self._record(method, *args, **kwargs)

    def last(self) -> Call | None:
        return self.calls[-1] if self.calls else None


@contextmanager
def switching_often(interval: float = 1e-5) -> Iterator[None]:
    """Make the interpreter switch threads every `interval` seconds (default 5 ms) for a
    concurrent run: races a backend leaves open then show within a few hundred calls."""
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
