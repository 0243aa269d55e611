"""The KV contract (DESIGN.md §3), run against every backend in `conftest.BACKENDS`."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import pagekv.kv.memory
from pagekv.kv import (
    ActorKv,
    BatchTooLarge,
    Fault,
    FaultKind,
    FaultyKv,
    FenceMismatch,
    FiredFault,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvLimits,
    KvStore,
    KvUnavailable,
    LimitError,
    NameTooLarge,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
    open_kv,
)

KB = 1024
MAX_KEY = 2048
MAX_VALUE = 128 * KB
MAX_ENTRIES = 128
MAX_BATCH = 976 * KB
OpenStore = Callable[..., KvStore]

# Keys chosen to catch signed-byte comparison, NUL-terminated comparison and length-first order.
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


def value_of(key: bytes) -> bytes:
    return b"v:" + key


def snapshot(kv: ActorKv) -> tuple[list[tuple[bytes, bytes]], int, int]:
    """Everything observable about a namespace: contents, used bytes, generation."""
    return kv.list(), kv.used_bytes(), kv.generation()


def charge(entries: dict[bytes, bytes]) -> int:
    return sum(len(k) + len(v) for k, v in entries.items())


@pytest.fixture
def kv(store: KvStore) -> ActorKv:
    return store.namespace("actor-1")


@pytest.fixture
def filled(kv: ActorKv) -> ActorKv:
    """A namespace holding `ORDERED_KEYS`, written in a shuffled order over several batches."""
    keys = ORDERED_KEYS[:]
    random.Random(7).shuffle(keys)
    for i in range(0, len(keys), 5):
        kv.put([(k, value_of(k)) for k in keys[i : i + 5]])
    return kv


def reference_list(
    keys: list[bytes],
    start: bytes | None,
    end: bytes | None,
    limit: int | None,
    reverse: bool,
) -> list[tuple[bytes, bytes]]:
    chosen = [k for k in sorted(keys) if (start is None or k >= start) and (end is None or k < end)]
    if reverse:
        chosen.reverse()
    if limit is not None:
        chosen = chosen[:limit]
    return [(k, value_of(k)) for k in chosen]


# --- ordering, list, get ---------------------------------------------------------------------


def test_list_orders_keys_bytewise(filled: ActorKv) -> None:
    assert sorted(ORDERED_KEYS) == ORDERED_KEYS  # the literal above is itself in bytewise order
    assert filled.list() == [(k, value_of(k)) for k in ORDERED_KEYS]
    assert filled.list(reverse=True) == [(k, value_of(k)) for k in reversed(ORDERED_KEYS)]


def test_prefix_includes_exactly_the_keys_with_that_prefix(filled: ActorKv) -> None:
    assert [k for k, _ in filled.list(prefix=b"a")] == [
        b"a",
        b"a\x00",
        b"a\x00\x00",
        b"a\x01",
        b"aa",
        b"a\x7f",
        b"a\x80",
        b"a\xff",
        b"a\xff\xff",
    ]
    assert [k for k, _ in filled.list(prefix=b"a\xff")] == [b"a\xff", b"a\xff\xff"]
    assert [k for k, _ in filled.list(prefix=b"a\x00")] == [b"a\x00", b"a\x00\x00"]
    assert [k for k, _ in filled.list(prefix=b"\x00")] == [b"\x00", b"\x00\x00", b"\x00\xff"]
    # An all-0xff prefix has no finite upper bound: it must reach the end of the keyspace.
    assert [k for k, _ in filled.list(prefix=b"\xff")] == [
        b"\xff",
        b"\xff\x00",
        b"\xff\xff",
        b"\xff\xff\xff",
    ]
    assert [k for k, _ in filled.list(prefix=b"\xff\xff")] == [b"\xff\xff", b"\xff\xff\xff"]
    assert filled.list(prefix=b"zz") == []


def test_prefix_with_reverse_and_limit(filled: ActorKv) -> None:
    assert [k for k, _ in filled.list(prefix=b"a", reverse=True, limit=3)] == [
        b"a\xff\xff",
        b"a\xff",
        b"a\x80",
    ]
    assert [k for k, _ in filled.list(prefix=b"a", limit=2)] == [b"a", b"a\x00"]
    assert [k for k, _ in filled.list(prefix=b"\xff", reverse=True, limit=2)] == [
        b"\xff\xff\xff",
        b"\xff\xff",
    ]


def test_range_is_half_open(filled: ActorKv) -> None:
    got = filled.list(start=b"a\x00", end=b"a\xff")
    assert [k for k, _ in got] == [b"a\x00", b"a\x00\x00", b"a\x01", b"aa", b"a\x7f", b"a\x80"]
    got = filled.list(start=b"a\x00", end=b"a\xff", reverse=True, limit=2)
    assert [k for k, _ in got] == [b"a\x80", b"a\x7f"]
    assert [k for k, _ in filled.list(end=b"\x01")] == [b"\x00", b"\x00\x00", b"\x00\xff"]
    assert [k for k, _ in filled.list(start=b"\xff\xff")] == [b"\xff\xff", b"\xff\xff\xff"]
    # Bounds that are not stored keys.
    assert [k for k, _ in filled.list(start=b"a\x02", end=b"a\x81")] == [b"aa", b"a\x7f", b"a\x80"]


LIST_RANGES: list[tuple[bytes | None, bytes | None]] = [
    (None, None),
    (b"a", None),
    (None, b"b"),
    (b"a", b"b"),
    (b"a\x00", b"a\x00\x00"),
    (b"a\x00", b"a\x00\x01"),
    (b"b", b"a"),
    (b"a", b"a"),
    (b"\xff", None),
    (b"\x00", b"\x00\x01"),
    (b"\x00\x00", b"\xff\xff"),
]


def test_list_matches_reference_for_every_range_limit_and_direction(filled: ActorKv) -> None:
    for start, end in LIST_RANGES:
        for limit in (None, 1, 2, 5, 100):
            for reverse in (False, True):
                got = filled.list(start=start, end=end, limit=limit, reverse=reverse)
                expected = reference_list(ORDERED_KEYS, start, end, limit, reverse)
                assert got == expected, (start, end, limit, reverse)


def test_list_rejects_a_prefix_with_bounds(filled: ActorKv) -> None:
    with pytest.raises(InvalidArgument, match="prefix"):
        filled.list(prefix=b"a", start=b"a")
    with pytest.raises(InvalidArgument, match="prefix"):
        filled.list(prefix=b"a", end=b"b")


def test_a_list_limit_beyond_any_count_means_all(open_store: OpenStore) -> None:
    """Past 2**63 - 1, PostgreSQL refused the limit and the file store's merge raised."""
    store = open_store()
    kv = store.namespace("a")
    kv.put({k: value_of(k) for k in ORDERED_KEYS})
    # Enough bytes elsewhere that the folding file store folds: "a" is then read from its base.
    for i in range(4):
        store.namespace("other").put({b"k%d" % i: b"x" * 8 * KB})
    for limit in (len(ORDERED_KEYS), 2**31, 2**63 - 1, 2**63, 2**64, 10**30):
        for reverse in (False, True):
            expected = reference_list(ORDERED_KEYS, None, None, None, reverse)
            assert kv.list(limit=limit, reverse=reverse) == expected
            assert kv.list(prefix=b"a", limit=limit, reverse=reverse) == [
                (k, v) for k, v in expected if k.startswith(b"a")
            ]


