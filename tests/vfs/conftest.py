"""Shared fixtures for the VFS tests: a fresh KV namespace on every backend.

`ns` runs a test once per backend (memory://, file:// and postgresql:// on the session's server,
see `tests/conftest.py`); `new_ns` makes any number of fresh namespaces of the backend under test
(the fault matrix needs one per injected fault); `memory_ns` is for tests whose assertions do not
depend on the backend (round-trip counts, memory bounds) and that would only be slower elsewhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pagekv.kv import ActorKv, KvLimits, KvStore, open_kv

if TYPE_CHECKING:
    from conftest import PostgresServer

KV_BACKENDS = ("memory", "file", "postgres")
NewNamespace = Callable[..., ActorKv]


def kv_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of a fresh store of `backend` under `tmp_path` (postgres: a schema of its own)."""
    if backend == "memory":
        return "memory://"
    if backend == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        return server.store_url(str(tmp_path / "kv"))
    return (tmp_path / "kv").resolve().as_uri()


@pytest.fixture(params=KV_BACKENDS)
def kv_backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test."""
    return str(request.param)


@pytest.fixture
def kv_store(kv_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KvStore]:
    """A fresh, empty store of each backend, closed after the test."""
    store = open_kv(kv_url(kv_backend, tmp_path, request))
    yield store
    store.close()


@pytest.fixture
def ns(kv_store: KvStore) -> ActorKv:
    """An empty actor namespace on each backend."""
    return kv_store.namespace("actor-1")


@pytest.fixture
def new_ns(
    kv_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[NewNamespace]:
    """`new_ns(limits=None)`: a fresh, empty namespace of the backend under test on each call.

    Stores are shared per distinct limits (a namespace name is never reused), and all are closed
    after the test.
    """
    stores: dict[KvLimits | None, KvStore] = {}
    names = itertools.count()

    def make(limits: KvLimits | None = None) -> ActorKv:
        if limits not in stores:
            location = tmp_path / f"kv-{len(stores)}"
            url = kv_url(kv_backend, location, request)
            stores[limits] = open_kv(url, limits=limits)
        return stores[limits].namespace(f"actor-{next(names)}")

    yield make
    for store in stores.values():
        store.close()


@pytest.fixture
def memory_ns() -> ActorKv:
    """An empty actor namespace on memory:// only."""
    return open_kv("memory://").namespace("actor-1")
