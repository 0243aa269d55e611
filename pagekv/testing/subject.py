"""The backend under check: a user's factory, what it can do, and a recording view of its calls.

The factory contract (docs/backends.md, "The factory"): `factory()` returns a fresh, empty namespace
(any object with the `ActorKv` methods) or a fresh, empty store (`namespace(name)`, `close()`).
It is called with the keyword arguments it declares, of these two:

- `limits`: the `KvLimits` to apply. Without it the clauses that need small limits (an exact
  quota, say) cannot fill them and are reported as not checked.
- `location`: a directory, fresh and empty for a fresh store. A factory that declares it and
  returns a store must reopen the same data when called again with the same location after the
  store is closed (or its process killed): the restart checks need that.

What it declares is read from its signature; a compiled class (mypyc marks every parameter
positional-only, though it takes them by keyword) is taken at its word, and a factory whose
signature says nothing is tried with both, one and neither at its first call. Any failure of
that first call is a usage error; a later call failing is the backend's failure. So is a factory
whose calls share one store (a key put through the first call's object is in the second's):
every clause would see the others' keys.

Every call of the backend's (the factory, a store's methods, a namespace's) runs through
`Subject.call`, on a thread of its own, so that one that does not return within the call
timeout is reported (`CallTimeout`) instead of hanging the check.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
import queue
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final, TypeVar

from pagekv.kv import ACTOR_KV_METHODS, ActorKv, KvLimits
from pagekv.testing.violation import Call, Violation, show, show_call

Factory = Callable[..., Any]
T = TypeVar("T")

NAMESPACE: Final = "pagekv-check"
"""The namespace a check uses in a store it opened (a fresh store per check)."""
DEFAULT_CALL_TIMEOUT: Final = 60.0
"""Seconds a backend call may take before it is reported as one that does not return."""
_KEYWORDS: Final = ("limits", "location")
_MARK: Final = b"pagekv-check: is this store fresh?"

RETURNS: Final = "every call returns"
RETURNS_REQUIRES: Final = (
    "every call of the backend (the factory, a store's namespace() and close(), every namespace "
    "method) returns or raises within the check's call timeout"
)
OPENS: Final = "the factory opens a store or namespace each time it is called"
OPENS_REQUIRES: Final = (
    "the factory, called again as the check calls it (with the limits= and location= it "
    "declares), returns a fresh namespace or store, or the store at that location; a store's "
    "namespace(name) returns a namespace"
)


class UsageError(Exception):
    """The factory could not be loaded or called as the contract says (exit status 2)."""


class FactoryFailed(Exception):
    """The factory, or a store's `namespace()`, raised after the factory's first call worked:
    a failure of the backend, reported by the part that needed the store (a first call that
    fails is a usage error instead)."""

    def __init__(self, call: str, error: BaseException) -> None:
        super().__init__(f"{call} raised {show(error)}")
        self.call = call
        self.error = error

    def violation(self, part: str, seed: int | None = None) -> Violation:
        return Violation(
            part, OPENS, OPENS_REQUIRES, call=self.call, got=f"raised {show(self.error)}", seed=seed
        )


class CallTimeout(BaseException):
    """A backend call did not return within the call timeout; its thread is left inside the
    backend. Not an `Exception`, so that it passes every handler that takes a backend's error
    as its answer and ends the part (which reports `violation()`); every later call of the
    subject raises it at once, since the backend may be wedged."""

    def __init__(self, call: str, seconds: float) -> None:
        super().__init__(f"{call} did not return within {seconds:g} s")
        self.call = call
        self.seconds = seconds

    def violation(self, part: str, seed: int | None = None) -> Violation:
        got = f"did not return within {self.seconds:g} s"
        return Violation(part, RETURNS, RETURNS_REQUIRES, call=self.call, got=got, seed=seed)


class BackendExit(Exception):
    """A backend call raised `SystemExit` (or another `BaseException` that is neither an
    `Exception` nor `KeyboardInterrupt`): the backend's untyped error, never the check's exit."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"raised {type(error).__name__}({', '.join(map(repr, error.args))})")


