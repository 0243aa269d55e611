"""Shared fixtures for the KV tests: every backend behind one `store` fixture.

To add a backend, add one entry to `BACKENDS`: its name mapped to a `Backend` whose factory opens
a *fresh, empty* store for a location (a directory under the test's `tmp_path`; backends that keep
their data elsewhere may use the directory's name as a unique key) with the given limits. Every
test that uses `store`, `open_store` or `backend` then runs against it.

`postgres` keeps its data on the session's PostgreSQL server (`tests/conftest.py`): a location is
a schema of its own, named after the location's path, so a fresh location is an empty store and
the same location reopens the same data. Its tests are skipped (with the reason) where no server
can be started.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pagekv.kv import KvLimits, KvStore, open_kv

if TYPE_CHECKING:
    from conftest import PostgresServer


@dataclass(frozen=True)
class Backend:
    """How to open a store of one backend at a location.

    `persistent`: reopening the same location sees the data written before (memory does not).
    """

    name: str
    factory: Callable[[Path, KvLimits | None], KvStore]
    persistent: bool
    needs_server: bool = False


def _memory(location: Path, limits: KvLimits | None) -> KvStore:
    return open_kv("memory://", limits=limits)


def _file(location: Path, limits: KvLimits | None) -> KvStore:
    return open_kv(location.resolve().as_uri(), limits=limits)


def _file_folding(location: Path, limits: KvLimits | None) -> KvStore:
    """A log of two records' room, so nearly every write folds the log into the base first."""
    return open_kv(location.resolve().as_uri() + "?log_kib=12", limits=limits)


def _postgres(location: Path, limits: KvLimits | None, *, server: PostgresServer) -> KvStore:
    return open_kv(server.store_url(str(location)), limits=limits)


def _unbound(location: Path, limits: KvLimits | None) -> KvStore:
    raise AssertionError("use resolve_backend(): this backend needs the session's server")


BACKENDS: dict[str, Backend] = {
    "memory": Backend("memory", _memory, persistent=False),
    "file": Backend("file", _file, persistent=True),
    "file-folding": Backend("file-folding", _file_folding, persistent=True),
    "postgres": Backend("postgres", _unbound, persistent=True, needs_server=True),
}


def resolve_backend(name: str, request: pytest.FixtureRequest) -> Backend:
    """`BACKENDS[name]`, bound to the session's server if it needs one (or skipped without)."""
    backend = BACKENDS[name]
    if backend.needs_server:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        backend = replace(backend, factory=functools.partial(_postgres, server=server))
    return backend


class StoreOpener:
    """Opens stores of one backend for one test and closes every one of them afterwards.

    `opener()` opens a fresh store at a new location; `opener(location=name)` opens (or reopens)
    the store at a named location, so a persistent backend sees what was written there before.
    """

    def __init__(self, backend: Backend, root: Path) -> None:
        self.backend = backend
        self._root = root
        self._fresh = itertools.count()
        self._opened: list[KvStore] = []

    def __call__(self, limits: KvLimits | None = None, *, location: str | None = None) -> KvStore:
        if location is None:
            location = f"fresh-{next(self._fresh)}"
        store = self.backend.factory(self._root / location, limits)
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        while self._opened:
            self._opened.pop().close()


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test; every test using it runs once per entry of `BACKENDS`."""
    return resolve_backend(request.param, request)


@pytest.fixture
def open_store(backend: Backend, tmp_path: Path) -> Iterator[StoreOpener]:
    """A callable opening stores of the backend under test, e.g. with small custom `KvLimits`."""
    opener = StoreOpener(backend, tmp_path)
    yield opener
    opener.close_all()


@pytest.fixture
def store(open_store: StoreOpener) -> KvStore:
    """A fresh store with the default limits, closed after the test."""
    return open_store()
