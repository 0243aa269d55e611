"""The contract clauses: they hold on the memory backend, and each of a few realistic bugs is
caught by the clause about it, with a report naming the call that showed it.

The broken namespaces here are small wrappers over a memory namespace, each with one bug; the
wider set of broken backends, for the whole check, is in `backends/`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from pagekv.kv import ActorKv, KvLimits, MemoryStore, StorageQuotaExceeded
from pagekv.testing import CLAUSES, Clause, NotChecked, Subject, Violation, run_clause
from pagekv.testing.contract_data import ORDERED_KEYS
from pagekv.testing.subject import Factory

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
        (Truncating, "value size boundary", "kv.get([b'ok'])"),
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
