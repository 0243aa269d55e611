"""Shared fixtures for the VFS tests: a fresh KV namespace on every backend.

`ns` runs a test once per backend (memory:// and file://); `memory_ns` is for tests whose
assertions do not depend on the backend (round-trip counts, memory bounds) and that would only be
slower on file://.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pagekv.kv import ActorKv, KvStore, open_kv

KV_BACKENDS = ("memory", "file")


def kv_url(backend: str, tmp_path: Path) -> str:
    """The URL of a fresh store of `backend` under `tmp_path`."""
    if backend == "memory":
        return "memory://"
    return (tmp_path / "kv").resolve().as_uri()


@pytest.fixture(params=KV_BACKENDS)
def kv_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KvStore]:
    """A fresh, empty store of each backend, closed after the test."""
    store = open_kv(kv_url(request.param, tmp_path))
    yield store
    store.close()


@pytest.fixture
def ns(kv_store: KvStore) -> ActorKv:
    """An empty actor namespace on each backend."""
    return kv_store.namespace("actor-1")


@pytest.fixture
def memory_ns() -> ActorKv:
    """An empty actor namespace on memory:// only."""
    return open_kv("memory://").namespace("actor-1")
