"""The contract clauses: they hold on the memory backend, and each of a few realistic bugs is
caught by the clause about it, with a report naming the call that showed it.

The broken namespaces here are small wrappers over a memory namespace, each with one bug; the
wider set of broken backends, for the whole check, is in `backends/`.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pagekv.kv import (
    ActorKv,
    KvIndeterminate,
    KvLimits,
    KvUnavailable,
    MemoryStore,
    StorageQuotaExceeded,
)
from pagekv.testing import (
    CLAUSES,
    Clause,
    NotChecked,
    Status,
    Subject,
    Violation,
    check_backend,
    run_clause,
)
from pagekv.testing.clauses import ATTEMPTS
from pagekv.testing.contract_data import ORDERED_KEYS
from pagekv.testing.model import RESULT_TYPES_REQUIRES
from pagekv.testing.subject import Factory
from tests.testing.backends.plain import PlainKv, PlainStore

pytest_plugins = ["pytester"]

REOPENING = {
    "data persists across reopen",
    "takeover through another store fences the first",
    "concurrent takeovers through two stores are distinct",
}
"""The clauses that need a factory taking `location=`."""
STORES = {
    "namespaces are isolated",
    "two handles of one namespace share it",
    "namespace names are kept apart",
    "a namespace name outside the contract is refused",
    "takeover through another handle fences the first",
    "quota is per namespace",
    "a store applies the name limit it was opened with",
}
"""The clauses that need a factory returning stores (and not needing `location=`)."""
SMALL_LIMITS = {
    "a batch over quota writes nothing",
    "a store applies the limits it was opened with",
    "quota exactly at the limit is allowed",
    "quota one byte over fails",
    "quota credits overwrites",
    "quota refunds deletes",
    "quota refunds delete range and drop",
}
"""The clauses that need a factory taking `limits=` (and not needing a store)."""


def _clause(name: str) -> Clause:
    return next(c for c in CLAUSES if c.name == name)


def _not_checked(factory: Factory) -> set[str]:
    """Run every clause against `factory`: a violation fails the test; the names not checked."""
    skipped: set[str] = set()
    for c in CLAUSES:
        subject = Subject(factory)
        try:
            run_clause(subject, c)
        except NotChecked:
            skipped.add(c.name)
        finally:
            subject.close()
    return skipped


def test_the_ordered_keys_are_in_bytewise_order() -> None:
    assert sorted(ORDERED_KEYS) == ORDERED_KEYS
    assert len(set(ORDERED_KEYS)) == len(ORDERED_KEYS)


def test_every_clause_holds_on_a_memory_store() -> None:
    def memory_store(limits: KvLimits | None = None) -> MemoryStore:
        return MemoryStore(limits=limits)

    assert _not_checked(memory_store) == REOPENING


def test_every_clause_holds_on_memory_namespaces_the_store_clauses_not_checked() -> None:
    def memory_namespace(limits: KvLimits | None = None) -> ActorKv:
        return MemoryStore(limits=limits).namespace("ns")

    def without_limits() -> ActorKv:
        return MemoryStore().namespace("ns")

    assert _not_checked(memory_namespace) == REOPENING | STORES
    assert _not_checked(without_limits) == REOPENING | STORES | SMALL_LIMITS


# --- broken namespaces -----------------------------------------------------------------------


class _Wrapped:
    """A memory namespace, but for the one method a subclass breaks; `put` and `delete` go
    through `write`, as a backend's shorthands do."""

    def __init__(self, limits: KvLimits | None = None) -> None:
        self.inner = MemoryStore(limits=limits).namespace("broken")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def limits(self) -> KvLimits:
        return self.inner.limits

    def write(self, *, put: Any = (), delete: Sequence[bytes] = (), fence: Any = None) -> None:
        self.inner.write(put=put, delete=delete, fence=fence)

    def put(self, entries: Any, *, fence: Any = None) -> None:
        self.write(put=entries, fence=fence)

    def delete(self, keys: Sequence[bytes], *, fence: Any = None) -> None:
        self.write(delete=keys, fence=fence)


