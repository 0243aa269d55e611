"""How fast `check_backend` catches each broken backend of `tests/testing/backends/broken.py`.

Run: `.venv/bin/python benchmarks/check_backend.py [--seeds 3] [--seconds 30] [--only NAME ...]`
(from the repository root; a full run is ~45 min: each backend takes `--seconds` per seed unless
every timed part finds its bug early). Results: `benchmarks/RESULTS.md`, "Detection times".

Each backend (the two correct ones first) is checked with every part, over seeds 1..N. Per
backend the table says which parts failed it (in how many of the seeds), the median and max
detection time of the part expected to catch it, and the clause that part reported. A detection
time is the part's `seconds` less the time it spent minimising its finding (the concurrent and
restart parts count their minimisation in `seconds`; the fuzz part does not): the time until the
violation was found. For the contract part it is its whole pass over the clauses, which always
run to the end.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagekv.testing import concurrent, restart
from pagekv.testing.check import DEFAULT_SECONDS, check_backend
from pagekv.testing.outcome import Status
from pagekv.testing.subject import Factory
from tests.testing.backends.broken import BROKEN
from tests.testing.backends.plain import plain_namespace, plain_store

CORRECT: dict[str, tuple[Factory, str]] = {
    "plain_namespace": (plain_namespace, "-"),
    "plain_store": (plain_store, "-"),
}


MINIMISERS: dict[str, list[tuple[object, str]]] = {
    "concurrent": [(concurrent, "_minimise")],
    "restart": [(restart, "_blame"), (restart, "_minimise")],
}
"""Per part, the functions that shrink a finding after it was found (timed and subtracted)."""
_minimising: Counter[str] = Counter()


def _timed(part: str, fn: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(fn)
    def timed(*args: object, **kwargs: object) -> object:
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _minimising[part] += time.monotonic() - started

    return timed


def _time_minimisers() -> None:
    for part, functions in MINIMISERS.items():
        for module, name in functions:
            setattr(module, name, _timed(part, getattr(module, name)))


@dataclass
class Row:
    """What the seeds of one backend found."""

    name: str
    expected: str
    seeds: int = 0
    caught_by: Counter[str] = field(default_factory=Counter)
    detection: list[float] = field(default_factory=list)
    """Seconds the expected part took to find the bug, one per seed that it found it in."""
    clauses: Counter[str] = field(default_factory=Counter)

    def cells(self) -> list[str]:
        caught = ", ".join(f"{p} {n}/{self.seeds}" for p, n in sorted(self.caught_by.items()))
        median = f"{statistics.median(self.detection):.2f}" if self.detection else "-"
        worst = f"{max(self.detection):.2f}" if self.detection else "-"
        missed = self.seeds - len(self.detection)
        if self.expected != "-" and missed:
            worst += f" ({missed} missed)"
        clause = self.clauses.most_common(1)[0][0] if self.clauses else "-"
        return [self.name, self.expected, caught or "none", median, worst, clause]


def measure(name: str, factory: Factory, expected: str, seeds: int, seconds: float) -> Row:
    row = Row(name, expected)
    for seed in range(1, seeds + 1):
        _minimising.clear()
        result = check_backend(factory, seconds=seconds, seed=seed)
        row.seeds += 1
        for part in result.parts:
            if part.status is Status.FAILED:
                row.caught_by[part.part] += 1
                if part.part == expected and part.violation is not None:
                    row.detection.append(part.seconds - _minimising[part.part])
                    row.clauses[part.violation.clause] += 1
        print(f"  {name} seed {seed}: " + "; ".join(p.line() for p in result.parts), flush=True)
    return row


def table(rows: list[Row]) -> str:
    head = ["backend", "expected", "caught by (seeds)", "median s", "max s", "clause reported"]
    cells = [head] + [r.cells() for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per backend (1..N)")
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="check_backend's seconds"
    )
    parser.add_argument("--only", nargs="*", help="backends to run (default all)")
    args = parser.parse_args()
    backends = {**CORRECT, **BROKEN}
    names = args.only or list(backends)
    unknown = sorted(set(names) - set(backends))
    if unknown:
        parser.error(f"unknown backends {unknown}; they are {', '.join(backends)}")
    _time_minimisers()
    rows = []
    for name in names:
        factory, expected = backends[name]
        rows.append(measure(name, factory, expected, args.seeds, args.seconds))
    print(f"\n{args.seeds} seeds, seconds={args.seconds:g}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
