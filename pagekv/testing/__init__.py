"""Checking a KV backend against pagekv's contract, and fuzzing building blocks for your tests.

`check_backend(factory)` (and `pagekv check-backend MODULE:CALLABLE`) runs the contract clauses,
a concurrent model-based run, a restart run and the page-I/O fuzz on a backend of your own.
`KvContract` is the same clauses as a pytest suite. `machine(factory)` is a hypothesis state
machine running fuzz steps on any `ActorKv` (it needs hypothesis: `pip install 'pagekv[testing]'`).
"""

from __future__ import annotations

from typing import Any

from pagekv.testing.check import PARTS, CheckResult, check_backend, replay
from pagekv.testing.clauses import CLAUSES, Clause, NotChecked, Trial, clause, run_clause
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import Subject, UsageError, load_factory
from pagekv.testing.violation import Violation

__all__ = [
    "CLAUSES",
    "PARTS",
    "CheckResult",
    "Clause",
    "KvContract",
    "NotChecked",
    "PartResult",
    "Status",
    "Subject",
    "Trial",
    "UsageError",
    "Violation",
    "blobs",
    "check_backend",
    "clause",
    "faults",
    "load_factory",
    "machine",
    "replay",
    "run_clause",
    "statements",
    "steps",
    "transactions",
]

_MACHINE = ("machine", "blobs", "statements", "transactions", "faults", "steps", "TABLES")


def __getattr__(name: str) -> Any:
    """The hypothesis-based helpers, and the pytest suite `KvContract`, on first use: the rest
    of `pagekv.testing` (and `pagekv check-backend`) runs without hypothesis or pytest."""
    if name in _MACHINE:
        from pagekv.testing import fuzz_machine

        return getattr(fuzz_machine, name)
    if name == "KvContract":
        from pagekv.testing.pytest_suite import KvContract

        return KvContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