def _items(entries: Any) -> Iterable[tuple[Any, Any]]:
    return entries.items() if isinstance(entries, Mapping) else entries


class SignedOrder(_Wrapped):
    """Compares keys as signed bytes (C's `char`): b'\\x80' sorts before b'\\x00'."""

    def list(self, *, limit: Any = None, reverse: Any = False, **bounds: Any) -> Any:
        found = self.inner.list(**bounds)
        found.sort(key=lambda e: [b - 256 if b > 127 else b for b in e[0]], reverse=reverse)
        return found[:limit] if limit else found


class EndInclusive(_Wrapped):
    """Lists `start <= key <= end`: a BETWEEN where the contract's range is half open."""

    def list(self, *, end: Any = None, **rest: Any) -> Any:
        return self.inner.list(end=None if end is None else end + b"\x00", **rest)


class ReverseLimitFromTheStart(_Wrapped):
    """`reverse=True, limit=n` takes the first n keys and reverses them, not the last n."""

    def list(self, *, limit: Any = None, reverse: Any = False, **bounds: Any) -> Any:
        found = self.inner.list(limit=limit, **bounds)
        return found[::-1] if reverse else found


class Truncating(_Wrapped):
    """Stores at most 64 KiB of a value (a column too narrow), silently."""

    def write(self, *, put: Any = (), delete: Sequence[bytes] = (), fence: Any = None) -> None:
        cut = [(k, v[: 64 * 1024]) for k, v in _items(put)]
        self.inner.write(put=cut, delete=delete, fence=fence)


class NoOverwriteCredit(_Wrapped):
    """Checks the quota as if every put were a new entry: an overwrite is charged in full."""

    def write(self, *, put: Any = (), delete: Sequence[bytes] = (), fence: Any = None) -> None:
        entries = list(_items(put))
        after = self.inner.used_bytes() + sum(len(k) + len(v) for k, v in entries)
        if after > self.limits.max_storage_bytes:
            raise StorageQuotaExceeded("storage", after, self.limits.max_storage_bytes)
        self.inner.write(put=entries, delete=delete, fence=fence)


class EntryByEntry(_Wrapped):
    """Applies a batch one entry at a time: a rejected entry leaves the ones before it written."""

    def write(self, *, put: Any = (), delete: Sequence[bytes] = (), fence: Any = None) -> None:
        for key, value in _items(put):
            self.inner.write(put={key: value}, fence=fence)
        for key in delete:
            self.inner.write(delete=[key], fence=fence)


@pytest.mark.parametrize(
    ("broken", "clause", "call"),
    [
        (SignedOrder, "list orders keys bytewise", "kv.list()"),
        (EndInclusive, "range is half open", "kv.list(start=b'a\\x00', end=b'a\\xff')"),
        (
            ReverseLimitFromTheStart,
            "prefix with reverse and limit",
            "kv.list(prefix=b'a', reverse=True, limit=3)",
        ),
        (Truncating, "value size boundary", "kv.put({b'k'"),
        (NoOverwriteCredit, "quota credits overwrites", "kv.put({b'k': b'aaaaaaaa'+(59 bytes)})"),
        (EntryByEntry, "a batch with a rejected entry writes nothing", "kv.write(put={b'new'"),
    ],
)
def test_a_broken_namespace_is_caught_by_its_clause(
    broken: type[_Wrapped], clause: str, call: str
) -> None:
    subject = Subject(broken, broken.__name__)
    try:
        with pytest.raises(Violation) as caught:
            run_clause(subject, _clause(clause))
    finally:
        subject.close()
    v = caught.value
    assert v.clause == clause
    assert v.call.startswith(call), v.report()
    assert v.requires and v.got, v.report()
    assert any(line.startswith(v.call) for line in v.sequence), v.report()
    assert v.report().startswith(f"contract: {clause}\n  requires: {v.requires}")


