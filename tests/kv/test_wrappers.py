"""`CountingKv` and `FaultyKv`: exact counts, faults at exactly the scheduled call, seeded rates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

import pagekv.kv.wrappers
from pagekv.kv import (
    ActorKv,
    CountingKv,
    Fault,
    FaultKind,
    FaultyKv,
    FenceMismatch,
    FiredFault,
    InjectedIndeterminate,
    InjectedUnavailable,
    InvalidKey,
    KvIndeterminate,
    KvStats,
    KvStore,
    KvUnavailable,
    TooManyEntries,
    ValueTooLarge,
)
from pagekv.kv.wrappers import WRITE_OPS

FAIL = FaultKind.FAIL_BEFORE
APPLY = FaultKind.APPLY_THEN_RAISE


@pytest.fixture
def kv(store: KvStore) -> ActorKv:
    return store.namespace("actor")


# --- every wrapper ---------------------------------------------------------------------------

_BAD_CALLS: dict[str, Callable[[ActorKv], object]] = {
    "put-int-key": lambda kv: kv.put({1: b"v"}),  # type: ignore[dict-item]
    "put-str-key": lambda kv: kv.put({"k": b"v"}),  # type: ignore[dict-item]
    "put-int-value": lambda kv: kv.put({b"k": 1}),  # type: ignore[dict-item]
    "put-pairs-str-key": lambda kv: kv.put([("k", b"v")]),  # type: ignore[list-item]
    "delete-int-key": lambda kv: kv.delete([1]),  # type: ignore[list-item]
    "get-str-key": lambda kv: kv.get(["k"]),  # type: ignore[list-item]
    "list-str-prefix": lambda kv: kv.list(prefix="k"),  # type: ignore[arg-type]
    "list-str-start": lambda kv: kv.list(start="k"),  # type: ignore[arg-type]
    "list-int-end": lambda kv: kv.list(end=1),  # type: ignore[arg-type]
    "range-str-start": lambda kv: kv.delete_range("a", b"b"),  # type: ignore[arg-type]
    "range-int-end": lambda kv: kv.delete_range(b"a", 2),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", _BAD_CALLS.values(), ids=_BAD_CALLS.keys())
@pytest.mark.parametrize("wrap", [CountingKv, FaultyKv, pagekv.kv.wrappers.KvWrapper])
def test_a_wrapper_rejects_bad_input_as_its_store_does(
    kv: ActorKv, wrap: Callable[[ActorKv], ActorKv], call: Callable[[ActorKv], object]
) -> None:
    """A wrapper forwards arguments unchecked, so a wrong type meets the store's own check and
    error (compiled wrappers must not raise a `TypeError` of their own first)."""
    with pytest.raises(Exception) as direct:
        call(kv)
    assert isinstance(direct.value, InvalidKey)
    with pytest.raises(InvalidKey):
        call(wrap(kv))
    assert kv.list() == []


# --- CountingKv ------------------------------------------------------------------------------


def test_counting_kv_is_an_actor_kv_with_the_inner_limits(kv: ActorKv) -> None:
    counting = CountingKv(kv)
    assert isinstance(counting, ActorKv)
    assert counting.limits == kv.limits
    assert counting.stats == KvStats()


def test_counting_kv_counts_writes_exactly(kv: ActorKv) -> None:
    counting = CountingKv(kv)
    counting.write(put={b"ab": b"12345", b"c": b""}, delete=[b"gone", b"x"])
    assert counting.stats.round_trips == Counter({"write": 1})
    assert counting.stats.entries_written == 4
    assert counting.stats.bytes_written == 2 + 5 + 1 + 0 + 4 + 1
    counting.put([(b"k", b"vv")])  # the shorthands are writes too
    counting.delete([b"ab"])
    assert counting.stats.round_trips == Counter({"write": 3})
    assert counting.stats.entries_written == 6
    assert counting.stats.bytes_written == 13 + 3 + 2
    assert counting.stats.entries_read == counting.stats.bytes_read == 0
    # The writes really reached the store.
    assert kv.list() == [(b"c", b""), (b"k", b"vv")]


def test_counting_kv_counts_reads_exactly(kv: ActorKv) -> None:
    kv.put({b"a": b"1", b"bb": b"222", b"c": b"33"})
    counting = CountingKv(kv)
    assert counting.get([b"a", b"missing", b"bb"]) == [b"1", None, b"222"]
    assert counting.stats.entries_read == 2  # a missing key reads nothing
    assert counting.stats.bytes_read == 1 + 3  # get returns values only
    assert counting.list(start=b"b") == [(b"bb", b"222"), (b"c", b"33")]
    assert counting.stats.entries_read == 4
    assert counting.stats.bytes_read == 4 + (2 + 3) + (1 + 2)
    assert counting.list(prefix=b"zz") == []
    assert counting.stats.round_trips == Counter({"get": 1, "list": 2})
    assert counting.stats.entries_written == counting.stats.bytes_written == 0


def test_counting_kv_counts_every_op_by_name(kv: ActorKv) -> None:
    counting = CountingKv(kv)
    gen = counting.takeover()
    counting.put({b"a": b"1"}, fence=gen)
    counting.get([b"a"])
    counting.list()
    counting.delete_range(b"a", b"b", fence=gen)
    assert counting.generation() == gen
    assert counting.used_bytes() == 0
    counting.drop(fence=gen)
    stats = counting.stats
    assert stats.round_trips == Counter(
        {
            "takeover": 1,
            "write": 1,
            "get": 1,
            "list": 1,
            "delete_range": 1,
            "generation": 1,
            "used_bytes": 1,
            "drop": 1,
        }
    )
    assert stats.writes == 4  # write, delete_range, takeover, drop
    assert stats.reads == 2  # get, list
    assert stats.total == 8


def test_counting_kv_counts_calls_that_fail(kv: ActorKv) -> None:
    counting = CountingKv(kv)
    with pytest.raises(ValueTooLarge):
        counting.put({b"k": b"v" * (kv.limits.max_value_bytes + 1)})
    with pytest.raises(TooManyEntries):
        counting.get([b"k"] * (kv.limits.max_batch_entries + 1))
    gen = kv.takeover()
    with pytest.raises(FenceMismatch):
        counting.delete_range(b"a", b"b", fence=gen - 1)
    with pytest.raises(FenceMismatch):
        counting.drop(fence=gen + 1)
    assert counting.stats.round_trips == Counter(
        {"write": 1, "get": 1, "delete_range": 1, "drop": 1}
    )
    # The rejected write is counted as given, entries and bytes included.
    assert counting.stats.entries_written == 1
    assert counting.stats.bytes_written == 1 + kv.limits.max_value_bytes + 1
    assert counting.stats.entries_read == 0
    assert kv.list() == []


def test_counting_kv_counts_injected_failures(kv: ActorKv) -> None:
    counting = CountingKv(FaultyKv(kv, faults=[Fault(0, FAIL), Fault(1, APPLY)]))
    with pytest.raises(KvUnavailable):
        counting.put({b"a": b"1"})
    with pytest.raises(KvIndeterminate):
        counting.put({b"b": b"2"})
    counting.put({b"c": b"3"})
    assert counting.stats.round_trips == Counter({"write": 3})
    assert kv.list() == [(b"b", b"2"), (b"c", b"3")]


def test_counting_kv_reset_starts_afresh(kv: ActorKv) -> None:
    counting = CountingKv(kv)
    counting.put({b"a": b"1"})
    counting.get([b"a"])
    old = counting.reset()
    assert old.round_trips == Counter({"write": 1, "get": 1})
    assert (old.entries_written, old.bytes_written, old.entries_read, old.bytes_read) == (
        1,
        2,
        1,
        1,
    )
    assert counting.stats == KvStats()
    assert counting.stats.total == 0
    counting.list()
    assert counting.stats.round_trips == Counter({"list": 1})
    assert counting.stats.entries_read == 1
    assert old.round_trips == Counter({"write": 1, "get": 1})  # the returned stats are frozen


# --- FaultyKv: schedules ---------------------------------------------------------------------


def test_faulty_kv_without_faults_is_transparent(kv: ActorKv) -> None:
    faulty = FaultyKv(kv)
    assert isinstance(faulty, ActorKv)
    assert faulty.limits == kv.limits
    gen = faulty.takeover()
    faulty.write(put={b"a": b"1", b"b": b"2"}, delete=[b"c"], fence=gen)
    faulty.delete_range(b"b", b"c")
    assert faulty.get([b"a", b"b"]) == [b"1", None]
    assert faulty.list() == [(b"a", b"1")]
    assert faulty.generation() == gen
    assert faulty.used_bytes() == 2
    faulty.drop()
    assert kv.list() == []
    assert faulty.fired == []


def test_fault_fires_at_exactly_the_scheduled_write_op(kv: ActorKv) -> None:
    faulty = FaultyKv(kv, faults=[Fault(2, FAIL)])  # default group: the write ops
    gen = kv.generation()
    faulty.put({b"a": b"1"})  # call 0, write op 0
    faulty.get([b"a"])  # call 1, not a write op
    faulty.list()  # call 2
    faulty.delete_range(b"x", b"y")  # call 3, write op 1
    assert faulty.fired == []
    with pytest.raises(InjectedUnavailable):
        faulty.takeover()  # call 4, write op 2
    assert faulty.fired == [FiredFault(4, "takeover", FAIL)]
    assert kv.generation() == gen  # not applied
    assert faulty.takeover() == gen + 1  # later ops pass
    faulty.put({b"b": b"2"})
    assert len(faulty.fired) == 1
    assert kv.list() == [(b"a", b"1"), (b"b", b"2")]


@pytest.mark.parametrize("at", [0, 1, 4])
@pytest.mark.parametrize("kind", [FAIL, APPLY])
def test_fault_fires_only_at_its_index(kv: ActorKv, at: int, kind: FaultKind) -> None:
    faulty = FaultyKv(kv, faults=[Fault(at, kind)])
    outcomes: list[str] = []
    for i in range(6):
        try:
            faulty.put({b"k%d" % i: b"v"})
            outcomes.append("ok")
        except InjectedUnavailable:
            outcomes.append("unavailable")
        except InjectedIndeterminate:
            outcomes.append("indeterminate")
    expected = ["ok"] * 6
    expected[at] = "unavailable" if kind is FAIL else "indeterminate"
    assert outcomes == expected
    assert faulty.fired == [FiredFault(at, "write", kind)]
    applied = [k for k, _ in kv.list()]
    assert (b"k%d" % at in applied) is (kind is APPLY)
    assert len(applied) == 5 + (kind is APPLY)


def test_fault_on_a_custom_op_group(kv: ActorKv) -> None:
    kv.put({b"a": b"1"})
    faulty = FaultyKv(kv, faults=[Fault(1, APPLY, ops=frozenset({"get", "list"}))])
    faulty.put({b"b": b"2"})  # not in the group
    assert faulty.get([b"a"]) == [b"1"]  # group op 0
    faulty.put({b"c": b"3"})
    with pytest.raises(InjectedIndeterminate):
        faulty.list()  # group op 1: performed, then the answer is lost
    assert faulty.fired == [FiredFault(3, "list", APPLY)]
    assert faulty.list() == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_apply_then_raise_on_takeover_applies_it(kv: ActorKv) -> None:
    faulty = FaultyKv(kv, faults=[Fault(0, APPLY, ops=frozenset({"takeover"}))])
    gen = kv.generation()
    with pytest.raises(KvIndeterminate):
        faulty.takeover()
    assert kv.generation() == gen + 1
    assert faulty.fired == [FiredFault(0, "takeover", APPLY)]


def test_several_faults_in_several_groups(kv: ActorKv) -> None:
    faulty = FaultyKv(
        kv,
        faults=[
            Fault(0, FAIL),
            Fault(2, APPLY),
            Fault(0, FAIL, ops=frozenset({"get"})),
        ],
    )
    with pytest.raises(InjectedUnavailable):
        faulty.put({b"a": b"1"})  # call 0, write 0
    with pytest.raises(InjectedUnavailable):
        faulty.get([b"a"])  # call 1, get 0
    faulty.put({b"b": b"2"})  # call 2, write 1
    assert faulty.get([b"b"]) == [b"2"]  # call 3, get 1
    with pytest.raises(InjectedIndeterminate):
        faulty.put({b"c": b"3"})  # call 4, write 2
    faulty.put({b"d": b"4"})  # call 5, write 3
    assert faulty.fired == [
        FiredFault(0, "write", FAIL),
        FiredFault(1, "get", FAIL),
        FiredFault(4, "write", APPLY),
    ]
    assert faulty.fired_count() == 3
    assert faulty.fired_count(FAIL) == 2
    assert faulty.fired_count(APPLY) == 1
    assert [k for k, _ in kv.list()] == [b"b", b"c", b"d"]


@pytest.mark.parametrize("first_group", ["write-only", "all-writes"])
@pytest.mark.parametrize("first", [FAIL, APPLY])
def test_overlapping_faults_first_listed_wins(
    kv: ActorKv, first: FaultKind, first_group: str
) -> None:
    # Two groups both due at the same call: the outcome must not depend on set/hash order
    # (it used to vary with PYTHONHASHSEED), so both groups are tried in both list positions.
    second = APPLY if first is FAIL else FAIL
    groups = [frozenset({"write"}), WRITE_OPS]
    if first_group == "all-writes":
        groups.reverse()
    faulty = FaultyKv(kv, faults=[Fault(0, first, ops=groups[0]), Fault(0, second, ops=groups[1])])
    with pytest.raises(InjectedUnavailable if first is FAIL else InjectedIndeterminate):
        faulty.put({b"a": b"1"})
    assert faulty.fired == [FiredFault(0, "write", first)]
    faulty.put({b"b": b"2"})  # both groups moved past position 0
    assert len(faulty.fired) == 1


def test_added_fault_and_disabling(kv: ActorKv) -> None:
    faulty = FaultyKv(kv, faults=[Fault(0, FAIL)])
    faulty.add(Fault(0, APPLY, ops=frozenset({"drop"})))
    faulty.enabled = False
    faulty.put({b"a": b"1"})  # neither fires nor counts while disabled
    faulty.drop()
    faulty.put({b"b": b"2"})
    assert faulty.fired == []
    faulty.enabled = True
    with pytest.raises(InjectedUnavailable):
        faulty.put({b"c": b"3"})
    with pytest.raises(InjectedIndeterminate):
        faulty.drop()
    assert kv.list() == []
    assert faulty.fired == [FiredFault(0, "write", FAIL), FiredFault(1, "drop", APPLY)]


# --- FaultyKv: seeded rates ------------------------------------------------------------------


def run_seeded(
    kv: ActorKv, seed: int, fail_rate: float, indeterminate_rate: float, n: int = 60
) -> tuple[list[FiredFault], list[str]]:
    """Do `n` puts of distinct keys (and a get between them) through a seeded `FaultyKv`."""
    faulty = FaultyKv(kv, seed=seed, fail_rate=fail_rate, indeterminate_rate=indeterminate_rate)
    outcomes: list[str] = []
    for i in range(n):
        try:
            faulty.put({b"k%03d" % i: b"v"})
            outcomes.append("ok")
        except InjectedUnavailable:
            outcomes.append("unavailable")
        except InjectedIndeterminate:
            outcomes.append("indeterminate")
        faulty.get([b"k%03d" % i])  # reads never draw a fault
    return faulty.fired, outcomes


def test_seeded_rates_are_reproducible(open_store: Callable[..., KvStore]) -> None:
    runs = [
        run_seeded(open_store().namespace("a"), seed=1234, fail_rate=0.3, indeterminate_rate=0.2)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    fired, outcomes = runs[0]
    kinds = Counter(f.kind for f in fired)
    assert kinds[FAIL] > 0 and kinds[APPLY] > 0
    assert len(fired) < len(outcomes)
    other = run_seeded(
        open_store().namespace("a"), seed=4321, fail_rate=0.3, indeterminate_rate=0.2
    )
    assert other != runs[0]


def test_seeded_faults_are_all_recorded_and_match_what_happened(kv: ActorKv) -> None:
    fired, outcomes = run_seeded(kv, seed=99, fail_rate=0.25, indeterminate_rate=0.25)
    # Every call is 2 calls apart (put, get); every fault fired on a put.
    assert all(f.op == "write" and f.index % 2 == 0 for f in fired)
    by_put = {f.index // 2: f.kind for f in fired}
    expected = [
        {None: "ok", FAIL: "unavailable", APPLY: "indeterminate"}[by_put.get(i)]
        for i in range(len(outcomes))
    ]
    assert outcomes == expected
    stored = {k for k, _ in kv.list()}
    assert stored == {b"k%03d" % i for i, o in enumerate(outcomes) if o != "unavailable"}


def test_rates_of_one_always_fire_and_only_on_write_ops(kv: ActorKv) -> None:
    failing = FaultyKv(kv, seed=0, fail_rate=1.0)
    for _ in range(5):
        with pytest.raises(InjectedUnavailable):
            failing.put({b"a": b"1"})
        assert failing.get([b"a"]) == [None]
        assert failing.list() == []
    assert failing.fired_count(FAIL) == 5
    assert failing.fired_count() == 5

    lossy = FaultyKv(kv, seed=0, indeterminate_rate=1.0)
    with pytest.raises(InjectedIndeterminate):
        lossy.put({b"a": b"1"})
    assert lossy.get([b"a"]) == [b"1"]
    assert lossy.fired == [FiredFault(0, "write", APPLY)]


def test_rates_of_zero_never_fire(kv: ActorKv) -> None:
    fired, outcomes = run_seeded(kv, seed=5, fail_rate=0.0, indeterminate_rate=0.0)
    assert fired == []
    assert outcomes == ["ok"] * 60


# --- FaultyKv: latency -----------------------------------------------------------------------


def test_latency_is_slept_once_per_call(kv: ActorKv, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(pagekv.kv.wrappers.time, "sleep", slept.append)
    faulty = FaultyKv(kv, latency_ms=7, faults=[Fault(1, FAIL)])
    faulty.put({b"a": b"1"})
    faulty.get([b"a"])
    faulty.list()
    faulty.generation()
    with pytest.raises(InjectedUnavailable):
        faulty.takeover()  # injected failures pay the latency too
    assert slept == [0.007] * 5


def test_no_latency_means_no_sleep(kv: ActorKv, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(pagekv.kv.wrappers.time, "sleep", slept.append)
    faulty = FaultyKv(kv)
    faulty.put({b"a": b"1"})
    faulty.get([b"a"])
    assert slept == []
