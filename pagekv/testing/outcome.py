"""What one part of a backend check concluded: `PartResult`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagekv.testing.violation import Violation


class Status(enum.Enum):
    PASSED = "passed"
    FAILED = "FAILED"
    NOT_CHECKED = "not checked"
    """The part (or some of it) cannot run against this factory; `summary` says why."""


@dataclass
class PartResult:
    """One part's result: its status, a one-line summary of what it did, the first violation."""

    part: str
    status: Status
    summary: str
    seconds: float = 0.0
    """The part's whole time, minimising what it found included."""
    violations: list[Violation] = field(default_factory=list)
    """What it found, the first first (the contract part reports every broken clause)."""
    not_checked: list[str] = field(default_factory=list)
    """What the part could not check against this factory, each with its reason."""
    found_after: float | None = None
    """Seconds from the part's start until it saw its first violation (None: it saw none):
    how long finding it took, where `seconds` adds the time spent minimising it."""

    @property
    def violation(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    def line(self) -> str:
        """The summary line `pagekv check-backend` prints for the part."""
        took = f"{self.seconds:.1f} s"
        if self.found_after is not None:
            took = f"found after {self.found_after:.1f} s, {took} in all"
        text = f"{self.part:<11} {self.status.value:<11} {self.summary} ({took})"
        if self.violation is not None:
            text += f": {self.violation.clause}"
        return text
