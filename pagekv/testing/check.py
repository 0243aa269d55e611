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
from typing import Final

from pagekv.testing import contract as _contract  # noqa: F401  (registers the clauses)
from pagekv.testing.clauses import CLAUSES, NotChecked, run_clause
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.report import Violation
from pagekv.testing.subject import Factory, Subject

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
    from pagekv.testing.concurrent import run_concurrent
    from pagekv.testing.fuzz_part import run_fuzz
    from pagekv.testing.restart import run_restart

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    subject = Subject(factory, name)
    results: list[PartResult] = []
    timed = {"concurrent": run_concurrent, "restart": run_restart, "fuzz": run_fuzz}
    try:
        for part in PARTS:
            if part not in parts:
                continue
            if part == "contract":
                result = run_contract(subject)
            else:
                budget = seconds * SHARES[part] / sum(SHARES[p] for p in parts if p in SHARES)
                try:
                    result = timed[part](subject, seconds=budget, seed=seed)
                finally:
                    subject.close()
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        subject.close()
    return CheckResult(subject.name, seed, results)
