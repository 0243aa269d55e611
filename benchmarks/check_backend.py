"""How fast `check_backend` catches each broken backend of `tests/testing/backends/broken.py`,
and how long it takes to pass the correct ones.

Run: `.venv/bin/python benchmarks/check_backend.py [--rounds 2] [--seconds 30] [--only NAME ...]`
from the repository root. A round checks every backend once, with every part, the round's number
as the seed, in an order rotated by one each round (so that the machine's load of the moment does
not always fall on the same backends). A check runs every part whatever the others found, so it
takes its `--seconds` unless the last part, the fuzz, ends early with a finding: a round of the
31 backends is ~14 min at the default 30 s. Results:
`benchmarks/RESULTS.md`, "Backend conformance check: detection times".

Per broken backend the table says which parts failed it (in how many rounds), the clause the part
expected to catch it reported, and that part's detection time: `PartResult.found_after`, the
seconds from the part's start until it saw the violation (the time it then spends minimising it is
not counted; for the contract part, whose clauses all run, the time until the first broken one).
Per correct backend: the verdict, what each part ran, and the check's total time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagekv.kv import KvLimits, KvStore, open_kv
from pagekv.testing.check import DEFAULT_SECONDS, check_backend
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import Factory
from tests.testing.backends.broken import BROKEN
from tests.testing.backends.plain import plain_store


def file_store(location: Path, limits: KvLimits | None = None) -> KvStore:
    """`file:` with its default log size: the log is never folded in a check's data."""
    return open_kv(location.as_uri(), limits=limits)


def file_store_small_log(location: Path, limits: KvLimits | None = None) -> KvStore:
    """`file:?log_kib=12`: the log folded into the base every few writes, reopens included."""
    return open_kv(location.as_uri() + "?log_kib=12", limits=limits)


def memory_store(limits: KvLimits | None = None) -> KvStore:
    """`memory://`: no location, so the restart part and the reopen clauses do not run."""
    return open_kv("memory://", limits=limits)


CORRECT: dict[str, Factory] = {
    "file:": file_store,
    "file:?log_kib=12": file_store_small_log,
    "memory://": memory_store,
    "plain": plain_store,
}


@dataclass
class Row:
    """What the rounds of one backend found."""

    name: str
    expected: str
    """The part expected to catch it (`-`: a correct backend)."""
    rounds: int = 0
    caught_by: Counter[str] = field(default_factory=Counter)
    found_after: list[float] = field(default_factory=list)
    """The expected part's `found_after`, one per round it caught the backend in."""
    clauses: Counter[str] = field(default_factory=Counter)
    """The clause the expected part reported, per round it caught it."""
    totals: list[float] = field(default_factory=list)
    """The whole check's seconds, per round."""
    summaries: dict[str, str] = field(default_factory=dict)
    """Each part's latest status and summary line (for a correct backend)."""

    def add(self, result_parts: list[PartResult], seconds: float) -> None:
        self.rounds += 1
        self.totals.append(seconds)
        for part in result_parts:
            self.summaries[part.part] = f"{part.status.value}: {part.summary}"
            if part.status is not Status.FAILED:
                continue
            self.caught_by[part.part] += 1
            if part.part == self.expected and part.found_after is not None:
                self.found_after.append(part.found_after)
                assert part.violation is not None
                self.clauses[part.violation.clause] += 1

    def broken_cells(self) -> list[str]:
        caught = ", ".join(f"{p} {n}/{self.rounds}" for p, n in sorted(self.caught_by.items()))
        clause = " / ".join(c for c, _ in self.clauses.most_common()) or "-"
        found = _seconds(self.found_after)
        missed = self.rounds - len(self.found_after)
        if missed:
            found += f" (missed in {missed} of {self.rounds})"
        return [self.name, self.expected, caught or "none", clause, found]

    def correct_cells(self) -> list[str]:
        verdict = "FAILED" if self.caught_by else "passes"
        parts = "; ".join(f"{p} {s}" for p, s in self.summaries.items())
        return [self.name, verdict, _seconds(self.totals), parts]


def _seconds(values: list[float]) -> str:
    """A median, and the range when there are several values."""
    if not values:
        return "-"
    median = f"{statistics.median(values):.2f}"
    return median if len(values) == 1 else f"{median} ({min(values):.2f}-{max(values):.2f})"


def table(head: list[str], cells: list[list[str]]) -> str:
    """A Markdown table."""
    rows = [head, ["---"] * len(head), *cells]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds (seeds 1..N)")
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="check_backend's seconds"
    )
    parser.add_argument("--only", nargs="*", help="backends to run (default all)")
    args = parser.parse_args()
    backends: dict[str, tuple[Factory, str]] = {
        **{name: (factory, "-") for name, factory in CORRECT.items()},
        **BROKEN,
    }
    names = args.only or list(backends)
    unknown = sorted(set(names) - set(backends))
    if unknown:
        parser.error(f"unknown backends {unknown}; they are {', '.join(backends)}")
    rows = {name: Row(name, backends[name][1]) for name in names}
    for seed in range(1, args.rounds + 1):
        shift = (seed - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.monotonic()
            result = check_backend(backends[name][0], seconds=args.seconds, seed=seed)
            took = time.monotonic() - started
            rows[name].add(result.parts, took)
            lines = "; ".join(p.line() for p in result.parts)
            print(f"  round {seed} {name} ({took:.1f} s): {lines}", flush=True)
    print(f"\n{args.rounds} rounds (seeds 1-{args.rounds}), seconds={args.seconds:g}\n")
    broken = [r.broken_cells() for r in rows.values() if r.expected != "-"]
    correct = [r.correct_cells() for r in rows.values() if r.expected == "-"]
    if broken:
        head = ["backend", "expected part", "failed by (rounds)", "clause", "found after, s"]
        print(table(head, broken) + "\n")
    if correct:
        print(table(["backend", "verdict", "total, s", "parts (last round)"], correct))


if __name__ == "__main__":
    main()
