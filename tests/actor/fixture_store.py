"""Stores saved by released versions (`fixtures/internal_vN.cbor`), loaded into a memory store."""

from __future__ import annotations

from pathlib import Path

import cbor2

from pagekv.kv import MemoryStore

FIXTURES = Path(__file__).with_name("fixtures")


def load_fixture(version: int) -> MemoryStore:
    """The store written by `fixtures/make_internal_v{version}.py`."""
    store = MemoryStore()
    dump = cbor2.loads((FIXTURES / f"internal_v{version}.cbor").read_bytes())
    for namespace, entries in dump.items():
        kv = store.namespace(namespace)
        for key, value in entries:
            kv.put({key: value})
    return store