@pytest.mark.parametrize("limit", [0, -1, -(2**70), True, False, 1.0, 2.5, "2", b"2"])
def test_a_list_limit_that_is_not_a_positive_int_is_refused_before_any_round_trip(
    store: KvStore, limit: object
) -> None:
    kv = store.namespace("a")
    kv.put({b"k": b"v"})
    with pytest.raises(InvalidArgument, match="limit") as info:
        kv.list(limit=limit)  # type: ignore[arg-type]
    assert str(limit) in str(info.value)
    store.close()  # from here a round trip fails (KvUnavailable) on the stores that make one
    with pytest.raises(InvalidArgument, match="limit"):
        kv.list(limit=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("reverse", [None, 0, 1, "yes", "False"])
def test_list_reverse_must_be_a_bool(filled: ActorKv, reverse: object) -> None:
    with pytest.raises(InvalidArgument, match="reverse"):
        filled.list(reverse=reverse)  # type: ignore[arg-type]


def test_list_of_empty_namespace(kv: ActorKv) -> None:
    assert kv.list() == []
    assert kv.list(reverse=True, limit=3) == []
    assert kv.list(prefix=b"x") == []


def test_get_returns_values_in_request_order_with_none_for_missing(filled: ActorKv) -> None:
    request = [b"\xff", b"missing", b"\x00", b"a\x00", b"\x00", b"nope", b"A"]
    assert filled.get(request) == [
        value_of(b"\xff"),
        None,
        value_of(b"\x00"),
        value_of(b"a\x00"),
        value_of(b"\x00"),
        None,
        value_of(b"A"),
    ]
    assert filled.get([]) == []
    assert filled.get(iter([b"b"])) == [value_of(b"b")]


def test_empty_and_binary_values_round_trip(kv: ActorKv) -> None:
    blob = bytes(range(256)) * 3
    kv.put({b"empty": b"", b"blob": blob, b"nul": b"\x00"})
    assert kv.get([b"empty", b"blob", b"nul", b"absent"]) == [b"", blob, b"\x00", None]
    assert kv.used_bytes() == len(b"empty") + len(b"blob") + len(blob) + len(b"nul") + 1


def test_put_accepts_a_mapping_or_pairs_and_the_last_put_of_a_key_wins(kv: ActorKv) -> None:
    kv.put({b"m": b"1"})
    kv.put([(b"p", b"1"), (b"p", b"2")])
    kv.write(put=iter([(b"g", b"1")]))
    assert kv.list() == [(b"g", b"1"), (b"m", b"1"), (b"p", b"2")]
    assert kv.used_bytes() == 6


def test_bytes_like_keys_and_values_are_stored_as_bytes(kv: ActorKv) -> None:
    entries = {memoryview(b"ba"): memoryview(b"mv"), b"plain": bytearray(b"xyz")}
    kv.put(entries)  # type: ignore[arg-type]
    kv.put([(memoryview(b"pair"), bytearray(b"1"))])  # type: ignore[list-item]
    assert kv.list() == [(b"ba", b"mv"), (b"pair", b"1"), (b"plain", b"xyz")]
    assert all(type(v) is bytes for v in kv.get([b"ba", b"pair", b"plain"]))
    entries[b"plain"][:] = b"zzz"  # the store kept its own copy
    assert kv.get([b"plain"]) == [b"xyz"]
    assert kv.used_bytes() == 4 + 5 + 8


def test_the_callers_dict_is_its_own_after_a_write(kv: ActorKv) -> None:
    entries = {b"a": b"1", b"b": b"2"}
    kv.put(entries)
    entries[b"a"] = b"changed"
    entries[b"c"] = b"3"
    del entries[b"b"]
    assert kv.list() == [(b"a", b"1"), (b"b", b"2")]
    assert kv.used_bytes() == 4


def test_write_puts_and_deletes_in_one_batch(kv: ActorKv) -> None:
    kv.put({b"a": b"1", b"b": b"2", b"c": b"3"})
    kv.write(put={b"b": b"22", b"d": b"4"}, delete=[b"a", b"c", b"never-existed"])
    assert kv.list() == [(b"b", b"22"), (b"d", b"4")]
    assert kv.used_bytes() == 3 + 2
    kv.delete([b"b"])
    assert kv.list() == [(b"d", b"4")]
    assert kv.used_bytes() == 2


def test_used_bytes_counts_keys_and_values_exactly(kv: ActorKv) -> None:
    entries = {bytes([i]) * (i + 1): b"x" * (3 * i) for i in range(1, 40)}
    kv.put(entries)
    assert kv.used_bytes() == charge(entries)
    kv.put({b"\x01\x01": b"yyyy"})  # overwrite 3 bytes of value with 4
    assert kv.used_bytes() == charge(entries) + 1


# --- atomicity -------------------------------------------------------------------------------


@pytest.fixture
def seeded(kv: ActorKv) -> ActorKv:
    kv.put({b"keep-1": b"one", b"keep-2": b"two", b"keep-3": b"three"})
    return kv


@pytest.mark.parametrize(
    ("put", "delete", "error"),
    [
        ({b"new": b"x", b"keep-1": b"changed", b"big": b"v" * (MAX_VALUE + 1)}, [], ValueTooLarge),
        ({b"new": b"x", b"k" * (MAX_KEY + 1): b"v"}, [b"keep-2"], KeyTooLarge),
        ({b"new": b"x"}, [b"keep-1", b"k" * (MAX_KEY + 1)], KeyTooLarge),
        ({b"new-%d" % i: b"x" for i in range(MAX_ENTRIES)}, [b"keep-1"], TooManyEntries),
        ({b"new-%d" % i: b"x" * MAX_VALUE for i in range(8)}, [b"keep-1"], BatchTooLarge),
        ({b"new": b"x", b"": b"empty key"}, [b"keep-1"], InvalidKey),
        ({b"new": b"x", b"keep-1": b"put and deleted"}, [b"keep-1"], InvalidKey),
        ({b"new": b"x", "str key": b"v"}, [], InvalidKey),  # type: ignore[dict-item]
        ({b"new": "str value"}, [b"keep-1"], InvalidKey),  # type: ignore[dict-item]
    ],
)
def test_a_batch_that_breaks_a_rule_writes_nothing(
    seeded: ActorKv, put: dict[bytes, bytes], delete: list[bytes], error: type[KvError]
) -> None:
    before = snapshot(seeded)
    with pytest.raises(error):
        seeded.write(put=put, delete=delete)
    assert snapshot(seeded) == before


def test_a_batch_over_quota_writes_nothing(open_store: OpenStore) -> None:
    kv = open_store(KvLimits(max_storage_bytes=50)).namespace("a")
    kv.put({b"k1": b"x" * 18, b"k2": b"y" * 18})  # 40 bytes
    before = snapshot(kv)
    # Deleting k1 refunds 20, but the new entries charge 31: 51 > 50.
    with pytest.raises(StorageQuotaExceeded):
        kv.write(put={b"k2": b"z" * 18, b"n1": b"a" * 9, b"n2": b"b" * 18}, delete=[b"k1"])
    assert snapshot(kv) == before


def test_a_stale_fenced_batch_writes_nothing(seeded: ActorKv) -> None:
    gen = seeded.takeover()
    seeded.takeover()
    before = snapshot(seeded)
    with pytest.raises(FenceMismatch):
        seeded.write(put={b"new": b"x", b"keep-1": b"changed"}, delete=[b"keep-2"], fence=gen)
    assert snapshot(seeded) == before


def test_fail_before_fault_applies_nothing(seeded: ActorKv) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, FaultKind.FAIL_BEFORE)])
    before = snapshot(seeded)
    with pytest.raises(KvUnavailable):
        faulty.write(put={b"new": b"x", b"keep-1": b"changed"}, delete=[b"keep-2"])
    assert faulty.fired == [FiredFault(0, "write", FaultKind.FAIL_BEFORE)]
    assert snapshot(seeded) == before


