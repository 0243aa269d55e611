"""`check_backend`: every part of the conformance check, in order, against one factory.

The parts: the contract clauses (`contract.py`), a concurrent model-based run (`concurrent.py`),
a restart run when the factory makes stores it can reopen (`restart.py`), and the page-I/O fuzz
over the VFS (`fuzz_part.py`). `seconds` bounds the whole check: the clauses always run to the
end, and the timed parts share the time they leave.

Every backend call is made under a per-call timeout (`Subject.call`): a call that does not
return is a violation of the part that made it, and the parts after it are not run, since the
backend may be wedged (its thread is still inside it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pagekv.testing import contract as _contract  # noqa: F401  (registers the clauses)
from pagekv.testing.clauses import CLAUSES, NotChecked, run_clause
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import (
    DEFAULT_CALL_TIMEOUT,
    RETURNS,
    CallTimeout,
    Factory,
    FactoryFailed,
    Subject,
    UsageError,
)
from pagekv.testing.violation import Violation, show

PARTS: Final = ("contract", "concurrent", "restart", "fuzz")
DEFAULT_SECONDS: Final = 30.0
SHARES: Final = {"concurrent": 0.4, "restart": 0.2, "fuzz": 0.4}
"""Each timed part's share of the time the clauses leave (a part that cannot run, or ends
early, leaves the rest of its share to the parts after it)."""


@dataclass
class CheckResult:
    factory: str
    seed: int
    parts: list[PartResult]

    @property
    def ok(self) -> bool:
        return all(p.status is not Status.FAILED for p in self.parts)

    @property
    def checked(self) -> bool:
        """Whether any part checked anything: a check of nothing is no evidence of conformance."""
        return any(p.status is not Status.NOT_CHECKED for p in self.parts)

    @property
    def violations(self) -> list[Violation]:
        return [v for p in self.parts for v in p.violations]


def run_contract(subject: Subject) -> PartResult:
    """Every clause; a broken one does not stop the others, a call that does not return does."""
    started = time.monotonic()
    found: list[Violation] = []
    skipped: list[str] = []
    """Why clauses were not checked, one line each (the clauses after a hung call: one line)."""
    unchecked = 0
    found_after: float | None = None
    for n, c in enumerate(CLAUSES):
        before = len(found)
        try:
            run_clause(subject, c)
        except Violation as v:
            found.append(v)
        except NotChecked as e:
            skipped.append(f"{c.name}: {e}")
            unchecked += 1
        except FactoryFailed as e:
            got = f"raised {show(e.error)}"
            found.append(
                Violation("contract", c.name, c.requires, e.call, got, details={"clause": c.name})
            )
        except CallTimeout:
            pass  # subject.hung says which call
        finally:
            subject.close()
        if subject.hung is not None:
            del found[before:]  # what the clause made of the hung call is a consequence of it
            hung = subject.hung.violation("contract")
            hung.details = {"clause": c.name}
            found.append(hung)
            later = len(CLAUSES) - n - 1
            if later:
                skipped.append(f"the {later} clauses after {c.name!r}: not run, {subject.hung}")
                unchecked += later
        if found and found_after is None:
            found_after = time.monotonic() - started
        if subject.hung is not None:
            break
    held = len(CLAUSES) - len(found) - unchecked
    summary = f"{held} of {len(CLAUSES)} clauses hold"
    if found:
        summary += f", {len(found)} broken"
    if unchecked:
        summary += f", {unchecked} not checked"
    status = Status.FAILED if found else Status.NOT_CHECKED if skipped else Status.PASSED
    if status is Status.NOT_CHECKED and held:
        status = Status.PASSED
    seconds = time.monotonic() - started
    return PartResult("contract", status, summary, seconds, found, skipped, found_after)


def check_backend(
    factory: Factory,
    *,
    seconds: float = DEFAULT_SECONDS,
    seed: int | None = None,
    name: str | None = None,
    parts: Sequence[str] = PARTS,
    progress: Callable[[PartResult], None] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    started: Callable[[], None] | None = None,
) -> CheckResult:
    """Check a backend factory against the contract (see `subject.py` for the factory contract).

    `seconds` bounds the check's wall time: the clauses always run to the end (a second or two
    on a fast backend), then the timed parts share what is left; one that finds a violation
    minimises it within what is left of its share, a couple of seconds at least, so a finding
    near the end may overrun by that. `call_timeout` is how long one backend call may take
    before it is reported as one that does not return. `seed` (default random) makes a run
    repeatable as far as threads allow; `progress` is called with each part's result as it
    finishes, and `started` once the factory was accepted (the command line prints its header
    there, so that a factory refused with `UsageError` gets one line).
    """
    if not parts:
        raise ValueError(f"no parts to run; the parts are {', '.join(PARTS)}")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    deadline = time.monotonic() + seconds
    subject = Subject(factory, name, call_timeout=call_timeout)
    results: list[PartResult] = []
    try:
        if started is not None:
            started()
        for part in PARTS:
            if part not in parts:
                continue
            if subject.hung is not None and not results:  # in the factory's first calls
                summary = "a call did not return"
                result = PartResult(
                    part, Status.FAILED, summary, 0.0, [subject.hung.violation(part, seed)], [], 0.0
                )
            elif subject.hung is not None:
                why = f"not run: {subject.hung} (its thread is still inside the backend)"
                result = PartResult(part, Status.NOT_CHECKED, why)
            elif part == "contract":
                result = run_contract(subject)
            else:
                shares = [SHARES[p] for p in PARTS[PARTS.index(part) :] if p in parts]
                left = deadline - time.monotonic()
                if left > 0:
                    result = _run_timed(part, subject, left * SHARES[part] / sum(shares), seed)
                else:
                    why = f"not run: the {seconds:g} s of the check were used up before it"
                    result = PartResult(part, Status.NOT_CHECKED, why)
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        subject.close()
    return CheckResult(subject.name, seed, results)


def _run_timed(part: str, subject: Subject, seconds: float, seed: int) -> PartResult:
    """A timed part within `seconds`; a call of it that did not return, or a factory that
    failed under it, is its violation."""
    started = time.monotonic()
    result: PartResult | None = None
    try:
        result = _timed(part)(subject, seconds=seconds, seed=seed)
    except CallTimeout:
        pass  # subject.hung says which call
    except FactoryFailed as e:
        took = time.monotonic() - started
        summary = "the factory failed"
        result = PartResult(part, Status.FAILED, summary, took, [e.violation(part, seed)], [], took)
    finally:
        subject.close()
    hung = subject.hung
    if hung is not None and (result is None or all(v.clause != RETURNS for v in result.violations)):
        took = time.monotonic() - started
        summary = "a call did not return"
        result = PartResult(
            part, Status.FAILED, summary, took, [hung.violation(part, seed)], [], took
        )
    assert result is not None
    return result


def _timed(part: str) -> Callable[..., PartResult]:
    """The run function of a timed part, imported when it runs."""
    if part == "concurrent":
        from pagekv.testing.concurrent import run_concurrent

        return run_concurrent
    if part == "restart":
        from pagekv.testing.restart import run_restart

        return run_restart
    from pagekv.testing.fuzz_part import run_fuzz

    return run_fuzz


def replay(subject: Subject, part: str, details: dict[str, Any]) -> Violation | None:
    """Re-run what a violation's `details` record; the violation again, or None. Raises
    `UsageError` when it cannot run against this factory, or `details` are malformed."""
    try:
        return _replay(subject, part, details)
    except NotChecked as e:
        raise UsageError(f"cannot replay this {part} violation here: {e}") from None
    except FactoryFailed as e:
        return e.violation(part)
    except CallTimeout as e:
        return e.violation(part)
    finally:
        subject.close()


def _replay(subject: Subject, part: str, details: dict[str, Any]) -> Violation | None:
    if part == "contract":
        name = details.get("clause")
        found = next((c for c in CLAUSES if c.name == name), None)
        if found is None:
            raise UsageError(f"no clause {name!r} in this version of pagekv")
        try:
            run_clause(subject, found)
        except Violation as v:
            return v
        return None
    if part == "concurrent":
        from pagekv.testing.concurrent import replay_concurrent

        return replay_concurrent(subject, details)
    if part == "restart":
        from pagekv.testing.restart import replay_restart

        return replay_restart(subject, details)
    if part == "fuzz":
        from pagekv.testing.fuzz_part import replay_fuzz

        return replay_fuzz(subject, details)
    raise UsageError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
