"""The proof of `check_backend`: it passes a correct backend written without pagekv's base class,
and catches every broken variant of it (`backends/broken.py`) in the part meant to, with a report
that names the clause and the misbehaving call.

Each broken backend is checked by its part alone, with a few seconds where the default gives the
part 6-12 s, so a catch here is a catch within the default time.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final

import pytest

from pagekv.kv import KvLimits
from pagekv.testing.check import check_backend
from pagekv.testing.fuzz_part import run_fuzz
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import Factory, Subject
from pagekv.testing.violation import Violation
from tests.testing.backends import broken
from tests.testing.backends.broken import BROKEN
from tests.testing.backends.plain import PlainStore, plain_namespace, plain_store

SECONDS: Final = {"contract": 1.0, "concurrent": 2.0, "restart": 2.0, "fuzz": 3.0}
"""The time each part is given here (the contract's clauses always run to the end)."""
READS: Final = ("get", "list", "generation", "used_bytes")
WRITES: Final = ("put", "write", "delete")

EXPECTED: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "entry_by_entry": (("a batch with a rejected entry writes nothing",), ("write",)),
    "signed_order": (("list orders keys bytewise",), ("list",)),
    "range_end_inclusive": (("range is half open",), ("list",)),
    "reverse_limit_wrong_end": (("prefix with reverse and limit",), ("list",)),
    "prefix_of_all_ff_ends_early": (("prefix lists exactly the keys with that prefix",), ("list",)),
    "values_truncated": (("value size boundary",), ("put", "write")),
    "key_limit_off_by_one": (("key size boundary",), ("put",)),
    "batch_entries_unlimited": (("batch entries boundary",), ("put",)),
    "batch_bytes_without_deletes": (("batch bytes count delete keys",), ("write",)),
    "get_keys_unlimited": (("get keys boundary",), ("get",)),
    "overwrite_not_credited": (("quota credits overwrites",), ("put",)),
    "delete_not_refunded": (("quota refunds deletes",), ("delete",)),
    "quota_exact_refused": (("quota exactly at the limit is allowed",), ("put",)),
    "range_ignores_fence": (("stale fence fails and changes nothing",), ("delete_range",)),
    "drop_ignores_fence": (("stale fence fails and changes nothing",), ("drop",)),
    "drop_resets_generation": (("drop removes everything and keeps the generation",), ("drop",)),
    "drop_keeps_cache": (
        ("reads see every write acknowledged before they began", "calls are linearizable"),
        ("drop",),
    ),
    "fence_by_separate_read": (("a fenced write is atomic with its fence check",), WRITES),
    "takeover_not_atomic": (("concurrent takeovers get distinct generations",), ("takeover",)),
    "torn_batch": (
        (
            "a batch is atomic to concurrent readers",
            "a fenced write is atomic with its fence check",
        ),
        WRITES,
    ),
    "generation_not_logged": (("the generation survives a restart",), ("takeover",)),
    "range_not_logged": (
        ("close() keeps everything acknowledged", "acknowledged writes survive a kill"),
        ("delete_range",),
    ),
    "write_behind": (
        ("acknowledged writes survive a kill",),
        (*WRITES, "delete_range", "takeover", "drop"),
    ),
    "values_lose_trailing_zeros": (
        (
            "list returns the stored entries in range, in order",
            "get returns the value last written to each key",
        ),
        ("write",),
    ),
    "list_capped_at_100": (("list returns the stored entries in range, in order",), ("list",)),
    "list_capped_at_1000": (("list returns every entry of a large namespace",), ("list",)),
}
"""Per broken backend: the clauses its part may report (none named: any), and the methods that
misbehave."""

MISSED: Final[dict[str, str]] = {}
"""Broken backends that no part catches yet, and why: strict xfails, so a fix shows."""

SLOW: Final = {"concurrent", "fuzz"}
"""Parts whose findings are minimised for some seconds."""


def _report(parts: list[PartResult]) -> str:
    return "\n".join([p.line() for p in parts] + [v.report() for p in parts for v in p.violations])


def _calls(text: str, methods: tuple[str, ...]) -> bool:
    """Whether `text` (a call as a report shows it, `kv.put(...)` or `put(...)`) calls one of
    `methods`."""
    return any(re.search(rf"(?:^|[.\s]){m}\(", text) for m in methods)


def _names(v: Violation, methods: tuple[str, ...]) -> bool:
    """Whether the report names one of `methods`: as its call, or, when its call is a read that
    showed the damage, as a call before it."""
    if _calls(v.call, methods):
        return True
    return _calls(v.call, READS) and any(_calls(line, methods) for line in v.sequence)