def test_apply_then_raise_fault_applies_the_whole_batch(seeded: ActorKv) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, FaultKind.APPLY_THEN_RAISE)])
    used = seeded.used_bytes()
    with pytest.raises(KvIndeterminate):
        faulty.write(put={b"new": b"x", b"keep-1": b"changed"}, delete=[b"keep-2"])
    assert faulty.fired == [FiredFault(0, "write", FaultKind.APPLY_THEN_RAISE)]
    assert seeded.list() == [(b"keep-1", b"changed"), (b"keep-3", b"three"), (b"new", b"x")]
    assert seeded.used_bytes() == used + len(b"new") + 1 + 4 - len(b"keep-2") - 3


@pytest.mark.parametrize("kind", list(FaultKind))
def test_faults_on_delete_range_and_drop(seeded: ActorKv, kind: FaultKind) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, kind), Fault(1, kind)])
    expected_error = KvUnavailable if kind is FaultKind.FAIL_BEFORE else KvIndeterminate
    with pytest.raises(expected_error):
        faulty.delete_range(b"keep-1", b"keep-3")
    if kind is FaultKind.FAIL_BEFORE:
        assert [k for k, _ in seeded.list()] == [b"keep-1", b"keep-2", b"keep-3"]
    else:
        assert [k for k, _ in seeded.list()] == [b"keep-3"]
    with pytest.raises(expected_error):
        faulty.drop()
    assert faulty.fired == [FiredFault(0, "delete_range", kind), FiredFault(1, "drop", kind)]
    assert (seeded.list() == []) is (kind is FaultKind.APPLY_THEN_RAISE)
    assert (seeded.used_bytes() == 0) is (kind is FaultKind.APPLY_THEN_RAISE)


# --- limits at their exact boundaries --------------------------------------------------------


