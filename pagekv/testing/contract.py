"""The KV contract, clause by clause (DESIGN.md §3), runnable against any backend.

Each clause is registered in `CLAUSES` (`clauses.py`) and checks one thing the contract promises,
at its boundaries: ordering, prefix/range/limit/reverse, atomicity of every batch under rejected
entries, every limit at its boundary, the exact quota with overwrite credit and delete and range
refunds, fencing and takeover, drop. `pagekv check-backend`, `check_backend()` and the pytest
suite (`KvContract`) all run these same clauses; so do pagekv's own backend tests.
"""

from __future__ import annotations

import random

from pagekv.kv import FenceMismatch, KvLimits, StorageQuotaExceeded
from pagekv.testing.clauses import Trial, clause

ORDERED_KEYS: list[bytes] = [
    b"\x00",
    b"\x00\x00",
    b"\x00\xff",
    b"\x01",
    b"A",
    b"a",
    b"a\x00",
    b"a\x00\x00",
    b"a\x01",
    b"aa",
    b"a\x7f",
    b"a\x80",
    b"a\xff",
    b"a\xff\xff",
    b"b",
    b"\x7f",
    b"\x80",
    b"\xfe\xff",
    b"\xff",
    b"\xff\x00",
    b"\xff\xff",
    b"\xff\xff\xff",
]
"""Keys that catch signed-byte comparison, NUL-terminated comparison and length-first order."""


def value_of(key: bytes) -> bytes:
    return b"v:" + key


def filled(t: Trial):  # type: ignore[no-untyped-def]
    """A fresh namespace holding `ORDERED_KEYS`, written in a shuffled order in batches of 5."""
    kv = t.namespace()
    keys = ORDERED_KEYS[:]
    random.Random(7).shuffle(keys)
    for i in range(0, len(keys), 5):
        kv.put([(k, value_of(k)) for k in keys[i : i + 5]])
    return kv


# --- ordering, list, get ---------------------------------------------------------------------


@clause("list() returns every key in unsigned bytewise order, shorter before longer on a tie")
def list_orders_keys_bytewise(t: Trial) -> None:
    kv = filled(t)
    t.expect(kv.list(), [(k, value_of(k)) for k in ORDERED_KEYS], "list() in bytewise order")
    t.expect(
        kv.list(reverse=True),
        [(k, value_of(k)) for k in reversed(ORDERED_KEYS)],
        "list(reverse=True) in descending bytewise order",
    )


# --- quota -----------------------------------------------------------------------------------


@clause("an overwrite is charged only the difference between the new and the old value's size")
def quota_credits_overwrites(t: Trial) -> None:
    kv = t.namespace(KvLimits(max_storage_bytes=1000))
    kv.put({b"k": b"x" * 600})
    t.expect(kv.used_bytes(), 601, "used_bytes() counts the key and value")
    kv.put({b"k": b"y" * 999})
    t.expect(kv.used_bytes(), 1000, "an overwrite to exactly the quota is allowed")


# --- fencing ---------------------------------------------------------------------------------


@clause("a write fenced with a stale generation raises FenceMismatch and writes nothing")
def stale_fence_fails_and_changes_nothing(t: Trial) -> None:
    kv = t.namespace()
    kv.takeover()
    gen = kv.takeover()
    kv.put({b"a": b"1"})
    before = t.snapshot(kv)
    for stale in (gen - 1, gen + 1):
        with t.raises(FenceMismatch, requires=f"put fenced {stale} at generation {gen} fails"):
            kv.put({b"a": b"changed"}, fence=stale)
        t.unchanged(kv, before, "a stale fenced put")
    with t.raises(
        StorageQuotaExceeded, FenceMismatch, requires="stale fences fail whatever the write"
    ):
        kv.write(put={b"b": b"2"}, delete=[b"a"], fence=gen - 1)