@pytest.mark.parametrize(
    ("factory", "seconds"),
    [(plain_namespace, 4.0), (plain_store, 5.0)],
    ids=["plain_namespace", "plain_store"],
)
def test_a_correct_backend_passes_every_part(factory: object, seconds: float) -> None:
    result = check_backend(factory, seconds=seconds, seed=1)
    assert result.ok, _report(result.parts)
    assert [p.part for p in result.parts] == ["contract", "concurrent", "restart", "fuzz"]
    for part in result.parts:
        assert part.status is not Status.FAILED and not part.violations
        if part.status is Status.NOT_CHECKED or part.not_checked:
            assert factory is plain_namespace, _report(result.parts)
            assert part.not_checked or part.summary, f"{part.part} says not why it did not check"


def _case(name: str) -> object:
    part = BROKEN[name][1]
    marks = [pytest.mark.slow] if part in SLOW else []
    if name in MISSED:
        marks.append(pytest.mark.xfail(reason=MISSED[name], strict=True))
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_case(n) for n in BROKEN])
def test_each_broken_backend_is_caught_by_its_part(name: str) -> None:
    factory, part = BROKEN[name]
    clauses, methods = EXPECTED[name]
    result = check_backend(factory, seconds=SECONDS[part], seed=1, parts=[part])
    (got,) = result.parts
    assert got.status is Status.FAILED, f"{part} missed {name}:\n{_report(result.parts)}"
    assert all(v.part == part for v in got.violations)
    assert any(
        (not clauses or v.clause in clauses) and _names(v, methods) for v in got.violations
    ), f"{part} caught {name} but no report names {clauses} and {methods}:\n" + _report(
        result.parts
    )


def test_every_broken_backend_is_expected_somewhere() -> None:
    assert set(EXPECTED) == set(BROKEN)
    assert {part for _, part in BROKEN.values()} == {"contract", "concurrent", "restart", "fuzz"}
    assert set(MISSED) <= set(BROKEN)


# --- the contract part on its own -----------------------------------------------------------


def test_the_contract_part_catches_a_read_cache_that_drop_leaves_stale() -> None:
    """The drop clause reads every key before the drop (filling any read cache) and after it;
    the report names the drop, not the get that showed it."""
    (part,) = check_backend(broken.drop_keeps_cache, seed=1, parts=["contract"]).parts
    assert part.status is Status.FAILED, part.summary
    (v,) = part.violations
    assert v.clause == "drop removes everything and keeps the generation", v.report()
    assert v.call == "kv.drop()", v.report()
    assert v.got.startswith("kv.get([b'\\x00', "), v.report()
    assert v.got.endswith(
        "(first difference at [0]: b'v:\\x00', expected None; 22 of the 22 "
        "positions compared differ)"
    ), v.report()
    assert "no read cache outlives a drop" in v.requires


@pytest.mark.parametrize(
    ("factory", "clause", "call"),
    [
        (broken.delete_not_refunded, "quota refunds deletes", "kv.delete([b'k', b'missing'])"),
        (broken.delete_not_refunded, "quota refunds delete range and drop", "kv.delete_range("),
        (broken.overwrite_not_credited, "quota credits overwrites", "kv.put({b'k': "),
        (broken.quota_exact_refused, "quota exactly at the limit is allowed", "kv.put({b'c': "),
    ],
)
def test_a_quota_report_names_the_write_not_the_read_that_showed_it(
    factory: Factory, clause: str, call: str
) -> None:
    (part,) = check_backend(factory, seed=1, parts=["contract"]).parts
    v = next((v for v in part.violations if v.clause == clause), None)
    assert v is not None, part.summary
    assert v.call.startswith(call), v.report()


def _capped(factory: Factory, **caps: int) -> Factory:
    """`factory`'s store with limits no larger than `caps`: a backend whose own limits are
    smaller (legal: a namespace advertises the limits it applies), whatever it is asked for."""

    def capped(location: Path, limits: KvLimits | None = None) -> PlainStore:
        asked = limits or KvLimits()
        own = {name: min(cap, getattr(asked, name)) for name, cap in caps.items()}
        store: PlainStore = factory(location, dataclasses.replace(asked, **own))
        return store

    capped.__name__ = capped.__qualname__ = f"{factory.__name__}_capped"
    return capped