def test_default_limits_are_the_documented_ones() -> None:
    limits = KvLimits()
    assert limits.max_key_bytes == 2048
    assert limits.max_value_bytes == 131072
    assert limits.max_batch_entries == 128
    assert limits.max_batch_bytes == 999424
    assert limits.max_storage_bytes == 10 * 2**30
    assert limits.max_name_bytes == 2048


def test_store_applies_the_limits_it_was_opened_with(open_store: OpenStore) -> None:
    limits = KvLimits(max_key_bytes=10)
    kv = open_store(limits).namespace("a")
    assert kv.limits == limits
    kv.put({b"k" * 10: b"v"})
    with pytest.raises(KeyTooLarge):
        kv.put({b"k" * 11: b"v"})


def assert_limit_error(
    exc: LimitError, kind: type[LimitError], limit: str, actual: int, allowed: int
) -> None:
    assert type(exc) is kind
    assert isinstance(exc, KvError)
    assert exc.limit == limit
    assert hasattr(KvLimits(), limit)
    assert exc.actual == actual
    assert exc.allowed == allowed
    message = str(exc)
    assert limit in message
    assert str(actual) in message
    assert str(allowed) in message


def test_key_size_boundary(kv: ActorKv) -> None:
    ok, over = b"k" * MAX_KEY, b"k" * (MAX_KEY + 1)
    kv.put({ok: b"v"})
    assert kv.get([ok]) == [b"v"]
    assert kv.list(prefix=ok) == [(ok, b"v")]
    assert kv.list(start=ok, end=ok[:-1] + b"l") == [(ok, b"v")]
    kv.delete_range(ok, ok[:-1] + b"l")
    assert kv.get([ok]) == [None]
    kv.put({ok: b"v"})
    kv.delete([ok])
    assert kv.list() == []
    attempts: list[Callable[[], object]] = [
        lambda: kv.put({over: b"v"}),
        lambda: kv.delete([over]),
        lambda: kv.get([over]),
        lambda: kv.list(prefix=over),
        lambda: kv.list(start=over),
        lambda: kv.list(end=over),
        lambda: kv.delete_range(b"a", over),
        lambda: kv.delete_range(over, b"z"),
    ]
    for attempt in attempts:
        with pytest.raises(KeyTooLarge) as info:
            attempt()
        assert_limit_error(info.value, KeyTooLarge, "max_key_bytes", MAX_KEY + 1, MAX_KEY)
    assert kv.used_bytes() == 0


def test_value_size_boundary(kv: ActorKv) -> None:
    kv.put({b"ok": b"v" * MAX_VALUE})
    assert kv.get([b"ok"]) == [b"v" * MAX_VALUE]
    with pytest.raises(ValueTooLarge) as info:
        kv.put({b"over": b"v" * (MAX_VALUE + 1)})
    assert_limit_error(info.value, ValueTooLarge, "max_value_bytes", MAX_VALUE + 1, MAX_VALUE)
    assert kv.get([b"over"]) == [None]
    assert kv.used_bytes() == 2 + MAX_VALUE


def test_batch_entries_boundary(kv: ActorKv) -> None:
    keys = [b"k%03d" % i for i in range(MAX_ENTRIES + 1)]
    kv.put({k: b"v" for k in keys[:MAX_ENTRIES]})
    assert len(kv.list()) == MAX_ENTRIES
    with pytest.raises(TooManyEntries) as info:
        kv.put({k: b"w" for k in keys})
    assert_limit_error(
        info.value, TooManyEntries, "max_batch_entries", MAX_ENTRIES + 1, MAX_ENTRIES
    )
    assert kv.list() == [(k, b"v") for k in keys[:MAX_ENTRIES]]
    # Puts and deletes count together.
    with pytest.raises(TooManyEntries) as info:
        kv.write(put={k: b"w" for k in keys[:64]}, delete=keys[64:])
    assert info.value.actual == MAX_ENTRIES + 1
    assert kv.list() == [(k, b"v") for k in keys[:MAX_ENTRIES]]
    with pytest.raises(TooManyEntries):
        kv.delete(keys)
    assert len(kv.list()) == MAX_ENTRIES
    kv.write(put={k: b"w" for k in keys[:64]}, delete=keys[64:MAX_ENTRIES])
    assert kv.list() == [(k, b"w") for k in keys[:64]]


def test_repeated_keys_count_against_the_batch_limits_as_sent(seeded: ActorKv) -> None:
    """A request is measured as sent, by every operation: a repeated key counts each time (a
    delete used to count it once), though it is read, written or deleted once."""
    before = snapshot(seeded)
    over: list[Callable[[], object]] = [
        lambda: seeded.get([b"keep-1"] * (MAX_ENTRIES + 1)),
        lambda: seeded.put([(b"new", b"x")] * (MAX_ENTRIES + 1)),
        lambda: seeded.delete([b"keep-1"] * (MAX_ENTRIES + 1)),
        lambda: seeded.write(put=[(b"new", b"x")] * 64, delete=[b"keep-1"] * 65),
    ]
    for attempt in over:
        with pytest.raises(TooManyEntries) as info:
            attempt()
        assert_limit_error(
            info.value, TooManyEntries, "max_batch_entries", MAX_ENTRIES + 1, MAX_ENTRIES
        )
        assert snapshot(seeded) == before
    # Bytes too: eight full-size values sent for one key are eight values' bytes.
    with pytest.raises(BatchTooLarge) as info:
        seeded.put([(b"new", b"v" * MAX_VALUE)] * 8)
    assert info.value.actual == 8 * (len(b"new") + MAX_VALUE)
    assert snapshot(seeded) == before

    assert seeded.get([b"keep-1"] * MAX_ENTRIES) == [b"one"] * MAX_ENTRIES
    seeded.put([(b"new", b"%d" % i) for i in range(MAX_ENTRIES)])  # the last put wins
    last = b"%d" % (MAX_ENTRIES - 1)
    assert seeded.get([b"new"]) == [last]
    assert seeded.used_bytes() == before[1] + len(b"new") + len(last)
    seeded.delete([b"new"] * MAX_ENTRIES)  # refunded once
    assert snapshot(seeded) == before