def test_a_report_says_where_a_long_list_first_differs() -> None:
    """`list()` of 22 keys is shown in part; where it goes wrong is said."""
    subject = Subject(SignedOrder)
    try:
        with pytest.raises(Violation) as caught:
            run_clause(subject, _clause("list orders keys bytewise"))
    finally:
        subject.close()
    assert "first difference at [0]: (b'\\x80', b'v:\\x80'), expected (b'\\x00'" in caught.value.got


def test_a_batch_left_half_written_is_reported_as_the_refused_write() -> None:
    subject = Subject(EntryByEntry)
    try:
        with pytest.raises(Violation) as caught:
            run_clause(subject, _clause("a batch with a rejected entry writes nothing"))
    finally:
        subject.close()
    v = caught.value
    assert "ValueTooLarge and writes none of its entries (contents must not change)" in v.requires
    assert "b'new'" in v.got  # what the list() after it showed
    assert v.call.startswith("kv.write(")
    assert v.sequence[-4] == f"{v.call} raised {v.sequence[-4].partition(' raised ')[2]}"
    assert "raised ValueTooLarge" in v.sequence[-4]


def test_a_report_shows_the_items_a_list_lacks_and_has_too_many() -> None:
    """Past the first difference, what is missing and what is extra are named item by item,
    not hidden behind the `...N more` of a long list."""
    subject = Subject(EndInclusive)
    try:
        with pytest.raises(Violation) as caught:
            run_clause(subject, _clause("range is half open"))
    finally:
        subject.close()
    got = caught.value.got
    assert "7 items, expected 6; the first 6 as expected, then more from [6]" in got, got
    assert "extra 1: (b'a\\xff', b'v:a\\xff')" in got, got


class CappedList(_Wrapped):
    """Returns at most 1,000 entries from a `list` (a page, its continuation dropped)."""

    def list(self, *, limit: Any = None, **rest: Any) -> Any:
        return self.inner.list(limit=1000 if limit is None else min(limit, 1000), **rest)


def test_a_list_capped_at_a_page_is_caught_with_what_it_lacks() -> None:
    subject = Subject(CappedList)
    try:
        with pytest.raises(Violation) as caught:
            run_clause(subject, _clause("list returns every entry of a large namespace"))
    finally:
        subject.close()
    v = caught.value
    assert v.call == "kv.list()", v.report()
    assert "1000 items, expected 1500; the first 1000 as expected" in v.got, v.report()
    assert "missing 500: (b'n1000', b'1000'), (b'n1001', b'1001')" in v.got, v.report()


# --- result types ------------------------------------------------------------------------------


class BytearrayValues(_Wrapped):
    """Returns values as the `bytearray`s a C client library hands out."""

    def get(self, keys: Any) -> Any:
        return [None if v is None else bytearray(v) for v in self.inner.get(keys)]


class ListPairs(_Wrapped):
    """Returns entries as `[key, value]` lists, as a JSON round trip does."""

    def list(self, **kwargs: Any) -> Any:
        return [[k, v] for k, v in self.inner.list(**kwargs)]


class BoolGeneration(_Wrapped):
    """Returns the generation of a fresh namespace as False (a NULL column read as a bool)."""

    def generation(self) -> Any:
        return self.inner.generation() or False


@pytest.mark.parametrize(
    ("broken", "call", "got"),
    [
        (
            BytearrayValues,
            "kv.get(",
            "returned bytearray at [0]: b'v:\\xff'; the contract requires bytes (or None",
        ),
        (ListPairs, "kv.list(", "returned list at [0]: [b'\\x00', b'v:\\x00']; the contract "),
        (BoolGeneration, "kv.generation()", "returned bool: False; the contract requires an int"),
    ],
)
def test_a_result_of_another_type_is_a_type_violation_naming_the_call(
    broken: type[_Wrapped], call: str, got: str
) -> None:
    """Equal is not enough: a bytearray equals bytes, and a [key, value] list reads like a pair,
    but the contract's results are of its types. Every broken clause says so."""
    (part,) = check_backend(broken, parts=["contract"], seed=1).parts
    assert part.status is Status.FAILED
    assert part.violations
    assert all("the contract requires" in v.got for v in part.violations), part.violations
    v = part.violations[0]
    assert v.call.startswith(call) and v.got.startswith(got), v.report()
    assert v.requires == RESULT_TYPES_REQUIRES, v.report()


