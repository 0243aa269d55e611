"""`check_backend`: every part of the conformance check, in order, against one factory.

The parts: the contract clauses (`contract.py`), a concurrent model-based run (`concurrent.py`),
a restart run when the factory makes stores it can reopen (`restart.py`), and the page-I/O fuzz
over the VFS (`fuzz_part.py`). The timed parts share `seconds` between them; the clauses always
run to the end.
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
from pagekv.testing.report import Violation
from pagekv.testing.subject import Factory, Subject, UsageError

PARTS: Final = ("contract", "concurrent", "restart", "fuzz")
DEFAULT_SECONDS: Final = 30.0
SHARES: Final = {"concurrent": 0.4, "restart": 0.2, "fuzz": 0.4}
"""Each timed part's share of `seconds` (a part that cannot run leaves its share unused)."""


@dataclass
class CheckResult:
    factory: str
    seed: int
    parts: list[PartResult]

    @property
    def ok(self) -> bool:
        return all(p.status is not Status.FAILED for p in self.parts)

    @property
    def violations(self) -> list[Violation]:
        return [v for p in self.parts for v in p.violations]


def run_contract(subject: Subject) -> PartResult:
    """Every clause; a broken one does not stop the others."""
    started = time.monotonic()
    found: list[Violation] = []
    skipped: list[str] = []
    for c in CLAUSES:
        try:
            run_clause(subject, c)
        except Violation as v:
            found.append(v)
        except NotChecked as e:
            skipped.append(f"{c.name}: {e}")
        finally:
            subject.close()
    held = len(CLAUSES) - len(found) - len(skipped)
    summary = f"{held} of {len(CLAUSES)} clauses hold"
    if found:
        summary += f", {len(found)} broken"
    if skipped:
        summary += f", {len(skipped)} not checked"
    status = Status.FAILED if found else Status.NOT_CHECKED if skipped else Status.PASSED
    if status is Status.NOT_CHECKED and held:
        status = Status.PASSED
    return PartResult("contract", status, summary, time.monotonic() - started, found, skipped)


def check_backend(
    factory: Factory,
    *,
    seconds: float = DEFAULT_SECONDS,
    seed: int | None = None,
    name: str | None = None,
    parts: Sequence[str] = PARTS,
    progress: Callable[[PartResult], None] | None = None,
) -> CheckResult:
    """Check a backend factory against the contract (see `subject.py` for the factory contract).

    `seconds` is shared by the timed parts; `seed` (default random) makes a run repeatable as far
    as threads allow; `progress` is called with each part's result as it finishes.
    """
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    subject = Subject(factory, name)
    results: list[PartResult] = []
    try:
        for part in PARTS:
            if part not in parts:
                continue
            if part == "contract":
                result = run_contract(subject)
            else:
                budget = seconds * SHARES[part] / sum(SHARES[p] for p in parts if p in SHARES)
                try:
                    result = _timed(part)(subject, seconds=budget, seed=seed)
                finally:
                    subject.close()
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        subject.close()
    return CheckResult(subject.name, seed, results)


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
    `UsageError` when it cannot run against this factory."""
    try:
        return _replay(subject, part, details)
    except NotChecked as e:
        raise UsageError(f"cannot replay this {part} violation here: {e}") from None
    finally:
        subject.close()


def _replay(subject: Subject, part: str, details: dict[str, Any]) -> Violation | None:
    if part == "contract":
        found = next((c for c in CLAUSES if c.name == details["clause"]), None)
        if found is None:
            raise UsageError(f"no clause {details['clause']!r} in this version of pagekv")
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