def _invoke(fn: Callable[..., T], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> T:
    try:
        return fn(*args, **kwargs)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as e:
        raise BackendExit(e) from e


def load_factory(spec: str) -> Factory:
    """`MODULE:CALLABLE` (`CALLABLE` may be dotted) to the callable it names."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise UsageError(f"factory {spec!r} must be MODULE:CALLABLE, e.g. mykv:make_namespace")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"cannot import {module_name!r} for factory {spec!r}: {e}") from e
    except (Exception, SystemExit) as e:  # the module's own code failed as it was imported
        raise UsageError(
            f"cannot import {module_name!r} for factory {spec!r}: importing it raised {show(e)}"
        ) from e
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no {attr!r} (factory {spec!r})") from None
        except Exception as e:
            raise UsageError(f"factory {spec!r}: getting {part!r} raised {show(e)}") from e
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


def _compiled(factory: Factory) -> bool:
    """Whether `factory` is a class or function not written in Python (mypyc's, or C's): its
    signature then marks every parameter positional-only, though it takes them by keyword."""
    if isinstance(factory, type):
        return not any(
            inspect.isfunction(getattr(factory, n, None)) for n in ("__init__", "__new__")
        )
    return inspect.isbuiltin(factory)


def _keywords(factory: Factory) -> set[str] | None:
    """Which of `limits` and `location` the factory takes by keyword, by its signature; None
    when the signature cannot tell (none at all, or a compiled class's bare `*args, **kwargs`)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    kind = inspect.Parameter
    compiled = _compiled(factory)
    if compiled and {p.kind for p in parameters} <= {kind.VAR_POSITIONAL, kind.VAR_KEYWORD}:
        return None
    if any(p.kind is kind.VAR_KEYWORD for p in parameters):
        return set(_KEYWORDS)
    by_keyword: set[inspect._ParameterKind] = {kind.KEYWORD_ONLY, kind.POSITIONAL_OR_KEYWORD}
    if compiled:
        by_keyword.add(kind.POSITIONAL_ONLY)
    return {p.name for p in parameters if p.name in _KEYWORDS and p.kind in by_keyword}


class _Worker:
    """A daemon thread making one caller thread's backend calls, so that the caller can stop
    waiting for a call that does not return. It ends when its caller thread does (or when it
    is abandoned, once the call it is in returns)."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        threading.Thread(
            target=self._serve, args=(self.inbox,), name="pagekv-check-call", daemon=True
        ).start()
        weakref.finalize(self, self.inbox.put, None)

    @staticmethod
    def _serve(inbox: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        while (job := inbox.get()) is not None:
            fn, args, kwargs, box, done = job
            try:
                box.append((True, _invoke(fn, args, kwargs)))
            except BaseException as e:
                box.append((False, e))
            done.set()
            del job, fn, args, kwargs, box, done


class _Guarded:
    """A namespace of the backend's whose every method runs through `Subject.call`."""

    def __init__(self, subject: Subject, inner: Any, label: str) -> None:
        self.inner = inner
        """The backend's own object (the concurrent part calls it from threads it times)."""
        self._subject = subject
        self._label = label

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        label = f"{self._label}.{name}"
        return lambda *args, **kwargs: self._subject.call(label, attr, args, kwargs)


class _GuardedStore(_Guarded):
    """A store of the backend's: `namespace()` and `close()` under the call timeout, and the
    namespaces it returns guarded too."""

    def namespace(self, name: object) -> Any:
        inner = self._subject.call("store.namespace", self.inner.namespace, (name,))
        return _Guarded(self._subject, inner, "kv")

    def close(self) -> None:
        self._subject.call("store.close", self.inner.close)


class Subject:
    """A factory under check: opens fresh namespaces and stores, and closes all it opened.

    Every call of the backend's goes through `call`: on a thread of its own, so that one that
    does not return within `call_timeout` seconds raises `CallTimeout` instead of hanging the
    check. Thread-safe: the concurrent part opens handles from several threads.
    """

    def __init__(
        self,
        factory: Factory,
        name: str | None = None,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.factory = factory
        self.name = name or factory_name(factory)
        self.call_timeout = call_timeout
        self.hung: CallTimeout | None = None
        """The first call that did not return: the backend may be wedged since."""
        self._pid = os.getpid()
        self._local = threading.local()
        self._root: Path | None = None
        self._locations = itertools.count()
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        try:
            self.returns_store = self._probe_kind()
        except BaseException:
            self.close()
            raise

    def call(
        self,
        name: str,
        fn: Callable[..., T],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> T:
        """`fn(*args, **kwargs)`, a call of the backend's known as `name` in reports, within
        `call_timeout` seconds. A `KeyboardInterrupt` still stops the check; a `SystemExit`
        the backend raises becomes `BackendExit`, its error."""
        kwargs = kwargs or {}
        if os.getpid() != self._pid:  # a forked child has no workers; its parent times it
            return _invoke(fn, args, kwargs)
        if self.hung is not None:
            raise self.hung.with_traceback(None)
        worker = getattr(self._local, "worker", None)
        if worker is None:
            worker = self._local.worker = _Worker()
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        worker.inbox.put((fn, args, kwargs, box, done))
        try:
            returned = done.wait(self.call_timeout)
        except BaseException:  # interrupted: the call runs on, this worker is not used again
            self._local.worker = None
            raise
        if not returned:
            self._local.worker = None
            hung = CallTimeout(show_call(name, args, kwargs), self.call_timeout)
            with self._lock:
                self.hung = self.hung or hung
            raise hung
        ok, value = box[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def abandon(self, hung: CallTimeout) -> None:
        """A call of the subject's (made on a thread of the caller's) did not return: no more
        calls are made, and nothing is closed."""
        with self._lock:
            self.hung = self.hung or hung

    def _probe_kind(self) -> bool:
        """Call the factory once: what it returns, and which keywords it takes where its
        signature did not say. Any failure here is a usage error."""
        declared = _keywords(self.factory)
        tries = (
            [set(_KEYWORDS), {"limits"}, {"location"}, set()] if declared is None else [declared]
        )
        for n, keywords in enumerate(tries, 1):
            self.takes_limits = "limits" in keywords
            self.takes_location = "location" in keywords
            try:
                obj = self._call(None, None, first=True)
            except UsageError as e:
                unexpected = isinstance(e.__cause__, TypeError) and "keyword" in str(e.__cause__)
                if unexpected and n < len(tries):
                    continue
                raise
            break
        kind = is_store(obj) and not is_namespace(obj)
        if kind or is_namespace(obj):
            first = _Guarded(self, obj, "store" if kind else "kv")
            marked = self._mark(first, kind)
            try:
                self._close(first)
            except (Exception, CallTimeout) as e:
                raise UsageError(f"factory {self.name}'s first object: close() {show(e)}") from e
            self.returns_store = kind
            if marked:
                self._refuse_shared()
            return kind
        missing = [n for n in ACTOR_KV_METHODS if not hasattr(obj, n)]
        raise UsageError(
            f"factory {self.name} returned {type(obj).__name__} {obj!r:.40}, neither a namespace "
            f"(it lacks {', '.join(missing)}) nor a store (namespace(name) and close())"
        )

    def _open(self, obj: Any, store: bool) -> Any:
        return obj.namespace(NAMESPACE) if store else obj

    def _mark(self, first: Any, store: bool) -> bool:
        """Put `_MARK` through the factory's first object, for `_refuse_shared` to look for in
        the next one's. False when the put failed: the contract part then reports that."""
        try:
            self._open(first, store).put([(_MARK, _MARK)])
        except (Exception, CallTimeout):
            return False
        return True

    def _refuse_shared(self) -> None:
        """Refuse a factory whose calls share one store (`pagekv.kv:open_kv`, whose default is
        `./.pagekv`): every clause would see the others' keys, and the check would fill that
        store with its own. A usage error, before any part writes anything more. A second call
        or a `get` that fails says nothing of sharing: the parts make the same calls, and report
        their failures with the calls that led to them."""
        store = self.returns_store
        try:
            second = self._call(None, None)
            guarded = (
                _GuardedStore(self, second, "store") if store else _Guarded(self, second, "kv")
            )
            try:
                kv = self._open(guarded, store)
                shared = kv.get([_MARK]) == [_MARK]
                if shared:
                    kv.delete([_MARK])
            finally:
                with suppress(Exception, CallTimeout):
                    self._close(guarded)
        except (Exception, CallTimeout):
            return
        if shared:
            raise UsageError(
                f"factory {self.name} opens a persistent store at a fixed place: a key put "
                "through one call's store is in the next one's, where each call must return a "
                "fresh, empty store; take `location` and open the store in that directory, e.g. "
                'open_kv(f"file://{location}")'
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

    def _call(self, limits: KvLimits | None, location: Path | None, first: bool = False) -> Any:
        """The factory's object, raw. Its first call failing is a usage error; a later one
        (after the first worked) is the backend's failure, `FactoryFailed`."""
        kwargs: dict[str, Any] = {}
        if self.takes_limits and limits is not None:
            kwargs["limits"] = limits
        if self.takes_location:
            kwargs["location"] = location if location is not None else self.location()
        shown = show_call(self.name, (), kwargs)
        try:
            return self.call(self.name, self.factory, (), kwargs)
        except (Exception, CallTimeout) as e:
            if not first:
                if isinstance(e, CallTimeout):
                    raise
                raise FactoryFailed(shown, e) from e
            if isinstance(e, TypeError):
                raise UsageError(f"factory {self.name} cannot be called with {kwargs}: {e}") from e
            raise UsageError(
                f"factory {self.name} failed its first call, {shown}: {show(e)}"
            ) from e

    def open_store(
        self, limits: KvLimits | None = None, location: Path | None = None, *, track: bool = True
    ) -> Any:
        """A store (only when the factory returns stores), closed by `close` unless `track` is
        False: a caller that opens and closes many stores (the restart part) closes its own,
        since a store's `close` need not be idempotent."""
        assert self.returns_store
        store = _GuardedStore(self, self._call(limits, location), "store")
        if track:
            with self._lock:
                self._opened.append(store)
        return store

    def namespace(self, limits: KvLimits | None = None) -> ActorKv:
        """A fresh, empty namespace."""
        if self.returns_store:
            store = self.open_store(limits)
            try:
                return store.namespace(NAMESPACE)  # type: ignore[no-any-return]
            except Exception as e:
                raise FactoryFailed(f"store.namespace({NAMESPACE!r})", e) from e
        ns = _Guarded(self, self._call(limits, None), "kv")
        with self._lock:
            self._opened.append(ns)
        return ns  # type: ignore[return-value]

    def limits_of(self, kv: ActorKv, asked: KvLimits | None) -> KvLimits:
        """The limits a namespace advertises; those asked for, if it advertises none."""
        limits = getattr(kv, "limits", None)
        return limits if isinstance(limits, KvLimits) else (asked or KvLimits())

    def close(self) -> None:
        """Close what the subject opened (unless a call hung: the backend may be wedged), and
        remove its directories. A close that fails is not what a check checks."""
        with self._lock:
            opened, self._opened = self._opened, []
            root, self._root = self._root, None
        for obj in reversed(opened):
            if self.hung is not None:
                break
            with suppress(Exception, CallTimeout):
                self._close(obj)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    @staticmethod
    def _close(obj: Any) -> None:
        close = getattr(obj, "close", None)
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