# --- transient errors ----------------------------------------------------------------------------


class _Faulty:
    """A namespace of a `PlainStore` whose calls fail as `fault(method)` says: `before` raises
    `KvUnavailable` before the call (having read its arguments: an iterator is used up), `after`
    makes the call and then raises `KvIndeterminate`, `None` lets it be."""

    def __init__(self, inner: PlainKv, fault: Callable[[str], str | None]) -> None:
        self._inner = inner
        self._fault = fault

    @property
    def limits(self) -> KvLimits:
        return self._inner.limits

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._inner, method)

        def faulty(*args: Any, **kwargs: Any) -> Any:
            fault = self._fault(method)
            if fault == "before":
                for arg in (*args, *kwargs.values()):
                    if isinstance(arg, Iterator):
                        list(arg)
                raise KvUnavailable(f"injected: {method} not sent")
            result = call(*args, **kwargs)
            if fault == "after":
                raise KvIndeterminate(f"injected: {method} sent, its answer lost")
            return result

        return faulty


def _faulty_store(fault: Callable[[str], str | None]) -> Factory:
    """A factory of plain stores whose namespaces fail as `fault` says."""

    class FaultyStore(PlainStore):
        def namespace(self, name: str) -> Any:
            return _Faulty(super().namespace(name), fault)

    def faulty_store(location: Path, limits: KvLimits | None = None) -> PlainStore:
        return FaultyStore(location, limits)

    return faulty_store


def _sometimes(kind: str, rate: float, but: str = "") -> Callable[[str], str | None]:
    draw = random.Random(3).random
    return lambda method: kind if method != but and draw() < rate else None


def test_a_backend_unavailable_now_and_then_passes() -> None:
    """`KvUnavailable` on 1 call in 20: nothing was applied, so the call is made again."""
    (part,) = check_backend(_faulty_store(_sometimes("before", 0.05)), parts=["contract"]).parts
    assert part.status is Status.PASSED and not part.not_checked, part.summary
    assert not part.violations, part.violations[0].report()


def test_a_backend_indeterminate_now_and_then_passes_but_a_takeover_is_not_checked() -> None:
    """`KvIndeterminate` after applying, on 1 call in 20 but takeover: reads and every other
    write come out of a repeat as from one call. A takeover's cannot: its clause is not checked."""
    (part,) = check_backend(
        _faulty_store(_sometimes("after", 0.05, but="takeover")), parts=["contract"]
    ).parts
    assert part.status is Status.PASSED and not part.not_checked, part.summary
    assert not part.violations, part.violations[0].report()
    (part,) = check_backend(
        _faulty_store(lambda m: "after" if m == "takeover" else None), parts=["contract"]
    ).parts
    assert not part.violations, part.violations[0].report()
    assert "takeover increments the generation by exactly one: kv.takeover() raised " in (
        "\n".join(part.not_checked)
    )
    assert all("whether it took over is unknown" in reason for reason in part.not_checked)


def test_a_backend_never_available_is_not_checked_not_failed() -> None:
    """Only the clauses of namespace names, which make no call of a namespace, hold."""
    (part,) = check_backend(_faulty_store(lambda m: "before"), parts=["contract"]).parts
    assert not part.violations, part.violations[0].report()
    held = {c.name for c in CLAUSES} - {r.partition(":")[0] for r in part.not_checked}
    assert held == {
        "a namespace name outside the contract is refused",
        "a store applies the name limit it was opened with",
    }
    assert all(f"KvUnavailable {ATTEMPTS} times in a row" in r for r in part.not_checked)


