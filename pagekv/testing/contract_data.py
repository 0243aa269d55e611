"""Contract clauses of data and order: list, prefix, range, limit and reverse, get, what a write
stores and what it counts, delete_range, drop, namespaces and handles, persistence.

The keys of `ORDERED_KEYS` catch the usual ordering bugs: signed byte comparison (`b'\\x80'`
before `b'\\x7f'`), NUL-terminated comparison (`b'a'` equal to `b'a\\x00'`) and length-first
order (`b'b'` before `b'aa'`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Final

from pagekv.kv import InvalidArgument, KvLimits, entry_size
from pagekv.testing.clauses import NotChecked, Trial, clause
from pagekv.testing.model import Model, Op
from pagekv.testing.subject import Probe

ORDERED_KEYS: Final[list[bytes]] = [
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
"""In unsigned bytewise order, a key before its extensions."""

LARGEST: Final = {
    "max_key_bytes": 64 * 1024,
    "max_value_bytes": 4 * 2**20,
    "max_batch_entries": 4096,
    "max_batch_bytes": 16 * 2**20,
    "max_name_bytes": 64 * 1024,
}
"""The largest limits a clause fills at their boundary; a namespace advertising more leaves that
clause not checked (filling a 1 GiB value would take the check's whole time, or its memory)."""


SMALL: Final = {
    "max_key_bytes": 16,
    "max_value_bytes": 1024,
    "max_batch_entries": 8,
    "max_batch_bytes": 4096,
    "max_storage_bytes": 16 * 1024,
}
"""The least a namespace must take for the clauses that hold no limit at its boundary: their keys,
values and batches are this small (any longer, any more, is sized from the advertised limits)."""


def at_least(limits: KvLimits, **least: int) -> None:
    """`NotChecked` unless each named limit is at least what the clause needs: limits that small
    make the clause impossible, not failed."""
    short = [
        f"{name} >= {value} (the namespace advertises {getattr(limits, name)})"
        for name, value in least.items()
        if getattr(limits, name) < value
    ]
    if short:
        raise NotChecked("needs " + ", ".join(short))


def takes_small(t: Trial, kv: Probe, *but: str) -> Probe:
    """`kv`, once it is known to take what `SMALL` says (but the limits named in `but`, which the
    clause asked for itself)."""
    at_least(t.limits(kv), **{name: n for name, n in SMALL.items() if name not in but})
    return kv


def fresh(t: Trial, **limits: int) -> Probe:
    """A fresh namespace with `limits` (see `Trial.namespace`) for a clause of small requests."""
    return takes_small(t, t.namespace(**limits), *limits)


def batches(
    limits: KvLimits, entries: Iterable[tuple[bytes, bytes]], most: int | None = None
) -> Iterator[dict[bytes, bytes]]:
    """`entries` in order, in the fewest batches within `max_batch_entries` and `max_batch_bytes`
    (and of `most` entries at most); each entry must fit a batch alone."""
    cap = min(limits.max_batch_entries, most or limits.max_batch_entries)
    batch: dict[bytes, bytes] = {}
    size = 0
    for key, value in entries:
        if batch and (len(batch) == cap or size + entry_size(key, value) > limits.max_batch_bytes):
            yield batch
            batch, size = {}, 0
        batch[key] = value
        size += entry_size(key, value)
    if batch:
        yield batch


def put_all(
    kv: Probe, limits: KvLimits, entries: Iterable[tuple[bytes, bytes]], most: int | None = None
) -> None:
    """Write `entries` in `batches`."""
    for batch in batches(limits, entries, most):
        kv.put(batch)


def modelled(limits: KvLimits, entries: Iterable[tuple[bytes, bytes]]) -> Model:
    """The model of a fresh namespace after `put_all` of `entries`."""
    model = Model(limits)
    for batch in batches(limits, entries):
        model.apply(Op.of("put", batch))
    return model


def chunks(limits: KvLimits, keys: list[bytes]) -> list[list[bytes]]:
    """`keys` in gets of at most `max_batch_entries` keys."""
    n = limits.max_batch_entries
    return [keys[i : i + n] for i in range(0, len(keys), n)]


def value_of(key: bytes) -> bytes:
    return b"v:" + key


def pairs(keys: list[bytes]) -> list[tuple[bytes, bytes]]:
    """What `list()` returns of a namespace written by `filled`, restricted to `keys`."""
    return [(k, value_of(k)) for k in keys]


def charge(entries: dict[bytes, bytes]) -> int:
    """Bytes `entries` are charged against the quota, and counted by `used_bytes()`."""
    return sum(entry_size(k, v) for k, v in entries.items())


def filled(t: Trial) -> Probe:
    """A fresh namespace holding `ORDERED_KEYS`, written in a shuffled order in batches of 5."""
    kv = fresh(t)
    keys = ORDERED_KEYS[:]
    random.Random(7).shuffle(keys)
    put_all(kv, t.limits(kv), pairs(keys), most=5)
    return kv


def boundary(t: Trial, kv: Probe, *names: str) -> KvLimits:
    """The limits `kv` advertises, each of `names` small enough to fill (`LARGEST`)."""
    limits = t.limits(kv)
    for name in names:
        if getattr(limits, name) > LARGEST[name]:
            raise NotChecked(
                f"{name} = {getattr(limits, name)} is more than a clause fills at its boundary "
                f"({LARGEST[name]})"
            )
    return limits


# --- ordering, list, get ---------------------------------------------------------------------


@clause(
    "list() returns every entry in unsigned bytewise order of keys, a key before its "
    "extensions; list(reverse=True) the same in descending order"
)
def list_orders_keys_bytewise(t: Trial) -> None:
    kv = filled(t)
    t.expect(
        kv.list(),
        pairs(ORDERED_KEYS),
        "list() returns all 22 entries in unsigned bytewise order: b'\\x7f' before b'\\x80', "
        "b'a' before b'a\\x00' before b'a\\x01', b'aa' before b'b'",
    )
    t.expect(
        kv.list(reverse=True),
        pairs(ORDERED_KEYS[::-1]),
        "list(reverse=True) returns all 22 entries in descending unsigned bytewise order",
    )


@clause(
    "list(prefix=p) returns exactly the entries whose key starts with p; a prefix of 0xff "
    "bytes reaches the end of the keyspace"
)
def prefix_lists_exactly_the_keys_with_that_prefix(t: Trial) -> None:
    kv = filled(t)
    cases: list[tuple[bytes, list[bytes], str]] = [
        (
            b"a",
            ORDERED_KEYS[5:14],
            "",
        ),
        (b"a\xff", [b"a\xff", b"a\xff\xff"], ""),
        (b"a\x00", [b"a\x00", b"a\x00\x00"], " (a NUL is a byte like any other)"),
        (b"\x00", [b"\x00", b"\x00\x00", b"\x00\xff"], ""),
        (
            b"\xff",
            [b"\xff", b"\xff\x00", b"\xff\xff", b"\xff\xff\xff"],
            " (no key bounds an all-0xff prefix from above: it reaches the end of the keyspace)",
        ),
        (b"\xff\xff", [b"\xff\xff", b"\xff\xff\xff"], " (an all-0xff prefix)"),
        (b"zz", [], " (no key has it)"),
    ]
    for prefix, keys, why in cases:
        t.expect(
            kv.list(prefix=prefix),
            pairs(keys),
            f"list(prefix={prefix!r}) returns exactly the {len(keys)} entries whose key starts "
            f"with {prefix!r}, in order{why}",
        )


@clause(
    "list(prefix=p, reverse=True, limit=n) returns the last n entries with prefix p, highest "
    "first; without reverse, the first n"
)
def prefix_with_reverse_and_limit(t: Trial) -> None:
    kv = filled(t)
    t.expect(
        kv.list(prefix=b"a", reverse=True, limit=3),
        pairs([b"a\xff\xff", b"a\xff", b"a\x80"]),
        "list(prefix=b'a', reverse=True, limit=3) returns the 3 highest keys with prefix b'a', "
        "highest first",
    )
    t.expect(
        kv.list(prefix=b"a", limit=2),
        pairs([b"a", b"a\x00"]),
        "list(prefix=b'a', limit=2) returns the 2 lowest keys with prefix b'a'",
    )
    t.expect(
        kv.list(prefix=b"\xff", reverse=True, limit=2),
        pairs([b"\xff\xff\xff", b"\xff\xff"]),
        "list(prefix=b'\\xff', reverse=True, limit=2) returns the 2 highest keys of the "
        "keyspace, highest first",
    )


@clause("list(start=s, end=e) returns the entries with s <= key < e: start included, end not")
def range_is_half_open(t: Trial) -> None:
    kv = filled(t)
    t.expect(
        kv.list(start=b"a\x00", end=b"a\xff"),
        pairs([b"a\x00", b"a\x00\x00", b"a\x01", b"aa", b"a\x7f", b"a\x80"]),
        "list(start=b'a\\x00', end=b'a\\xff') includes the start key b'a\\x00' and excludes the "
        "end key b'a\\xff'",
    )
    t.expect(
        kv.list(start=b"a\x00", end=b"a\xff", reverse=True, limit=2),
        pairs([b"a\x80", b"a\x7f"]),
        "list(start=b'a\\x00', end=b'a\\xff', reverse=True, limit=2) returns the 2 highest keys "
        "below the end b'a\\xff', highest first",
    )
    t.expect(
        kv.list(end=b"\x01"),
        pairs([b"\x00", b"\x00\x00", b"\x00\xff"]),
        "list(end=b'\\x01') returns every key below b'\\x01', not b'\\x01' itself",
    )
    t.expect(
        kv.list(start=b"\xff\xff"),
        pairs([b"\xff\xff", b"\xff\xff\xff"]),
        "list(start=b'\\xff\\xff') returns b'\\xff\\xff' and every key above it",
    )
    t.expect(
        kv.list(start=b"a\x02", end=b"a\x81"),
        pairs([b"aa", b"a\x7f", b"a\x80"]),
        "list(start=b'a\\x02', end=b'a\\x81') with bounds that are not stored keys returns the "
        "keys between them",
    )


LIST_RANGES: Final[list[tuple[bytes | None, bytes | None]]] = [
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


@clause(
    "list(start, end, limit, reverse) returns the entries with start <= key < end (an empty "
    "list when start >= end), ascending or with reverse descending, at most limit of them"
)
def list_matches_the_model_for_every_range_limit_and_direction(t: Trial) -> None:
    kv = filled(t)
    model = modelled(t.limits(kv), pairs(ORDERED_KEYS))
    for start, end in LIST_RANGES:
        for limit in (None, 1, 2, 5, 100):
            for reverse in (False, True):
                op = Op.of("list", start=start, end=end, limit=limit, reverse=reverse)
                want = model.apply(op).value
                order = "descending" if reverse else "ascending"
                t.expect(
                    op.call(kv),
                    want,
                    f"{op} returns the {len(want)} entries with start <= key < end, {order}"
                    + ("" if limit is None else f", the first {limit} at most"),
                )


@clause("list() with a prefix and a start or end bound raises InvalidArgument naming the prefix")
def list_refuses_a_prefix_with_bounds(t: Trial) -> None:
    kv = filled(t)
    for bound, key in (("start", b"a"), ("end", b"b")):
        with t.raises(
            InvalidArgument,
            requires=f"list(prefix=b'a', {bound}={key!r}) raises InvalidArgument: a prefix and "
            "a bound together are refused",
        ) as caught:
            kv.list(prefix=b"a", **{bound: key})
        t.check("prefix" in str(caught[0]), "the InvalidArgument says it is the prefix", caught[0])


@clause(
    "a list limit of at least the number of entries means all of them, up to and past 2**63 "
    "(no namespace holds so many)"
)
def a_list_limit_beyond_any_count_means_all(t: Trial) -> None:
    kv = filled(t)
    limits = t.limits(kv)
    spare = [b"\x7f-filler-%d" % i for i in range(4)]
    room = (limits.max_storage_bytes - charge(dict(pairs(ORDERED_KEYS)))) // len(spare)
    room -= len(spare[0])  # the fillers are all stored before they are deleted: a quarter each
    filler = b"x" * min(8 * 1024, limits.max_value_bytes, limits.max_batch_bytes - 10, room)
    for key in spare:  # bytes enough that a store with a log compacts it: reads from its base
        kv.put({key: filler})
    kv.delete(spare)
    with_a = [k for k in ORDERED_KEYS if k.startswith(b"a")]
    for limit in (len(ORDERED_KEYS), 2**31, 2**63 - 1, 2**63, 2**64, 10**30):
        for reverse in (False, True):
            order = -1 if reverse else 1
            t.expect(
                kv.list(limit=limit, reverse=reverse),
                pairs(ORDERED_KEYS[::order]),
                f"list(limit={limit}, reverse={reverse}) returns all 22 entries",
            )
            t.expect(
                kv.list(prefix=b"a", limit=limit, reverse=reverse),
                pairs(with_a[::order]),
                f"list(prefix=b'a', limit={limit}, reverse={reverse}) returns all 9 entries with "
                "prefix b'a'",
            )


LARGE: Final = 1500
"""Entries of the large namespace: more than any page size a backend's list may cap at silently
(S3's 1,000, DynamoDB's 1 MB of small items), so a dropped continuation shows."""
LARGE_LISTS: Final[list[dict[str, object]]] = [
    {},
    {"reverse": True},
    {"limit": 1001},
    {"limit": 1200, "reverse": True},
    {"limit": LARGE - 1},
    {"limit": LARGE},
    {"limit": 10 * LARGE, "reverse": True},
    {"prefix": b"n"},
    {"prefix": b"n1", "reverse": True},
    {"start": b"n0100", "end": b"n1400"},
    {"start": b"n0100", "end": b"n1400", "reverse": True, "limit": 1100},
]


@clause(
    "list() of a namespace of 1,500 entries returns every one asked for, in order, forward and "
    "reversed, with limits above 1,000, with a prefix or a range: no page size caps a list"
)
def list_returns_every_entry_of_a_large_namespace(t: Trial) -> None:
    kv = t.namespace()
    limits = t.limits(kv)
    entries = [(b"n%04d" % i, b"%d" % i) for i in range(LARGE)]
    at_least(
        limits,
        max_key_bytes=5,
        max_value_bytes=4,
        max_batch_bytes=9,
        max_storage_bytes=charge(dict(entries)),
    )
    shuffled = entries[:]
    random.Random(11).shuffle(shuffled)
    puts = list(batches(limits, shuffled))
    for batch in puts:
        kv.put(batch)
    model = modelled(limits, entries)
    for kwargs in LARGE_LISTS:
        op = Op.of("list", **kwargs)
        want = model.apply(op).value
        order = "descending" if kwargs.get("reverse") else "ascending"
        t.expect(
            op.call(kv),
            want,
            f"{op} returns {len(want)} entries of the {LARGE} written in {len(puts)} puts, {order}",
        )


BAD_LIST_LIMITS: Final[list[object]] = [0, -1, -(2**70), True, False, 1.0, 2.5, "2", b"2"]


@clause(
    "a list limit that is not a positive int (0, negative, a bool, a float, a str) raises "
    "InvalidArgument naming the limit and its value"
)
def a_list_limit_that_is_not_a_positive_int_is_refused(t: Trial) -> None:
    kv = fresh(t)
    kv.put({b"k": b"v"})
    for limit in BAD_LIST_LIMITS:
        with t.raises(
            InvalidArgument, requires=f"list(limit={limit!r}) raises InvalidArgument"
        ) as caught:
            kv.list(limit=limit)
        message = str(caught[0])
        t.check(
            "limit" in message and str(limit) in message,
            f"the InvalidArgument of list(limit={limit!r}) names the limit and {limit!r}",
            caught[0],
        )


@clause("list(reverse=r) with r not a bool (None, 0, 1, a str) raises InvalidArgument")
def list_reverse_must_be_a_bool(t: Trial) -> None:
    kv = filled(t)
    for reverse in (None, 0, 1, "yes", "False"):
        with t.raises(
            InvalidArgument, requires=f"list(reverse={reverse!r}) raises InvalidArgument"
        ) as caught:
            kv.list(reverse=reverse)
        t.check(
            "reverse" in str(caught[0]),
            f"the InvalidArgument of list(reverse={reverse!r}) names reverse",
            caught[0],
        )


@clause("a fresh namespace lists nothing, whatever the prefix, limit or direction")
def list_of_an_empty_namespace(t: Trial) -> None:
    kv = fresh(t)
    t.expect(kv.list(), [], "list() of a fresh namespace returns []")
    t.expect(kv.list(reverse=True, limit=3), [], "list(reverse=True, limit=3) returns []")
    t.expect(kv.list(prefix=b"x"), [], "list(prefix=b'x') returns []")


@clause(
    "get(keys) returns one value per key asked, in the order asked (a repeated key each time), "
    "None for a missing key; keys may be any iterable"
)
def get_returns_values_in_request_order_with_none_for_missing(t: Trial) -> None:
    kv = filled(t)
    request = [b"\xff", b"missing", b"\x00", b"a\x00", b"\x00", b"nope", b"A"]  # 7 <= SMALL
    t.expect(
        kv.get(request),
        [value_of(k) if k in ORDERED_KEYS else None for k in request],
        "get() returns the values in the order of the keys asked, b'\\x00' twice, None for "
        "b'missing' and b'nope'",
    )
    t.expect(kv.get([]), [], "get([]) returns []")
    t.expect(kv.get(iter([b"b"])), [value_of(b"b")], "get(an iterator of keys) reads them all")


@clause("values are stored as given: empty, binary and NUL values read back exactly")
def empty_and_binary_values_round_trip(t: Trial) -> None:
    kv = fresh(t)
    blob = bytes(range(256)) * 3
    kv.put({b"empty": b"", b"blob": blob, b"nul": b"\x00"})
    t.expect(
        kv.get([b"empty", b"blob", b"nul", b"absent"]),
        [b"", blob, b"\x00", None],
        "get() returns b'' for an empty value (not None), the 768 binary bytes exactly, b'\\x00'",
    )
    t.expect(
        kv.used_bytes(),
        len(b"empty") + len(b"blob") + len(blob) + len(b"nul") + 1,
        "used_bytes() counts an empty value's key, and every byte of the others",
    )


@clause(
    "put and write take entries as a mapping or an iterable of (key, value) pairs; of a key put "
    "twice in one batch, the last value wins"
)
def put_takes_a_mapping_or_pairs_and_the_last_put_of_a_key_wins(t: Trial) -> None:
    kv = fresh(t)
    kv.put({b"m": b"1"})
    kv.put([(b"p", b"1"), (b"p", b"2")])
    kv.write(put=iter([(b"g", b"1")]))
    t.expect(
        kv.list(),
        [(b"g", b"1"), (b"m", b"1"), (b"p", b"2")],
        "entries put as a dict, as pairs and as an iterator are all stored; b'p' put twice "
        "holds the last value",
    )
    t.expect(kv.used_bytes(), 6, "used_bytes() counts b'p' once")


@clause("bytes-like keys and values (bytearray, memoryview) are stored as bytes, copied")
def bytes_like_keys_and_values_are_stored_as_bytes(t: Trial) -> None:
    kv = fresh(t)
    buffer = bytearray(b"xyz")
    kv.put({memoryview(b"ba"): memoryview(b"mv"), b"plain": buffer})
    kv.put([(memoryview(b"pair"), bytearray(b"1"))])
    t.expect(
        kv.list(),
        [(b"ba", b"mv"), (b"pair", b"1"), (b"plain", b"xyz")],
        "list() returns the entries put with memoryview and bytearray keys and values",
    )
    t.expect(
        kv.get([b"ba", b"pair", b"plain"]),
        [b"mv", b"1", b"xyz"],
        "get() returns the values put as memoryview and bytearray (as bytes: every result is "
        "type-checked)",
    )
    buffer[:] = b"zzz"
    t.expect(
        kv.get([b"plain"]),
        [b"xyz"],
        "a value put as a bytearray keeps what it held at the put when the caller changes it",
    )
    t.expect(kv.used_bytes(), 4 + 5 + 8, "used_bytes() counts bytes-likes by their length")


@clause("a write keeps nothing of the caller's dict: changing it afterwards changes nothing stored")
def the_callers_dict_is_its_own_after_a_write(t: Trial) -> None:
    kv = fresh(t)
    entries = {b"a": b"1", b"b": b"2"}
    kv.put(entries)
    entries[b"a"] = b"changed"
    entries[b"c"] = b"3"
    del entries[b"b"]
    t.expect(
        kv.list(),
        [(b"a", b"1"), (b"b", b"2")],
        "list() returns what the put wrote, not the caller's dict as changed since",
    )
    t.expect(kv.used_bytes(), 4, "used_bytes() counts what the put wrote")


@clause(
    "write(put=..., delete=...) applies its puts and deletes in one batch; deleting a missing "
    "key is no error; delete(keys) deletes them"
)
def write_puts_and_deletes_in_one_batch(t: Trial) -> None:
    kv = fresh(t)
    kv.put({b"a": b"1", b"b": b"2", b"c": b"3"})
    kv.write(put={b"b": b"22", b"d": b"4"}, delete=[b"a", b"c", b"never-existed"])
    wrote = kv.last()
    t.expect(
        kv.list(),
        [(b"b", b"22"), (b"d", b"4")],
        "a write overwriting b'b', adding b'd', deleting b'a', b'c' and a missing key leaves "
        "b'b' and b'd'",
        by=wrote,
    )
    t.expect(kv.used_bytes(), 3 + 2, "used_bytes() counts the entries left", by=wrote)
    kv.delete([b"b"])
    deleted = kv.last()
    t.expect(kv.list(), [(b"d", b"4")], "delete([b'b']) deletes b'b'", by=deleted)
    t.expect(kv.used_bytes(), 2, "used_bytes() no longer counts a deleted entry", by=deleted)


@clause(
    "used_bytes() is the sum of len(key) + len(value) over the stored entries, exactly; an "
    "overwrite changes it by the difference of the values' sizes"
)
def used_bytes_counts_keys_and_values_exactly(t: Trial) -> None:
    kv = fresh(t)
    limits = t.limits(kv)
    entries = {
        bytes([i]) * min(i + 1, limits.max_key_bytes): b"x" * min(3 * i, limits.max_value_bytes)
        for i in range(1, 40)
    }
    largest = max(entry_size(k, v) for k, v in entries.items())
    at_least(limits, max_batch_bytes=largest, max_storage_bytes=charge(entries) + 1)
    put_all(kv, limits, entries.items())
    t.expect(
        kv.used_bytes(),
        charge(entries),
        f"used_bytes() sums the keys and values of 39 entries ({charge(entries)} bytes) put in "
        f"batches of at most {limits.max_batch_entries}",
    )
    kv.put({b"\x01\x01": b"yyyy"})
    overwrite = kv.last()
    t.expect(
        kv.used_bytes(),
        charge(entries) + 1,
        "overwriting a 3-byte value with 4 bytes adds 1 to used_bytes()",
        by=overwrite,
    )


# --- drop, delete_range ----------------------------------------------------------------------


@clause(
    "drop() removes every entry, sets used_bytes() to 0 and keeps the generation; the namespace "
    "can be used again"
)
def drop_removes_everything_and_keeps_the_generation(t: Trial) -> None:
    kv = filled(t)
    gets = chunks(t.limits(kv), ORDERED_KEYS)
    kv.takeover()
    gen = kv.takeover()
    for keys in gets:  # a backend with a read cache has it full now
        t.expect(kv.get(keys), [value_of(k) for k in keys], "get() reads back every key put")
    t.expect(kv.used_bytes(), charge(dict(pairs(ORDERED_KEYS))), "used_bytes() counts 22 entries")
    kv.drop()
    dropped = kv.last()
    t.expect(kv.list(), [], "list() after drop() returns []", by=dropped)
    for keys in gets:
        t.expect(
            kv.get(keys),
            [None] * len(keys),
            "get() after drop() finds none of the keys dropped (no read cache outlives a drop)",
            by=dropped,
        )
    t.expect(kv.used_bytes(), 0, "used_bytes() after drop() is 0", by=dropped)
    t.expect(kv.generation(), gen, f"drop() keeps the generation ({gen})", by=dropped)
    t.expect(kv.takeover(), gen + 1, "takeover() after drop() returns the generation + 1")
    kv.put({b"again": b"1"})
    again = kv.last()
    t.expect(kv.list(), [(b"again", b"1")], "a put after drop() is stored", by=again)
    t.expect(
        kv.get([b"again", ORDERED_KEYS[0]]),
        [b"1", None],
        "get() after drop() and a put finds the new key, not a dropped one",
        by=again,
    )
    t.expect(kv.used_bytes(), 6, "used_bytes() counts from 0 after drop()", by=again)


@clause("drop() of a fresh namespace succeeds and leaves it empty")
def drop_of_an_empty_namespace(t: Trial) -> None:
    kv = fresh(t)
    t.expect(kv.get([b"k"]), [None], "get() of a fresh namespace finds nothing")
    kv.drop()
    dropped = kv.last()
    t.expect(kv.list(), [], "list() after drop() of a fresh namespace returns []", by=dropped)
    t.expect(kv.get([b"k"]), [None], "get() after drop() of a fresh namespace finds nothing")
    t.expect(kv.used_bytes(), 0, "used_bytes() after drop() of a fresh namespace is 0", by=dropped)


@clause(
    "delete_range(start, end) deletes exactly the keys with start <= key < end and refunds "
    "their bytes"
)
def delete_range_is_exact_at_its_boundaries(t: Trial) -> None:
    kv = filled(t)
    left = ORDERED_KEYS[:]
    for start, end in ((b"a\x00", b"a\x80"), (b"\xff", b"\xff\xff")):
        kv.delete_range(start, end)
        deleted = kv.last()
        left = [k for k in left if not start <= k < end]
        t.expect(
            kv.list(),
            pairs(left),
            f"delete_range({start!r}, {end!r}) deletes {start!r} and the keys up to, not "
            f"including, {end!r}",
            by=deleted,
        )
        t.expect(
            kv.used_bytes(),
            charge(dict(pairs(left))),
            f"used_bytes() after delete_range({start!r}, {end!r}) counts only the keys left",
            by=deleted,
        )


@clause("delete_range with bounds that are not stored keys deletes the keys between them")
def delete_range_with_bounds_that_are_not_keys(t: Trial) -> None:
    kv = filled(t)
    kv.delete_range(b"\x00\x01", b"\x02")
    t.expect(
        kv.list(end=b"A"),
        pairs([b"\x00", b"\x00\x00"]),
        "delete_range(b'\\x00\\x01', b'\\x02') deletes b'\\x00\\xff' and b'\\x01', keeps "
        "b'\\x00' and b'\\x00\\x00'",
    )


@clause("delete_range(start, end) with start >= end, or nothing in between, deletes nothing")
def empty_delete_ranges_delete_nothing(t: Trial) -> None:
    kv = filled(t)
    before = t.snapshot(kv)
    for start, end in ((b"a", b"a"), (b"b", b"a"), (b"a\x00\x00\x01", b"a\x01")):
        kv.delete_range(start, end)
        t.unchanged(kv, before, f"delete_range({start!r}, {end!r}) deletes nothing")


# --- namespaces and handles ------------------------------------------------------------------


@clause(
    "namespaces of one store are isolated: writes, takeovers, delete_range and drop of one "
    "change nothing of another"
)
def namespaces_are_isolated(t: Trial) -> None:
    store = t.store()
    a, b = takes_small(t, t.handle(store, "a")), t.handle(store, "b")
    a.put({b"k": b"a-value", b"only-a": b"1"})
    b.put({b"k": b"b-value"})
    gen_b = b.generation()
    t.expect(a.takeover(), a.generation(), "generation() of 'a' is what its takeover returned")
    t.expect(b.generation(), gen_b, "a takeover of 'a' leaves the generation of 'b'")
    t.expect(a.get([b"k", b"only-a"]), [b"a-value", b"1"], "'a' reads its own values")
    t.expect(b.get([b"k", b"only-a"]), [b"b-value", None], "'b' reads none of 'a'")
    t.expect(b.list(), [(b"k", b"b-value")], "'b' lists only its own entry")
    t.expect(b.used_bytes(), 8, "used_bytes() of 'b' counts only its own entry")
    a.delete_range(b"a", b"z")
    t.expect(b.list(), [(b"k", b"b-value")], "delete_range on 'a' deletes nothing of 'b'")
    a.put({b"k": b"again"})
    a.drop()
    t.expect(a.get([b"k"]), [None], "drop() of 'a' deletes its entries")
    t.expect(b.list(), [(b"k", b"b-value")], "drop() of 'a' deletes nothing of 'b'")
    t.expect(b.used_bytes(), 8, "drop() of 'a' leaves used_bytes() of 'b'")
    t.expect(t.handle(store, "c").list(), [], "a namespace never written lists nothing")


@clause(
    "two namespace objects of one name in one store are the same namespace: contents, "
    "generation and used_bytes"
)
def two_handles_of_one_namespace_share_it(t: Trial) -> None:
    store = t.store()
    first = takes_small(t, t.handle(store, "actor"))
    first.put({b"k": b"v"})
    gen = first.takeover()
    second = t.handle(store, "actor")
    t.expect(second.list(), [(b"k", b"v")], "a second handle lists what the first wrote")
    t.expect(second.generation(), gen, "a second handle sees the first's takeover")
    t.expect(second.used_bytes(), 2, "a second handle counts the first's bytes")


@clause(
    "a store reopened at its location holds what was acknowledged before it closed: entries, "
    "generation, used_bytes, deletes and drops"
)
def data_persists_across_reopen(t: Trial) -> None:
    location = t.location()
    store = t.store(location)
    kv = takes_small(t, t.handle(store, "actor"))
    kv.put({b"\x00": b"zero", b"\xff": b"ff", b"k": b"v" * 100})
    kv.delete([b"k"])
    gen = kv.takeover()
    kv.put({b"after": b"takeover"}, fence=gen)
    other = t.handle(store, "other")
    other.put({b"o": b"1"})
    other.drop()
    t.close(store)
    reopened = t.store(location)
    kv = t.handle(reopened, "actor")
    t.expect(
        kv.list(),
        [(b"\x00", b"zero"), (b"after", b"takeover"), (b"\xff", b"ff")],
        "after reopening, list() returns what was written, without the deleted key",
    )
    t.expect(kv.generation(), gen, "after reopening, generation() is the last takeover's")
    t.expect(kv.used_bytes(), 1 + 4 + 5 + 8 + 1 + 2, "after reopening, used_bytes() is as before")
    t.expect(kv.takeover(), gen + 1, "after reopening, takeover() returns the generation + 1")
    other = t.handle(reopened, "other")
    t.expect(other.list(), [], "after reopening, a dropped namespace lists nothing")
    t.expect(other.used_bytes(), 0, "after reopening, a dropped namespace counts 0 bytes")
