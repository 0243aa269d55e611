"""Contract clauses of limits: every batch atomic under each kind of rejected entry, every limit
at its boundary (as advertised by the namespace), the exact quota with its overwrite credit and
its refunds, and the keys no backend may take.

A limit error is a `LimitError` of the limit's own class, with `limit` naming the `KvLimits`
field, `actual` what the request asked for (each repeat counted) and `allowed` the limit; a
request refused for any reason writes nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pagekv.kv import (
    BatchTooLarge,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvLimits,
    LimitError,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
)
from pagekv.testing.clauses import NotChecked, Trial, clause
from pagekv.testing.contract_data import (
    ORDERED_KEYS,
    at_least,
    boundary,
    filled,
    fresh,
    put_all,
    takes_small,
    value_of,
)
from pagekv.testing.subject import Probe


def limit_error(
    t: Trial, error: BaseException, kind: type[LimitError], actual: int, allowed: int, what: str
) -> None:
    """`error` is `kind` saying `actual` exceeds `allowed`, in its fields and its message."""
    got: tuple[object, ...] = (type(error).__name__, getattr(error, "limit", None))
    got += (getattr(error, "actual", None), getattr(error, "allowed", None))
    t.expect(
        got,
        (kind.__name__, kind.limit, actual, allowed),
        f"{what} raises {kind.__name__} with limit={kind.limit!r}, actual={actual}, "
        f"allowed={allowed}",
    )
    message = str(error)
    t.check(
        all(str(part) in message for part in (kind.limit, actual, allowed)),
        f"the message of the {kind.__name__} names {kind.limit}, {actual} and {allowed}",
        message,
    )


def _seeded(t: Trial) -> Probe:
    kv = fresh(t)
    kv.put({b"keep-1": b"one", b"keep-2": b"two", b"keep-3": b"three"})
    return kv


Batch = tuple[str, dict[object, object], list[object], type[KvError]]


def _rejected_batches(limits: KvLimits) -> list[Batch]:
    """Batches each breaking one rule with their last entry, after entries that alone would be
    written: a backend applying a batch entry by entry leaves those behind."""
    over_key = b"k" * (limits.max_key_bytes + 1)
    value = b"v" * limits.max_value_bytes
    entries = limits.max_batch_entries
    full = limits.max_batch_bytes // (len(b"new-0") + len(value)) + 1
    batches: list[Batch] = [
        (
            f"a value of max_value_bytes + 1 ({len(value) + 1}) bytes",
            {b"new": b"x", b"keep-1": b"changed", b"big": value + b"v"},
            [],
            ValueTooLarge,
        ),
        (
            f"a put key of max_key_bytes + 1 ({len(over_key)}) bytes",
            {b"new": b"x", over_key: b"v"},
            [b"keep-2"],
            KeyTooLarge,
        ),
        (
            f"a delete key of max_key_bytes + 1 ({len(over_key)}) bytes",
            {b"new": b"x"},
            [b"keep-1", over_key],
            KeyTooLarge,
        ),
        (
            f"max_batch_entries ({entries}) puts and one delete",
            {b"new-%d" % i: b"x" for i in range(entries)},
            [b"keep-1"],
            TooManyEntries,
        ),
        (
            "an empty key",
            {b"new": b"x", b"": b"empty key"},
            [b"keep-1"],
            InvalidKey,
        ),
        (
            "a key both put and deleted",
            {b"new": b"x", b"keep-1": b"put and deleted"},
            [b"keep-1"],
            InvalidKey,
        ),
        ("a str key", {b"new": b"x", "str key": b"v"}, [], InvalidKey),
        ("a str value", {b"new": "str value"}, [b"keep-1"], InvalidKey),
    ]
    if full + 1 <= entries:  # else no batch of full values passes the entry limit
        batches.append(
            (
                f"{full} full values: over max_batch_bytes ({limits.max_batch_bytes})",
                {b"new-%d" % i: value for i in range(full)},
                [b"keep-1"],
                BatchTooLarge,
            )
        )
    return batches


@clause(
    "a write with any rejected entry (over a limit, an invalid key or value, a key both put and "
    "deleted) raises and writes nothing: none of its puts or deletes, no change of used_bytes"
)
def a_batch_with_a_rejected_entry_writes_nothing(t: Trial) -> None:
    kv = _seeded(t)
    limits = boundary(
        t, kv, "max_key_bytes", "max_value_bytes", "max_batch_entries", "max_batch_bytes"
    )
    before = t.snapshot(kv)
    for what, put, delete, error in _rejected_batches(limits):
        requires = f"a write with {what} raises {error.__name__}"
        with t.raises(error, requires=requires):
            kv.write(put=put, delete=delete)
        t.unchanged(kv, before, f"{requires} and writes none of its entries")


@clause("a write that would take used_bytes() over max_storage_bytes raises and writes nothing")
def a_batch_over_quota_writes_nothing(t: Trial) -> None:
    kv = fresh(t, max_storage_bytes=50)
    kv.put({b"k1": b"x" * 18, b"k2": b"y" * 18})
    before = t.snapshot(kv)
    requires = (
        "at 40 of 50 bytes, a write deleting k1 (-20) and adding n1, n2 (+31) raises "
        "StorageQuotaExceeded (51 > 50)"
    )
    with t.raises(StorageQuotaExceeded, requires=requires):
        kv.write(put={b"k2": b"z" * 18, b"n1": b"a" * 9, b"n2": b"b" * 18}, delete=[b"k1"])
    t.unchanged(kv, before, f"{requires} and writes none of its entries")


@clause("a namespace made with limits= applies those limits, not its defaults")
def a_store_applies_the_limits_it_was_opened_with(t: Trial) -> None:
    kv = fresh(t, max_key_bytes=10)
    kv.put({b"k" * 10: b"v"})
    with t.raises(
        KeyTooLarge, requires="with max_key_bytes=10, a put of an 11-byte key raises KeyTooLarge"
    ) as caught:
        kv.put({b"k" * 11: b"v"})
    limit_error(t, caught[0], KeyTooLarge, 11, 10, "a put of an 11-byte key")


@clause(
    "a key of max_key_bytes is taken by every operation; one byte more is refused by each "
    "(put, delete, get, list prefix/start/end, delete_range start/end) with KeyTooLarge"
)
def key_size_boundary(t: Trial) -> None:
    kv = t.namespace()
    size = boundary(t, kv, "max_key_bytes").max_key_bytes
    at_least(t.limits(kv), max_batch_bytes=size + 1, max_storage_bytes=size + 1)
    ok, over = b"k" * size, b"k" * (size + 1)
    above = ok[:-1] + b"l"
    kv.put({ok: b"v"})
    t.expect(kv.get([ok]), [b"v"], f"get() of a key of max_key_bytes ({size}) finds it")
    t.expect(kv.list(prefix=ok), [(ok, b"v")], f"list(prefix=a key of {size} bytes) finds it")
    t.expect(
        kv.list(start=ok, end=above),
        [(ok, b"v")],
        f"list(start=, end=) with bounds of {size} bytes finds the key",
    )
    kv.delete_range(ok, above)
    t.expect(kv.get([ok]), [None], f"delete_range() with bounds of {size} bytes deletes the key")
    kv.put({ok: b"v"})
    kv.delete([ok])
    t.expect(kv.list(), [], f"delete() of a key of {size} bytes deletes it")
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("put", lambda: kv.put({over: b"v"})),
        ("delete", lambda: kv.delete([over])),
        ("get", lambda: kv.get([over])),
        ("list(prefix=)", lambda: kv.list(prefix=over)),
        ("list(start=)", lambda: kv.list(start=over)),
        ("list(end=)", lambda: kv.list(end=over)),
        ("delete_range(end)", lambda: kv.delete_range(b"a", over)),
        ("delete_range(start)", lambda: kv.delete_range(over, b"z")),
    ]
    for what, attempt in attempts:
        requires = f"{what} of a key of max_key_bytes + 1 ({size + 1}) bytes"
        with t.raises(KeyTooLarge, requires=f"{requires} raises KeyTooLarge") as caught:
            attempt()
        limit_error(t, caught[0], KeyTooLarge, size + 1, size, requires)
    t.expect(kv.used_bytes(), 0, "refused keys are charged nothing: used_bytes() is 0")


@clause(
    "a value of max_value_bytes is stored and read back whole; one byte more is refused with "
    "ValueTooLarge"
)
def value_size_boundary(t: Trial) -> None:
    kv = t.namespace()
    limits = boundary(t, kv, "max_value_bytes")
    size = limits.max_value_bytes
    fits = len(b"k") + size <= min(limits.max_batch_bytes, limits.max_storage_bytes)
    if fits:  # keys of one byte: any max_key_bytes takes them
        kv.put({b"k": b"v" * size})
        stored = t.calls[-1]
        t.expect(
            kv.get([b"k"]),
            [b"v" * size],
            f"get() returns a value of max_value_bytes ({size}) whole",
            by=stored,
        )
    with t.raises(
        ValueTooLarge, requires=f"a put of a value of {size + 1} bytes raises ValueTooLarge"
    ) as caught:
        kv.put({b"o": b"v" * (size + 1)})
    limit_error(t, caught[0], ValueTooLarge, size + 1, size, f"a put of {size + 1} bytes")
    t.expect(kv.get([b"o"]), [None], "a refused value is not stored")
    if not fits:
        raise NotChecked(
            f"a value of max_value_bytes ({size}) and its key do not fit max_batch_bytes "
            f"({limits.max_batch_bytes}) and max_storage_bytes ({limits.max_storage_bytes}); "
            "only the refusal of one byte more was checked"
        )
    t.expect(kv.used_bytes(), 1 + size, "used_bytes() counts only the value stored")


@clause(
    "a write of max_batch_entries puts and deletes (counted together) is applied; one more "
    "raises TooManyEntries and writes nothing"
)
def batch_entries_boundary(t: Trial) -> None:
    kv = t.namespace()
    n = boundary(t, kv, "max_batch_entries").max_batch_entries
    keys = [b"k%05d" % i for i in range(n + 1)]
    at_least(t.limits(kv), max_key_bytes=6, max_batch_bytes=7 * n, max_storage_bytes=7 * n)
    half = n // 2
    kv.put({k: b"v" for k in keys[:n]})
    t.expect(kv.list(), [(k, b"v") for k in keys[:n]], f"a put of {n} entries stores them all")
    before = t.snapshot(kv)
    with t.raises(
        TooManyEntries, requires=f"a put of max_batch_entries + 1 ({n + 1}) entries raises"
    ) as caught:
        kv.put({k: b"w" for k in keys})
    limit_error(t, caught[0], TooManyEntries, n + 1, n, f"a put of {n + 1} entries")
    t.unchanged(kv, before, f"a put of {n + 1} entries writes nothing")
    with t.raises(
        TooManyEntries,
        requires=f"a write of {half} puts and {n + 1 - half} deletes raises TooManyEntries: puts "
        "and deletes count together",
    ) as caught:
        kv.write(put={k: b"w" for k in keys[:half]}, delete=keys[half:])
    limit_error(t, caught[0], TooManyEntries, n + 1, n, f"{half} puts and {n + 1 - half} deletes")
    t.unchanged(kv, before, "a write of too many puts and deletes writes nothing")
    with t.raises(TooManyEntries, requires=f"a delete of {n + 1} keys raises TooManyEntries"):
        kv.delete(keys)
    t.unchanged(kv, before, f"a delete of {n + 1} keys deletes nothing")
    kv.write(put={k: b"w" for k in keys[:half]}, delete=keys[half:n])
    t.expect(
        kv.list(),
        [(k, b"w") for k in keys[:half]],
        f"a write of {half} puts and {n - half} deletes applies them all",
    )


@clause(
    "limits count a request as sent: a key repeated in one get, put or delete counts each time "
    "(in entries and bytes), though it is read, stored or deleted once (the last put wins)"
)
def repeated_keys_count_against_the_batch_limits_as_sent(t: Trial) -> None:
    kv = _seeded(t)
    limits = boundary(t, kv, "max_batch_entries", "max_value_bytes", "max_batch_bytes")
    n = limits.max_batch_entries
    last = b"%d" % (n - 1)
    at_least(limits, max_batch_bytes=n * (len(b"new") + len(last)))
    before = t.snapshot(kv)
    over: list[tuple[str, Callable[[], object]]] = [
        (f"get of one key {n + 1} times", lambda: kv.get([b"keep-1"] * (n + 1))),
        (f"put of one key {n + 1} times", lambda: kv.put([(b"new", b"x")] * (n + 1))),
        (f"delete of one key {n + 1} times", lambda: kv.delete([b"keep-1"] * (n + 1))),
        (
            f"write putting one key {n // 2} times and deleting another {n + 1 - n // 2} times",
            lambda: kv.write(
                put=[(b"new", b"x")] * (n // 2), delete=[b"keep-1"] * (n + 1 - n // 2)
            ),
        ),
    ]
    for what, attempt in over:
        with t.raises(TooManyEntries, requires=f"a {what} raises TooManyEntries") as caught:
            attempt()
        limit_error(t, caught[0], TooManyEntries, n + 1, n, f"a {what}")
        t.unchanged(kv, before, f"a {what} writes nothing")
    full = limits.max_batch_bytes // (len(b"new") + limits.max_value_bytes) + 1
    if full <= n:
        value = b"v" * limits.max_value_bytes
        with t.raises(
            BatchTooLarge,
            requires=f"a put of one key with a full value {full} times raises BatchTooLarge",
        ) as caught:
            kv.put([(b"new", value)] * full)
        sent = full * (len(b"new") + len(value))
        limit_error(
            t, caught[0], BatchTooLarge, sent, limits.max_batch_bytes, f"{full} full values"
        )
        t.unchanged(kv, before, f"a put of {full} full values for one key writes nothing")
    t.expect(
        kv.get([b"keep-1"] * n),
        [b"one"] * n,
        f"a get of one key {n} times returns its value {n} times",
    )
    kv.put([(b"new", b"%d" % i) for i in range(n)])
    t.expect(kv.get([b"new"]), [last], f"of one key put {n} times in a batch, the last put wins")
    t.expect(
        kv.used_bytes(),
        before[1] + len(b"new") + len(last),
        "a key put many times in one batch is charged once, for its last value",
    )
    kv.delete([b"new"] * n)
    t.unchanged(kv, before, f"a delete of one key {n} times deletes it and refunds it once")


@clause("a get of max_batch_entries keys is answered; one key more raises TooManyEntries")
def get_keys_boundary(t: Trial) -> None:
    kv = filled(t)
    n = boundary(t, kv, "max_batch_entries").max_batch_entries
    keys = [ORDERED_KEYS[i % len(ORDERED_KEYS)] for i in range(n + 1)]
    t.expect(
        kv.get(keys[:n]),
        [value_of(k) for k in keys[:n]],
        f"a get of max_batch_entries ({n}) keys returns each value",
    )
    with t.raises(
        TooManyEntries, requires=f"a get of {n + 1} keys raises TooManyEntries"
    ) as caught:
        kv.get(keys)
    limit_error(t, caught[0], TooManyEntries, n + 1, n, f"a get of {n + 1} keys")


def _exact_batch(
    limits: KvLimits, total: int, prefix: bytes, entries: int
) -> dict[bytes, bytes] | None:
    """Entries whose keys and values add up to exactly `total` bytes, each value within the
    limit, as few as that allows (8 at least, where `entries` allows); None when `total` bytes
    cannot be written in `entries` entries."""
    width = len(prefix) + 4
    n = max(1, min(8, entries), -(-total // (width + limits.max_value_bytes)))
    budget = total - n * width
    if n > entries or budget < 0:
        return None
    keys = [prefix + b"%04d" % i for i in range(n)]
    sizes = [budget // n + (i < budget % n) for i in range(n)]
    return {k: bytes([65 + i % 26]) * s for i, (k, s) in enumerate(zip(keys, sizes, strict=True))}


def _only_refused(limits: KvLimits, size: int, what: str) -> NotChecked:
    """The acceptance half of a batch-bytes clause cannot run: `size` bytes of puts are over
    the quota. The refusal half has been checked by then."""
    return NotChecked(
        f"{what} puts {size} bytes, over max_storage_bytes ({limits.max_storage_bytes}); only "
        "the refusal of one byte more was checked"
    )


@clause(
    "a write of exactly max_batch_bytes (keys plus values) is applied; one byte more raises "
    "BatchTooLarge and writes nothing"
)
def batch_bytes_boundary(t: Trial) -> None:
    kv = t.namespace()
    limits = boundary(t, kv, "max_batch_bytes", "max_batch_entries")
    at_least(limits, max_key_bytes=8)
    size, entries = limits.max_batch_bytes, limits.max_batch_entries
    over = _exact_batch(limits, size + 1, b"new-", entries)
    if over is None:
        raise NotChecked(
            f"{size + 1} bytes need more than max_batch_entries ({entries}) values of "
            f"max_value_bytes ({limits.max_value_bytes})"
        )
    before = t.snapshot(kv)
    with t.raises(
        BatchTooLarge, requires=f"a put of {size + 1} bytes raises BatchTooLarge"
    ) as caught:
        kv.put(over)
    limit_error(t, caught[0], BatchTooLarge, size + 1, size, f"a put of {size + 1} bytes")
    t.unchanged(kv, before, f"a put of {size + 1} bytes writes nothing")
    exact = _exact_batch(limits, size, b"key-", entries)
    assert exact is not None  # fewer bytes than `over`
    if size > limits.max_storage_bytes:
        raise _only_refused(limits, size, f"a write of max_batch_bytes ({size})")
    kv.put(exact)
    stored = kv.last()
    t.expect(
        kv.used_bytes(),
        size,
        f"a put of exactly max_batch_bytes ({size}) stores it all",
        by=stored,
    )
    t.expect(
        kv.get(list(exact)), list(exact.values()), "each value of the batch reads back", by=stored
    )


def _deletes_and_puts(
    limits: KvLimits, total: int
) -> tuple[list[bytes], dict[bytes, bytes]] | None:
    """Up to 20 delete keys of up to 1,004 bytes, and puts making `total` bytes with them, in
    one batch: the most deletes that leave the puts enough entries."""
    width = min(1004, limits.max_key_bytes)
    for n in range(min(20, limits.max_batch_entries - 1), 0, -1):
        deletes = [b"d" * (width - 4) + b"%04d" % i for i in range(n)]
        puts = _exact_batch(
            limits, total - sum(map(len, deletes)), b"new-", limits.max_batch_entries - n
        )
        if puts is not None:
            return deletes, puts
    return None


@clause("the keys of a write's deletes count against max_batch_bytes with its puts")
def batch_bytes_count_delete_keys(t: Trial) -> None:
    kv = t.namespace()
    limits = boundary(t, kv, "max_batch_bytes", "max_batch_entries", "max_key_bytes")
    at_least(limits, max_key_bytes=8, max_batch_entries=2)
    size = limits.max_batch_bytes
    over = _deletes_and_puts(limits, size + 1)
    if over is None:
        raise NotChecked(
            f"{size + 1} bytes of deletes and puts need more than max_batch_entries "
            f"({limits.max_batch_entries})"
        )
    deletes, puts = over
    delete_bytes = sum(map(len, deletes))
    before = t.snapshot(kv)
    requires = (
        f"a write of {len(deletes)} deletes of {delete_bytes} bytes and puts of "
        f"{size + 1 - delete_bytes} ({size + 1} in all)"
    )
    with t.raises(BatchTooLarge, requires=f"{requires} raises BatchTooLarge") as caught:
        kv.write(put=puts, delete=deletes)
    limit_error(t, caught[0], BatchTooLarge, size + 1, size, requires)
    t.unchanged(kv, before, f"{requires} writes nothing")
    exact = _exact_batch(
        limits, size - delete_bytes, b"key-", limits.max_batch_entries - len(deletes)
    )
    assert exact is not None  # one byte fewer than `puts`
    if size - delete_bytes > limits.max_storage_bytes:
        raise _only_refused(limits, size - delete_bytes, f"a write of {size} bytes with deletes")
    kv.write(put=exact, delete=deletes)
    wrote = kv.last()
    t.expect(
        kv.used_bytes(),
        size - delete_bytes,
        f"a write of {len(deletes)} deletes and puts of {size} bytes in all is applied",
        by=wrote,
    )


# --- quota -----------------------------------------------------------------------------------

QUOTA: Final = {"max_storage_bytes": 100}
"""Small enough that every quota boundary is a few short entries away."""


@clause(
    "writes up to exactly max_storage_bytes are allowed; any write past it, even of one byte, "
    "raises StorageQuotaExceeded and writes nothing"
)
def quota_exactly_at_the_limit_is_allowed(t: Trial) -> None:
    kv = fresh(t, **QUOTA)
    kv.put({b"a": b"x" * 29, b"b": b"y" * 29})
    kv.put({b"c": b"z" * 39})
    _used(t, kv, 100, "puts of 60 and 40 bytes fill a quota of 100 exactly")
    before = t.snapshot(kv)
    with t.raises(
        StorageQuotaExceeded, requires="at 100 of 100 bytes, a put of 1 byte raises"
    ) as caught:
        kv.put({b"d": b""})
    limit_error(t, caught[0], StorageQuotaExceeded, 101, 100, "a put to 101 of 100 bytes")
    t.unchanged(kv, before, "a put over the quota writes nothing")


@clause("a first write one byte over max_storage_bytes is refused; one byte less is allowed")
def quota_one_byte_over_fails(t: Trial) -> None:
    kv = fresh(t, **QUOTA)
    with t.raises(
        StorageQuotaExceeded, requires="a put of 101 bytes into a quota of 100 raises"
    ) as caught:
        kv.put({b"k": b"x" * 50, b"l": b"y" * 49})
    refused = t.calls[-1]
    limit_error(t, caught[0], StorageQuotaExceeded, 101, 100, "a put of 101 bytes")
    t.expect(kv.list(), [], "a put over the quota writes none of its entries", by=refused)
    t.expect(kv.used_bytes(), 0, "a put over the quota is charged nothing", by=refused)
    kv.put({b"k": b"x" * 50, b"l": b"y" * 48})
    _used(t, kv, 100, "a put of exactly the quota is allowed")


def _used(t: Trial, kv: Probe, want: int, requires: str) -> None:
    """`used_bytes()` is `want` after the write just made, which a report names."""
    wrote = t.calls[-1]
    t.expect(kv.used_bytes(), want, requires, by=wrote)


@clause(
    "an overwrite is charged only the difference between the new and the old value's size, so "
    "at the quota a same-size or smaller overwrite, or one growing into the room left, succeeds"
)
def quota_credits_overwrites(t: Trial) -> None:
    kv = fresh(t, **QUOTA)
    kv.put({b"k": b"x" * 59, b"l": b"y" * 39})
    kv.put({b"k": b"a" * 59})
    _used(t, kv, 100, "at the quota, an overwrite of the same size is allowed")
    kv.put({b"k": b"b" * 49})
    _used(t, kv, 90, "an overwrite 10 bytes smaller refunds 10 bytes")
    kv.put({b"k": b"c" * 59})
    _used(t, kv, 100, "an overwrite growing by the 10 bytes left is allowed")
    with t.raises(
        StorageQuotaExceeded, requires="at the quota, an overwrite growing by 1 byte raises"
    ):
        kv.put({b"k": b"d" * 60})
    refused = t.calls[-1]
    t.expect(kv.get([b"k"]), [b"c" * 59], "a refused overwrite leaves the old value", by=refused)
    kv.put({b"k": b"e" * 49, b"m": b"f" * 9})
    wrote = t.calls[-1]
    _used(t, kv, 100, "at the quota, shrinking one entry pays for a new one in one batch")
    t.expect(
        kv.get([b"k", b"m"]),
        [b"e" * 49, b"f" * 9],
        "both entries of that batch are stored",
        by=wrote,
    )


@clause(
    "a delete refunds its entries' bytes (a missing key refunds nothing), also to a put in the "
    "same write"
)
def quota_refunds_deletes(t: Trial) -> None:
    kv = fresh(t, **QUOTA)
    kv.put({b"k": b"x" * 59, b"l": b"y" * 39})
    kv.delete([b"k", b"missing"])
    _used(t, kv, 40, "deleting a 60-byte entry and a missing key refunds 60")
    kv.put({b"n": b"z" * 59})
    _used(t, kv, 100, "the refunded bytes can be written again, up to the quota")
    kv.write(put={b"o": b"w" * 39}, delete=[b"l"])
    _used(t, kv, 100, "at the quota, a delete pays for a put in the same write")


@clause("delete_range and drop refund the bytes of the entries they delete")
def quota_refunds_delete_range_and_drop(t: Trial) -> None:
    kv = fresh(t, **QUOTA)
    kv.put({b"k": b"x" * 59, b"l": b"y" * 39})
    kv.delete_range(b"a", b"l")
    _used(t, kv, 40, "delete_range(b'a', b'l') refunds the 60 bytes of b'k'")
    kv.put({b"n": b"z" * 59})
    _used(t, kv, 100, "bytes refunded by delete_range can be written again")
    kv.drop()
    dropped = t.calls[-1]
    _used(t, kv, 0, "drop() refunds every byte")
    t.expect(kv.get([b"l", b"n"]), [None, None], "drop() deletes every entry", by=dropped)
    kv.put({b"p": b"q" * 99})
    _used(t, kv, 100, "after drop() the whole quota can be written again")


@clause("max_storage_bytes is per namespace: two namespaces of one store may each fill it")
def quota_is_per_namespace(t: Trial) -> None:
    store = t.store(None, **QUOTA)
    a, b = (takes_small(t, t.handle(store, name), *QUOTA) for name in ("a", "b"))
    a.put({b"k": b"x" * 99})
    _used(t, a, 100, "'a' holds its 100 bytes")
    b.put({b"k": b"x" * 99})
    _used(t, b, 100, "'b' holds 100 bytes of its own beside the 100 of 'a'")


@clause(
    "empty keys and keys or bounds that are not bytes-like raise InvalidKey, as does a key both "
    "put and deleted in one write; nothing is written"
)
def invalid_keys_are_rejected(t: Trial) -> None:
    kv = fresh(t)
    kv.put({b"a": b"1"})
    before = t.snapshot(kv)
    bad_calls: list[tuple[str, Callable[[], object]]] = [
        ("put of an empty key", lambda: kv.put({b"": b"v"})),
        ("delete of an empty key", lambda: kv.delete([b""])),
        ("get of an empty key", lambda: kv.get([b""])),
        ("put of a str key", lambda: kv.put({"text": b"v"})),
        ("get of a str key", lambda: kv.get(["text"])),
        ("delete of an int key", lambda: kv.delete([1])),
        ("write putting and deleting b'a'", lambda: kv.write(put={b"a": b"2"}, delete=[b"a"])),
        ("delete_range(None, b'z')", lambda: kv.delete_range(None, b"z")),
        ("delete_range(b'a', None)", lambda: kv.delete_range(b"a", None)),
    ]
    for what, call in bad_calls:
        with t.raises(InvalidKey, requires=f"a {what} raises InvalidKey"):
            call()
        t.unchanged(kv, before, f"a {what} writes nothing")


@clause(
    "delete_range is not a batch: it deletes any number of keys, beyond max_batch_entries, and "
    "refunds them all"
)
def delete_range_is_not_bounded_by_the_batch_limit(t: Trial) -> None:
    kv = t.namespace()
    limits = boundary(t, kv, "max_batch_entries")
    n = limits.max_batch_entries
    keys = [b"r%05d" % i for i in range(2 * n + 44)]
    at_least(limits, max_key_bytes=6, max_batch_bytes=7, max_storage_bytes=7 * len(keys) + 4)
    put_all(kv, limits, ((k, b"v") for k in keys))
    put_all(kv, limits, [(b"q", b"v"), (b"s", b"v")])
    kv.delete_range(b"r", b"s")
    deleted = t.calls[-1]
    t.expect(
        kv.list(),
        [(b"q", b"v"), (b"s", b"v")],
        f"delete_range(b'r', b's') deletes all {len(keys)} keys between, more than "
        f"max_batch_entries ({n})",
        by=deleted,
    )
    t.expect(kv.used_bytes(), 4, f"delete_range refunds all {len(keys)} entries", by=deleted)