def test_a_repeated_call_is_sent_its_iterator_arguments_whole() -> None:
    """Every first try fails having used up its iterator: the repeat must get all of it."""
    flip = iter(itertools.cycle(["before", None]))
    factory = _faulty_store(lambda method: next(flip))
    for name in (
        "get returns values in request order with none for missing",
        "put takes a mapping or pairs and the last put of a key wins",
    ):
        subject = Subject(factory)
        try:
            run_clause(subject, _clause(name))
        finally:
            subject.close()


# --- stores --------------------------------------------------------------------------------------


def test_each_store_a_clause_opens_is_closed_exactly_once() -> None:
    closes: dict[int, int] = {}

    class Counted(PlainStore):
        def close(self) -> None:
            closes[id(self)] = closes.get(id(self), 0) + 1
            super().close()

    opened: list[PlainStore] = []

    def counted(location: Path, limits: KvLimits | None = None) -> PlainStore:
        opened.append(Counted(location, limits))
        return opened[-1]

    (part,) = check_backend(counted, parts=["contract"]).parts
    assert part.status is Status.PASSED and not part.not_checked, part.summary
    assert len(opened) > len(CLAUSES)
    assert {closes.get(id(store)) for store in opened} == {1}


def test_a_store_refusing_a_second_open_of_its_location_leaves_those_clauses_not_checked() -> None:
    """Refused when the second store opens, or when it opens its first namespace."""
    in_use: set[Path] = set()

    class Exclusive(PlainStore):
        def __init__(self, location: Path, limits: KvLimits | None = None) -> None:
            super().__init__(location, limits)
            self._at = location.resolve()
            self._first = self._at not in in_use
            in_use.add(self._at)

        def namespace(self, name: str) -> PlainKv:
            if not self._first:
                raise RuntimeError(f"{self._at} is locked by another store")
            return super().namespace(name)

        def close(self) -> None:
            if self._first:
                in_use.discard(self._at)
            super().close()

    def exclusive(location: Path, limits: KvLimits | None = None) -> PlainStore:
        return Exclusive(location, limits)

    (part,) = check_backend(exclusive, parts=["contract"]).parts
    assert part.status is Status.PASSED and not part.violations, part.violations[0].report()
    two_stores = REOPENING - {"data persists across reopen"}
    assert {r.partition(":")[0] for r in part.not_checked} == two_stores, part.not_checked
    for reason in part.not_checked:
        assert ": the factory cannot open a second store at a location in use: RuntimeError: " in (
            reason
        )
        assert reason.endswith("is locked by another store"), reason


# --- the pytest face -------------------------------------------------------------------------


def test_kv_contract_runs_each_clause_as_a_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """
            import pytest
            from pagekv.kv import MemoryStore
            from pagekv.testing import KvContract

            class Early:
                def __init__(self):
                    self.inner = MemoryStore().namespace("x")
                def __getattr__(self, name):
                    return getattr(self.inner, name)
                def takeover(self):
                    return self.inner.takeover() + 1

            class TestMemoryNamespaces(KvContract):
                @pytest.fixture
                def kv_factory(self):
                    return lambda limits=None: MemoryStore(limits=limits).namespace("x")

            class TestEarly(KvContract):
                @pytest.fixture
                def kv_factory(self):
                    return Early
            """
        )
    )
    result = pytester.runpytest_inprocess("-q", "-rs", "-k", "Memory or (Early and increments)")
    skipped = len(REOPENING | STORES)
    result.assert_outcomes(passed=len(CLAUSES) - skipped, skipped=skipped, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*TestEarly.test_clause?takeover increments the generation by exactly one? _*",
            "contract: takeover increments the generation by exactly one",
            "  requires: takeover() number 1 returns 0 + 1",
            "  call:     kv.takeover()",
            "  got:      2",
            "  expected: 1",
        ]
    )
    assert "During handling" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*not checked: needs a store: the factory returns namespaces*"])


def test_the_pytest_suite_is_the_only_module_that_imports_pytest() -> None:
    code = (
        "import sys, pagekv.testing, pagekv.testing.contract, pagekv.testing.check; "
        "assert 'pytest' not in sys.modules, 'pytest imported'; "
        "pagekv.testing.KvContract; assert 'pytest' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