ONLY_REFUSED: Final = "only the refusal of one byte more was checked"
SMALLER_LIMITS: Final[dict[str, tuple[dict[str, int], set[str]]]] = {
    "max_batch_entries=25": ({"max_batch_entries": 25}, set()),
    "max_batch_entries=16": ({"max_batch_entries": 16}, set()),
    "max_key_bytes=16": ({"max_key_bytes": 16}, set()),
    "max_batch_bytes=64KiB": ({"max_batch_bytes": 64 * 1024}, {"value size boundary"}),
    "max_storage_bytes=256KiB": (
        {"max_storage_bytes": 256 * 1024},
        {"batch bytes boundary", "batch bytes count delete keys"},
    ),
}
"""Smaller limits a correct backend may have, and the clauses they leave not checked: a value
of max_value_bytes (128 KiB) is over a 64 KiB batch, a batch of max_batch_bytes (976 KiB) over a
256 KiB quota; in each only the refusal of one byte more can be checked."""


@pytest.mark.parametrize("caps", SMALLER_LIMITS, ids=list(SMALLER_LIMITS))
def test_a_correct_backend_with_smaller_limits_passes_the_contract(caps: str) -> None:
    limits, impossible = SMALLER_LIMITS[caps]
    (part,) = check_backend(_capped(plain_store, **limits), seed=1, parts=["contract"]).parts
    assert part.status is Status.PASSED, _report([part])
    assert {r.partition(":")[0] for r in part.not_checked} == impossible, part.not_checked
    assert all(r.endswith(ONLY_REFUSED) for r in part.not_checked), part.not_checked


TINY_LIMITS: Final[dict[str, tuple[dict[str, int], set[str]]]] = {
    "max_batch_entries=1": (
        {"max_batch_entries": 1},
        {"delete range is not bounded by the batch limit"},
    ),
    "max_key_bytes=1": (
        {"max_key_bytes": 1},
        {"value size boundary", "namespace names are kept apart"},
    ),
    "max_value_bytes=1": ({"max_value_bytes": 1}, {"namespace names are kept apart"}),
    "max_batch_bytes=1": ({"max_batch_bytes": 1}, set()),
    "max_storage_bytes=16KiB": (
        {"max_storage_bytes": 16 * 1024},
        {"a list limit beyond any count means all"},
    ),
}
"""Limits too small for most clauses (and, but the quota, for the VFS), and clauses that must
still hold under them: each of those once failed a correct backend by writing more at once
than the limits allow (two entries, a two-byte key, the name as a value, four fillers)."""


@pytest.mark.parametrize("caps", TINY_LIMITS, ids=list(TINY_LIMITS))
def test_limits_too_small_for_a_clause_leave_it_not_checked_never_failed(caps: str) -> None:
    limits, holding = TINY_LIMITS[caps]
    (part,) = check_backend(_capped(plain_store, **limits), seed=1, parts=["contract"]).parts
    assert part.status is Status.PASSED, _report([part])
    skipped = {r.partition(":")[0] for r in part.not_checked}
    assert not holding & skipped, part.not_checked


@pytest.mark.parametrize("caps", [c for c in TINY_LIMITS if "storage" not in c])
def test_limits_too_small_for_the_vfs_leave_the_fuzz_part_not_checked(caps: str) -> None:
    """The monitor admitted every call: the same steps fail on pagekv's memory store too."""
    subject = Subject(_capped(plain_store, **TINY_LIMITS[caps][0]))
    try:
        result = run_fuzz(subject, seconds=0.3, seed=1)
    finally:
        subject.close()
    assert result.status is Status.NOT_CHECKED, _report([result])
    (reason,) = result.not_checked
    assert "they fail on pagekv's memory store with the same limits too" in reason, reason
    assert result.summary.startswith("none of ") and "as the model requires" not in result.summary


@pytest.mark.parametrize(
    ("name", "caps", "clause"),
    [
        ("list_capped_at_1000", "max_batch_entries=16", "list returns every entry of a large "),
        ("entry_by_entry", "max_key_bytes=16", "a batch with a rejected entry writes nothing"),
        ("batch_bytes_without_deletes", "max_storage_bytes=256KiB", "batch bytes count delete"),
        ("values_truncated", "max_batch_entries=25", "value size boundary"),
    ],
)
def test_a_broken_backend_with_smaller_limits_is_still_caught(
    name: str, caps: str, clause: str
) -> None:
    factory = _capped(BROKEN[name][0], **SMALLER_LIMITS[caps][0])
    (part,) = check_backend(factory, seed=1, parts=["contract"]).parts
    assert part.status is Status.FAILED, part.summary
    assert any(v.clause.startswith(clause) for v in part.violations), _report([part])
