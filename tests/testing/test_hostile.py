"""`check_backend` against correct but odd backends and hostile ones (`backends/hostile.py`):
every part gets a verdict, none crashes or hangs, and none convicts a backend for what the
contract allows (transient errors, a first generation other than 0, a second store refused)."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pagekv.kv import KvLimits, MemoryStore
from pagekv.testing.check import CheckResult, check_backend
from pagekv.testing.concurrent import KV_ERRORS, Program, run_concurrent
from pagekv.testing.fuzz_part import replay_fuzz, run_fuzz
from pagekv.testing.model import RESULT_TYPES, RESULT_TYPES_REQUIRES, Op
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.restart import Scenario, run_restart
from pagekv.testing.subject import RETURNS, Subject, UsageError
from tests.testing.backends import hostile
from tests.testing.backends.plain import plain_namespace, plain_store


def _part(run: Callable[..., PartResult], factory: Any, seconds: float) -> PartResult:
    subject = Subject(factory)
    try:
        return run(subject, seconds=seconds, seed=4)
    finally:
        subject.close()


def _report(result: PartResult) -> str:
    return "\n".join([result.line(), *result.not_checked, *(v.report() for v in result.violations)])


# --- correct but odd: not convicted ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["unavailable", "indeterminate"])
def test_transient_errors_do_not_fail_the_restart_part(mode: str) -> None:
    """KvUnavailable is made again; after KvIndeterminate the namespace is read back and the
    model follows it, applied or not."""
    hostile.Flaky.raised.clear()
    result = _part(run_restart, hostile.flaky_store(mode), 0.5)
    assert hostile.Flaky.raised[mode] > 0, "the flaky store never failed a call"
    assert result.status is Status.PASSED, _report(result)


@pytest.mark.parametrize("mode", ["unavailable", "indeterminate"])
def test_transient_errors_do_not_fail_the_fuzz_part(mode: str) -> None:
    """The VFS takes a KV error as fatal: an indeterminate write ends its run not checked."""
    hostile.Flaky.raised.clear()
    result = _part(run_fuzz, hostile.flaky_store(mode), 0.5)
    assert hostile.Flaky.raised[mode] > 0, "the flaky store never failed a call"
    assert result.status is Status.PASSED, _report(result)
    if mode == "indeterminate":
        assert any("KvIndeterminate" in reason for reason in result.not_checked), _report(result)
    else:
        assert not result.not_checked, _report(result)


def test_transient_errors_in_a_rounds_setup_do_not_crash_the_concurrent_part() -> None:
    hostile.Flaky.raised.clear()
    result = _part(run_concurrent, hostile.flaky_store("unavailable"), 0.5)
    assert hostile.Flaky.raised["unavailable"] > 0
    assert result.status is Status.PASSED, _report(result)


def test_a_fresh_namespace_need_not_start_at_generation_0() -> None:
    subject = Subject(hostile.offset_store)
    try:
        kv = subject.namespace()
        assert kv.generation() == hostile.Offset.OFFSET
    finally:
        subject.close()
    result = _part(run_restart, hostile.offset_store, 0.5)
    assert result.status is Status.PASSED, _report(result)


def test_a_store_refusing_a_second_open_leaves_those_programs_not_checked() -> None:
    result = _part(run_concurrent, hostile.exclusive_store, 0.5)
    assert result.status is Status.PASSED, _report(result)
    (reason,) = result.not_checked
    assert "two stores open at one location" in reason and "BlockingIOError" in reason, reason


@pytest.mark.parametrize(
    "factory",
    [
        hostile.flaky_store("unavailable"),
        hostile.flaky_store("indeterminate"),
        hostile.offset_store,
        hostile.exclusive_store,
    ],
    ids=["unavailable", "indeterminate", "offset", "exclusive"],
)
def test_the_correct_but_odd_backends_keep_every_clause(factory: Any) -> None:
    """Every clause holds or is not checked: a stale fence is stale by the namespace's own
    numbering (from 1000 on), a refused second store leaves its clauses not checked."""
    (contract,) = check_backend(factory, parts=["contract"], seed=4).parts
    assert contract.status is Status.PASSED, _report(contract)


# --- hostile: a verdict naming the call ------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "method", "type_name"),
    [(hostile.bytearray_store, "get(", "bytearray"), (hostile.list_pairs_store, "list(", "list")],
    ids=["bytearray-values", "list-pairs"],
)
def test_results_of_another_type_fail_the_concurrent_part(
    factory: Any, method: str, type_name: str
) -> None:
    result = _part(run_concurrent, factory, 1.0)
    violation = result.violation
    assert result.status is Status.FAILED and violation is not None, _report(result)
    assert violation.clause == RESULT_TYPES, violation
    assert method in violation.call, violation
    assert violation.got.startswith(f"returned {type_name} at [0]"), violation
    assert result.found_after is not None and 0 <= result.found_after <= result.seconds
    assert "found after" in result.line()


@pytest.mark.parametrize(
    "run",
    [
        lambda factory: check_backend(factory, parts=["contract"], seed=4).parts[0],
        lambda factory: _part(run_concurrent, factory, 1.0),
        lambda factory: _part(run_restart, factory, 0.5),
        lambda factory: _part(run_fuzz, factory, 1.0),
    ],
    ids=["contract", "concurrent", "restart", "fuzz"],
)
def test_a_result_of_another_type_is_reported_in_the_same_words_by_every_part(
    run: Callable[[Any], PartResult],
) -> None:
    """One wording (`model.wrong_type`): the type, where, the value, what the contract requires
    there. (The restart part reads with `list`, not `get`: a `[key, value]` list reaches all.)"""
    result = run(hostile.list_pairs_store)
    violation = result.violation
    assert result.status is Status.FAILED and violation is not None, _report(result)
    assert violation.requires == RESULT_TYPES_REQUIRES, violation
    if violation.part != "contract":  # the contract part names the clause that made the call
        assert violation.clause == RESULT_TYPES, violation
    wording = r"list\(.*?\) returned list at \[\d+\]: \[b'.*\]; the contract requires (.*)$"
    words = re.search(wording, f"{violation.call} {violation.got}")
    assert words is not None, violation
    assert words[1] == "a (key, value) tuple", violation


def test_system_exit_from_a_backend_is_its_error_not_the_checks_exit() -> None:
    result = _part(run_concurrent, hostile.Exits, 0.5)
    violation = result.violation
    assert violation is not None and violation.clause == KV_ERRORS, _report(result)
    assert "SystemExit" in violation.got and "list()" in violation.call, violation
    contract = check_backend(hostile.Exits, parts=["contract"], seed=1).parts[0]
    assert contract.status is Status.FAILED
    assert any("SystemExit(7)" in v.got for v in contract.violations), _report(contract)


def _in_thread(check: Callable[[], CheckResult]) -> CheckResult:
    """`check()` on a thread of its own, so that a hang fails the test instead of hanging it."""
    results: list[CheckResult] = []
    thread = threading.Thread(target=lambda: results.append(check()), daemon=True)
    thread.start()
    thread.join(60)
    assert results, "the check did not return"
    return results[0]


@pytest.mark.parametrize(
    ("method", "parts"),
    [("list", ["contract", "concurrent"]), ("get", ["concurrent", "fuzz"]), ("get", ["fuzz"])],
    ids=["contract", "concurrent", "fuzz"],
)
def test_a_call_that_never_returns_fails_its_part_and_the_rest_are_not_run(
    method: str, parts: list[str]
) -> None:
    factory, release = hostile.hanging(method)
    try:
        result = _in_thread(
            lambda: check_backend(factory, parts=parts, seconds=2, seed=1, call_timeout=0.5)
        )
    finally:
        release.set()
    hung, *skipped = result.parts
    assert hung.status is Status.FAILED, hung.line()
    assert hung.violation is not None and hung.violation.clause == RETURNS, hung.violation
    assert f"{method}(" in hung.violation.call, hung.violation
    assert hung.violation.got == "did not return within 0.5 s", hung.violation
    for part in skipped:
        assert part.status is Status.NOT_CHECKED and "not run" in part.summary, part.line()
    if hung.part == "contract":  # the clauses after the hung one: counted, and said in one line
        (unrun,) = hung.not_checked
        assert unrun.endswith(f"not run, kv.{method}() did not return within 0.5 s"), unrun
        count = int(unrun.split()[1])
        assert count > 0 and hung.summary.endswith(f", 1 broken, {count} not checked"), hung.line()


# --- time ------------------------------------------------------------------------------------


def test_no_parts_is_refused() -> None:
    with pytest.raises(ValueError, match="no parts to run; the parts are contract, concurrent"):
        check_backend(plain_namespace, parts=[])


def test_parts_shrink_to_the_time_the_contract_leaves() -> None:
    """The clauses take a second or more; a check of 0.01 s has no time left for the rest."""
    result = check_backend(plain_namespace, seconds=0.01, seed=1, parts=["contract", "fuzz"])
    contract, fuzz = result.parts
    assert contract.status is Status.PASSED
    assert fuzz.status is Status.NOT_CHECKED and "used up" in fuzz.summary, fuzz.line()
    assert result.checked and result.ok


def test_a_restart_run_of_almost_no_time_makes_one_run() -> None:
    result = _part(run_restart, plain_store, 0.001)
    assert result.status is Status.PASSED
    assert result.summary.startswith("1 runs, "), result.summary


# --- factories ------------------------------------------------------------------------------


def test_a_compiled_class_is_passed_the_keywords_its_signature_marks_positional_only() -> None:
    """mypyc marks every parameter of a class positional-only (`(limits=None, ..., /)`), yet
    takes them by keyword."""
    assert next(iter(inspect.signature(MemoryStore).parameters.values())).kind is (
        inspect.Parameter.POSITIONAL_ONLY
    )
    subject = Subject(MemoryStore)
    try:
        assert subject.takes_limits and subject.returns_store
        assert subject.namespace(KvLimits(max_key_bytes=16)).limits.max_key_bytes == 16
    finally:
        subject.close()


class Unreadable:
    """A store class whose signature cannot be read: which keywords it takes is found by
    calling it."""

    __signature__ = "not a signature"

    def __init__(self, *, limits: KvLimits | None = None) -> None:
        self.store = MemoryStore(limits=limits)

    def namespace(self, name: str) -> Any:
        return self.store.namespace(name)

    def close(self) -> None:
        self.store.close()


def test_a_factory_whose_signature_cannot_be_read_is_tried_with_keywords() -> None:
    with pytest.raises(TypeError):
        inspect.signature(Unreadable)
    subject = Subject(Unreadable)
    try:
        assert subject.takes_limits and not subject.takes_location
    finally:
        subject.close()


# --- replays ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"method": "__init__", "args": [], "kwargs": {"dict": []}},
        {"method": "limits", "args": [], "kwargs": {"dict": []}},
        {"method": "close", "args": [], "kwargs": {"dict": []}},
        {"method": "get", "args": [], "kwargs": {"dict": []}},
        {"method": "get", "args": [[{"hex": "zz"}]], "kwargs": {"dict": []}},
        {"method": "get", "args": [["a"]], "kwargs": {"dict": []}},
        {"method": "takeover", "args": [], "kwargs": {"dict": [["fence", 1]]}},
        {"method": "put", "args": [{"dict": [[{"hex": "61"}]]}], "kwargs": {"dict": []}},
        ["get"],
    ],
    ids=[
        "dunder",
        "property",
        "not-an-actorkv-method",
        "arguments-missing",
        "bad-hex",
        "a-string-key",
        "keyword-not-taken",
        "pair-of-one",
        "not-an-object",
    ],
)
def test_a_replayed_call_other_than_the_parts_make_is_refused(data: Any) -> None:
    with pytest.raises(UsageError, match="a replayed call is malformed"):
        Op.from_json(data)


def test_replayed_calls_round_trip() -> None:
    for op in (
        Op.of("put", {b"a": b"\x00\xff"}, fence=3),
        Op.of("write", put={b"a": b"1"}, delete=[b"b"]),
        Op.of("list", start=b"b", reverse=True, limit=2),
        Op.of("delete_range", b"a", b"c"),
    ):
        assert Op.from_json(op.to_json()) == op


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"threads": []}, "1 to 16 threads"),
        ({"threads": [[]]}, "1 to 100 steps"),
        ({"handles": "many", "threads": [[]]}, "must name its handles"),
        (
            {"threads": [[{"op": Op.of("get", [b"a"]).to_json(), "fenced": True}]]},
            "a fenced step must be a write",
        ),
    ],
)
def test_a_malformed_concurrent_program_is_refused(data: Any, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        Program.from_json(data)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"kind": "clean", "names": ["/etc"], "steps": []}, "names are some of"),
        ({"kind": "kill", "names": ["pagekv-check"], "steps": []}, "exactly one restart step"),
        (
            {"kind": "kill", "names": ["pagekv-check"], "steps": [{"restart": True}], "delay": 1e9},
            "delay is 0 to 1 s",
        ),
        (
            {"kind": "clean", "names": ["pagekv-check"], "steps": [{"ns": 1, "op": {}}]},
            "ns must be below 1",
        ),
    ],
)
def test_a_malformed_restart_scenario_is_refused(data: Any, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        Scenario.from_json(data)


def test_a_fuzz_replay_runs_only_steps_of_its_run(tmp_path: Path) -> None:
    """A finding replays; a file's own SQL (here one that would write a file of its choosing
    beside the scratch database) is refused before anything runs."""
    subject = Subject(hostile.list_pairs_store)
    try:
        found = run_fuzz(subject, seconds=1.0, seed=4).violation
        assert found is not None
        assert replay_fuzz(subject, found.details) is not None, "the finding did not replay"
        planted = tmp_path / "planted.db"
        sql = [[f"ATTACH DATABASE '{planted}' AS p", []], ["CREATE TABLE p.t(x)", []]]
        tampered = dict(
            found.details, steps=[{"type": "txn", "explicit": False, "statements": sql}]
        )
        with pytest.raises(UsageError, match="steps must be steps of its run"):
            replay_fuzz(subject, tampered)
        repeated = dict(found.details, steps=[*found.details["steps"]] * 2)
        with pytest.raises(UsageError, match="steps must be steps of its run"):
            replay_fuzz(subject, repeated)
    finally:
        subject.close()
    assert not planted.exists()