def test_get_keys_boundary(filled: ActorKv) -> None:
    keys = [ORDERED_KEYS[i % len(ORDERED_KEYS)] for i in range(MAX_ENTRIES + 1)]
    assert filled.get(keys[:MAX_ENTRIES]) == [value_of(k) for k in keys[:MAX_ENTRIES]]
    with pytest.raises(TooManyEntries) as info:
        filled.get(keys)
    assert_limit_error(
        info.value, TooManyEntries, "max_batch_entries", MAX_ENTRIES + 1, MAX_ENTRIES
    )


def exact_batch(total: int, n: int = 8, prefix: bytes = b"key-") -> dict[bytes, bytes]:
    """`n` entries whose keys + values add up to exactly `total` bytes."""
    keys = [prefix + b"%02d" % i for i in range(n)]
    budget = total - sum(map(len, keys))
    sizes = [budget // n] * n
    sizes[-1] += budget - sum(sizes)
    assert max(sizes) <= MAX_VALUE
    return {k: bytes([65 + i]) * s for i, (k, s) in enumerate(zip(keys, sizes, strict=True))}


def test_batch_bytes_boundary(kv: ActorKv) -> None:
    exact = exact_batch(MAX_BATCH)
    assert charge(exact) == MAX_BATCH
    kv.put(exact)
    assert kv.used_bytes() == MAX_BATCH
    assert kv.get(list(exact)) == list(exact.values())

    over = exact_batch(MAX_BATCH + 1, prefix=b"new-")
    before = snapshot(kv)
    with pytest.raises(BatchTooLarge) as info:
        kv.put(over)
    assert_limit_error(info.value, BatchTooLarge, "max_batch_bytes", MAX_BATCH + 1, MAX_BATCH)
    assert snapshot(kv) == before


def test_batch_bytes_count_delete_keys(kv: ActorKv) -> None:
    deletes = [b"d" * 1000 + b"%04d" % i for i in range(20)]  # 20 * 1004 bytes
    delete_bytes = sum(map(len, deletes))
    kv.write(put=exact_batch(MAX_BATCH - delete_bytes), delete=deletes)
    before = snapshot(kv)
    with pytest.raises(BatchTooLarge) as info:
        kv.write(put=exact_batch(MAX_BATCH - delete_bytes + 1, prefix=b"new-"), delete=deletes)
    assert info.value.actual == MAX_BATCH + 1
    assert snapshot(kv) == before


@pytest.fixture
def quota_kv(open_store: OpenStore) -> ActorKv:
    return open_store(KvLimits(max_storage_bytes=100)).namespace("quota")


def test_quota_exactly_at_the_limit_is_allowed(quota_kv: ActorKv) -> None:
    quota_kv.put({b"a": b"x" * 29, b"b": b"y" * 29})
    quota_kv.put({b"c": b"z" * 39})
    assert quota_kv.used_bytes() == 100
    before = snapshot(quota_kv)
    with pytest.raises(StorageQuotaExceeded) as info:
        quota_kv.put({b"d": b""})
    assert_limit_error(info.value, StorageQuotaExceeded, "max_storage_bytes", 101, 100)
    assert snapshot(quota_kv) == before


def test_quota_one_byte_over_fails(quota_kv: ActorKv) -> None:
    with pytest.raises(StorageQuotaExceeded) as info:
        quota_kv.put({b"k": b"x" * 50, b"l": b"y" * 49})
    assert_limit_error(info.value, StorageQuotaExceeded, "max_storage_bytes", 101, 100)
    assert snapshot(quota_kv)[:2] == ([], 0)
    quota_kv.put({b"k": b"x" * 50, b"l": b"y" * 48})
    assert quota_kv.used_bytes() == 100


def test_quota_credits_overwrites(quota_kv: ActorKv) -> None:
    quota_kv.put({b"k": b"x" * 59, b"l": b"y" * 39})  # 100
    quota_kv.put({b"k": b"a" * 59})  # same size at the limit
    assert quota_kv.used_bytes() == 100
    quota_kv.put({b"k": b"b" * 49})  # smaller
    assert quota_kv.used_bytes() == 90
    quota_kv.put({b"k": b"c" * 59})  # grows back by exactly the room left
    assert quota_kv.used_bytes() == 100
    with pytest.raises(StorageQuotaExceeded):
        quota_kv.put({b"k": b"d" * 60})
    assert quota_kv.get([b"k"]) == [b"c" * 59]
    # Shrinking one entry pays for a new one in the same batch.
    quota_kv.put({b"k": b"e" * 49, b"m": b"f" * 9})
    assert quota_kv.used_bytes() == 100
    assert quota_kv.get([b"k", b"m"]) == [b"e" * 49, b"f" * 9]


def test_quota_refunds_deletes(quota_kv: ActorKv) -> None:
    quota_kv.put({b"k": b"x" * 59, b"l": b"y" * 39})
    quota_kv.delete([b"k", b"missing"])
    assert quota_kv.used_bytes() == 40
    quota_kv.put({b"n": b"z" * 59})
    assert quota_kv.used_bytes() == 100
    # A delete pays for a put in the same batch.
    quota_kv.write(put={b"o": b"w" * 39}, delete=[b"l"])
    assert quota_kv.used_bytes() == 100
    quota_kv.delete_range(b"a", b"o")
    assert quota_kv.used_bytes() == 40
    quota_kv.drop()
    assert quota_kv.used_bytes() == 0
    quota_kv.put({b"p": b"q" * 99})
    assert quota_kv.used_bytes() == 100


def test_quota_is_per_namespace(open_store: OpenStore) -> None:
    store = open_store(KvLimits(max_storage_bytes=100))
    a, b = store.namespace("a"), store.namespace("b")
    a.put({b"k": b"x" * 99})
    b.put({b"k": b"x" * 99})
    assert a.used_bytes() == b.used_bytes() == 100


def test_invalid_keys_are_rejected(kv: ActorKv) -> None:
    kv.put({b"a": b"1"})
    bad_calls: list[Callable[[], object]] = [
        lambda: kv.put({b"": b"v"}),
        lambda: kv.delete([b""]),
        lambda: kv.get([b""]),
        lambda: kv.put({"text": b"v"}),  # type: ignore[dict-item]
        lambda: kv.get(["text"]),  # type: ignore[list-item]
        lambda: kv.delete([1]),  # type: ignore[list-item]
        lambda: kv.write(put={b"a": b"2"}, delete=[b"a"]),
        lambda: kv.delete_range(None, b"z"),  # type: ignore[arg-type]
        lambda: kv.delete_range(b"a", None),  # type: ignore[arg-type]
    ]
    for call in bad_calls:
        with pytest.raises(InvalidKey):
            call()
    assert issubclass(InvalidKey, KvError)
    assert kv.list() == [(b"a", b"1")]
    assert kv.used_bytes() == 2


# --- fencing ---------------------------------------------------------------------------------


def test_takeover_increments_the_generation_by_exactly_one(kv: ActorKv) -> None:
    start = kv.generation()
    assert start >= 0
    assert [kv.takeover() for _ in range(3)] == [start + 1, start + 2, start + 3]
    assert kv.generation() == start + 3


def test_current_fence_is_accepted_everywhere(kv: ActorKv) -> None:
    gen = kv.takeover()
    kv.write(put={b"a": b"1", b"b": b"2", b"c": b"3"}, fence=gen)
    kv.delete([b"a"], fence=gen)
    kv.delete_range(b"b", b"c", fence=gen)
    assert kv.list() == [(b"c", b"3")]
    kv.drop(fence=gen)
    assert kv.list() == []
    assert kv.generation() == gen


@pytest.mark.parametrize("offset", [-1, +1])
def test_stale_fence_fails_and_changes_nothing(kv: ActorKv, offset: int) -> None:
    kv.takeover()
    gen = kv.takeover()
    kv.put({b"a": b"1", b"b": b"2", b"c": b"3"})
    before = snapshot(kv)
    stale = gen + offset
    attempts: list[Callable[[], object]] = [
        lambda: kv.write(put={b"d": b"4"}, delete=[b"a"], fence=stale),
        lambda: kv.put({b"a": b"changed"}, fence=stale),
        lambda: kv.delete([b"a"], fence=stale),
        lambda: kv.write(fence=stale),
        lambda: kv.delete_range(b"a", b"z", fence=stale),
        lambda: kv.drop(fence=stale),
    ]
    for attempt in attempts:
        with pytest.raises(FenceMismatch) as info:
            attempt()
        assert info.value.fence == stale
        assert info.value.current == gen
        assert snapshot(kv) == before


@pytest.mark.parametrize("fence", [True, False, -1, 2**63, 1.0, "1"])
def test_a_fence_that_is_not_a_generation_is_refused_before_any_round_trip(
    store: KvStore, fence: object
) -> None:
    """A fence is None or a generation, 0 to 2**63 - 1. PostgreSQL could not take a bool or a
    larger int (`KvUnavailable`) where the others compared it (`True` fenced generation 1)."""
    kv = store.namespace("a")
    kv.takeover()
    kv.put({b"a": b"1", b"b": b"2"})
    before = snapshot(kv)
    attempts: list[Callable[[], object]] = [
        lambda: kv.write(put={b"c": b"3"}, delete=[b"a"], fence=fence),  # type: ignore[arg-type]
        lambda: kv.put({b"a": b"changed"}, fence=fence),  # type: ignore[arg-type]
        lambda: kv.delete([b"a"], fence=fence),  # type: ignore[arg-type]
        lambda: kv.write(fence=fence),  # type: ignore[arg-type]
        lambda: kv.delete_range(b"a", b"z", fence=fence),  # type: ignore[arg-type]
        lambda: kv.drop(fence=fence),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgument, match="fence"):
            attempt()
    assert snapshot(kv) == before
    store.close()  # from here a round trip fails (KvUnavailable) on the stores that make one
    for attempt in attempts:
        with pytest.raises(InvalidArgument, match="fence"):
            attempt()


def test_unfenced_writes_are_allowed_after_takeover(kv: ActorKv) -> None:
    kv.takeover()
    kv.takeover()
    kv.put({b"a": b"1", b"b": b"2"})
    kv.delete([b"a"])
    kv.delete_range(b"a", b"c")
    kv.put({b"z": b"9"})
    assert kv.list() == [(b"z", b"9")]
    kv.drop()
    assert kv.list() == []


def test_takeover_through_another_handle_fences_the_first(store: KvStore) -> None:
    old_owner = store.namespace("actor")
    gen = old_owner.takeover()
    old_owner.put({b"a": b"1"}, fence=gen)
    new_owner = store.namespace("actor")
    assert new_owner.takeover() == gen + 1
    with pytest.raises(FenceMismatch):
        old_owner.put({b"a": b"stale"}, fence=gen)
    new_owner.put({b"a": b"fresh"}, fence=gen + 1)
    assert old_owner.get([b"a"]) == [b"fresh"]


def test_takeover_through_another_store_fences_the_first(
    persistent_open_store: OpenStore,
) -> None:
    first = persistent_open_store(location="shared").namespace("actor")
    second = persistent_open_store(location="shared").namespace("actor")
    gen = first.takeover()
    first.put({b"a": b"1"}, fence=gen)
    assert second.takeover() == gen + 1
    with pytest.raises(FenceMismatch):
        first.put({b"a": b"stale"}, fence=gen)
    assert second.get([b"a"]) == [b"1"]
    assert first.generation() == gen + 1


def test_concurrent_takeovers_each_get_a_distinct_generation(store: KvStore) -> None:
    kv = store.namespace("actor")
    start = kv.generation()
    results: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [kv.takeover() for _ in range(25)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(start + 1, start + 101))
    assert kv.generation() == start + 100


def test_concurrent_takeovers_through_two_stores_are_distinct(
    persistent_open_store: OpenStore,
) -> None:
    handles = [persistent_open_store(location="shared").namespace("actor") for _ in range(2)]
    start = handles[0].generation()
    results: list[int] = []
    lock = threading.Lock()

    def worker(kv: ActorKv) -> None:
        mine = [kv.takeover() for _ in range(20)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker, args=(handles[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(start + 1, start + 81))
    assert handles[0].generation() == handles[1].generation() == start + 80


# --- drop, delete_range ----------------------------------------------------------------------


def test_drop_removes_everything_and_keeps_the_generation(filled: ActorKv) -> None:
    filled.takeover()
    gen = filled.takeover()
    assert filled.used_bytes() > 0
    filled.drop()
    assert filled.list() == []
    assert filled.get(ORDERED_KEYS[:5]) == [None] * 5
    assert filled.used_bytes() == 0
    assert filled.generation() == gen
    assert filled.takeover() == gen + 1
    filled.put({b"again": b"1"})
    assert filled.list() == [(b"again", b"1")]
    assert filled.used_bytes() == 6


def test_drop_of_an_empty_namespace(kv: ActorKv) -> None:
    kv.drop()
    assert kv.list() == []
    assert kv.used_bytes() == 0


def test_delete_range_is_exact_at_its_boundaries(filled: ActorKv) -> None:
    filled.delete_range(b"a\x00", b"a\x80")
    expected = [k for k in ORDERED_KEYS if not (b"a\x00" <= k < b"a\x80")]
    assert [k for k, _ in filled.list()] == expected
    assert b"a" in expected and b"a\x80" in expected  # both neighbours survived
    assert filled.used_bytes() == charge({k: value_of(k) for k in expected})

    filled.delete_range(b"\xff", b"\xff\xff")
    expected = [k for k in expected if not (b"\xff" <= k < b"\xff\xff")]
    assert [k for k, _ in filled.list()] == expected
    assert b"\xff\xff" in expected and b"\xfe\xff" in expected
    assert filled.used_bytes() == charge({k: value_of(k) for k in expected})


def test_delete_range_with_bounds_that_are_not_keys(filled: ActorKv) -> None:
    filled.delete_range(b"\x00\x01", b"\x02")
    assert [k for k, _ in filled.list(end=b"A")] == [b"\x00", b"\x00\x00"]


def test_empty_delete_ranges_delete_nothing(filled: ActorKv) -> None:
    before = snapshot(filled)
    filled.delete_range(b"a", b"a")
    filled.delete_range(b"b", b"a")
    filled.delete_range(b"a\x00\x00\x01", b"a\x01")
    assert snapshot(filled) == before


def test_delete_range_is_not_bounded_by_the_batch_limit(kv: ActorKv) -> None:
    for chunk in range(3):
        kv.put({b"r%04d" % (chunk * 100 + i): b"v" for i in range(100)})
    kv.put({b"s": b"v", b"q": b"v"})
    kv.delete_range(b"r", b"s")
    assert kv.list() == [(b"q", b"v"), (b"s", b"v")]
    assert kv.used_bytes() == 4


# --- namespaces, reopening, URLs -------------------------------------------------------------


def test_namespaces_are_isolated(store: KvStore) -> None:
    a, b = store.namespace("a"), store.namespace("b")
    a.put({b"k": b"a-value", b"only-a": b"1"})
    b.put({b"k": b"b-value"})
    gen_b = b.generation()
    assert a.takeover() == a.generation()
    assert b.generation() == gen_b
    assert a.get([b"k", b"only-a"]) == [b"a-value", b"1"]
    assert b.get([b"k", b"only-a"]) == [b"b-value", None]
    assert b.list() == [(b"k", b"b-value")]
    assert b.used_bytes() == 8
    a.delete_range(b"a", b"z")
    assert b.list() == [(b"k", b"b-value")]
    a.put({b"k": b"again"})
    a.drop()
    assert b.list() == [(b"k", b"b-value")]
    assert b.used_bytes() == 8
    assert store.namespace("c").list() == []


def test_two_handles_of_one_namespace_share_it(store: KvStore) -> None:
    first = store.namespace("actor")
    first.put({b"k": b"v"})
    gen = first.takeover()
    second = store.namespace("actor")
    assert second.list() == [(b"k", b"v")]
    assert second.generation() == gen
    assert second.used_bytes() == 2


def test_data_persists_across_reopen(persistent_open_store: OpenStore) -> None:
    open_store = persistent_open_store
    store = open_store(KvLimits(max_storage_bytes=1000), location="persist")
    kv = store.namespace("actor")
    kv.put({b"\x00": b"zero", b"\xff": b"ff", b"k": b"v" * 100})
    kv.delete([b"k"])
    gen = kv.takeover()
    kv.put({b"after": b"takeover"}, fence=gen)
    other = store.namespace("other")
    other.put({b"o": b"1"})
    other.drop()
    store.close()

    reopened = open_store(KvLimits(max_storage_bytes=1000), location="persist")
    kv = reopened.namespace("actor")
    assert kv.list() == [(b"\x00", b"zero"), (b"after", b"takeover"), (b"\xff", b"ff")]
    assert kv.generation() == gen
    assert kv.used_bytes() == 1 + 4 + 5 + 8 + 1 + 2
    assert kv.takeover() == gen + 1
    assert reopened.namespace("other").list() == []
    assert reopened.namespace("other").used_bytes() == 0


def incompressible_name(size: int, seed: int = 5) -> str:
    """A name of exactly `size` UTF-8 bytes of random 3-byte characters (PostgreSQL compresses a
    repetitive one, which would hide the size its index must hold)."""
    rnd = random.Random(seed)
    chars = [chr(rnd.randrange(0x4E00, 0xA000)) for _ in range(size // 3)]
    return "".join(chars) + "x" * (size % 3)


GOOD_NAMES = [
    "a",
    "A",
    " ",
    "_x",
    "a/b",
    "counter/room%201",
    "\x01\x7f",
    "a\u0301",  # "á" decomposed, a name of its own ...
    "\u00e1",  # ... and composed
    "\U0001f600",
    "x" * 2048,
    "\u00e9" * 1024,
    incompressible_name(2048),
]


def test_every_backend_keeps_the_same_namespace_names_apart(store: KvStore) -> None:
    for name in GOOD_NAMES:
        store.namespace(name).put({b"name": name.encode()})
    for name in GOOD_NAMES:
        assert store.namespace(name).get([b"name"]) == [name.encode()]
    # In code point order everywhere (PostgreSQL sorted by the database's collation).
    assert store.actor_ids() == sorted(GOOD_NAMES)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", InvalidArgument),
        ("a\x00b", InvalidArgument),  # PostgreSQL's text cannot hold NUL
        ("a\udcffb", InvalidArgument),  # a lone surrogate: no UTF-8 form
        (b"bytes", InvalidArgument),
        (42, InvalidArgument),
        (None, InvalidArgument),
        ("x" * 2049, NameTooLarge),
        ("\u00e9" * 1024 + "x", NameTooLarge),
        (incompressible_name(2800), NameTooLarge),  # beyond what PostgreSQL can index
    ],
)
def test_a_namespace_name_outside_the_contract_is_refused_and_creates_nothing(
    store: KvStore, name: object, error: type[KvError]
) -> None:
    store.namespace("existing")
    with pytest.raises(error, match="namespace name") as info:
        store.namespace(name)  # type: ignore[arg-type]
    if isinstance(info.value, NameTooLarge):
        size = len(name.encode())  # type: ignore[union-attr]
        assert_limit_error(info.value, NameTooLarge, "max_name_bytes", size, 2048)
    assert store.actor_ids() == ["existing"]  # type: ignore[attr-defined]


def test_store_applies_the_name_limit_it_was_opened_with(open_store: OpenStore) -> None:
    store = open_store(KvLimits(max_name_bytes=8))
    store.namespace("x" * 8)
    store.namespace("\u00e9" * 4)
    for name in ("x" * 9, "\u00e9" * 4 + "x"):
        with pytest.raises(NameTooLarge) as info:
            store.namespace(name)
        assert_limit_error(info.value, NameTooLarge, "max_name_bytes", 9, 8)
    assert store.actor_ids() == sorted(["x" * 8, "\u00e9" * 4])  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", ["max_key_bytes", "max_name_bytes"])
def test_a_store_holds_what_its_limits_allow_or_refuses_them_at_open(
    open_store: OpenStore, limit: str
) -> None:
    """PostgreSQL's indexes hold keys and names of about 2.6 KiB: opened with larger limits, it
    accepted them and then failed each write of a long key (`KvUnavailable`, retried in vain)."""
    size = 4096
    try:
        store = open_store(KvLimits(**{limit: size}))
    except ValueError as e:
        assert limit in str(e)
        return
    key = random.Random(3).randbytes(size) if limit == "max_key_bytes" else b"k"
    name = incompressible_name(size) if limit == "max_name_bytes" else "a"
    store.namespace(name).put({key: b"v"})
    assert store.namespace(name).list() == [(key, b"v")]


@pytest.mark.parametrize("url", ["redis://localhost/0", "s3://bucket/dir"])
def test_unknown_url_scheme_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="scheme"):
        open_kv(url)


@pytest.mark.parametrize("url", ["memory://?bogus=1", "memory://?latency_ms=-1", "file:"])
def test_malformed_urls_are_value_errors(url: str) -> None:
    with pytest.raises(ValueError):
        open_kv(url)


def test_memory_url_latency_is_slept_once_per_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(pagekv.kv.memory.time, "sleep", slept.append)
    kv = open_kv("memory://?latency_ms=5").namespace("a")
    kv.put({b"a": b"1"})
    kv.get([b"a"])
    kv.list()
    kv.delete_range(b"a", b"b")
    kv.takeover()
    kv.drop()
    assert slept == [0.005] * 6

    slept.clear()
    plain = open_kv("memory://").namespace("a")
    plain.put({b"a": b"1"})
    plain.get([b"a"])
    assert slept == []


def test_memory_stores_are_independent() -> None:
    first = open_kv("memory://")
    first.namespace("a").put({b"k": b"v"})
    assert open_kv("memory://").namespace("a").list() == []
    first.close()


def test_file_urls_absolute_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = tmp_path / "abs"
    store = open_kv(f"file://{absolute}")
    store.namespace("a").put({b"k": b"abs"})
    store.close()
    assert absolute.is_dir()

    monkeypatch.chdir(tmp_path)
    store = open_kv("file:./rel/dir")
    store.namespace("a").put({b"k": b"rel"})
    store.close()
    assert (tmp_path / "rel" / "dir").is_dir()

    for url, value in [(absolute.as_uri(), b"abs"), (f"file://{tmp_path}/rel/dir", b"rel")]:
        store = open_kv(url)
        assert store.namespace("a").get([b"k"]) == [value]
        store.close()
