"""The targets of issue 4, evaluated on a run's results (measured, never asserted in tests).

Each target is checked only where it means something: a target named for `file://` is "n/a" on
`memory://`, and a target whose workload was not selected is "not measured". Round-trip targets use
the worst sample, not the median, because round trips should not vary between runs. Size-dependent
targets on a `--quick` run are evaluated at the reduced size, and the note says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pagekv.bench.runner import Summary, WorkloadResult

MET, MISSED, NOT_MEASURED, NOT_APPLICABLE = "met", "missed", "not measured", "n/a"


@dataclass
class TargetResult:
    target: str
    workload: str
    criterion: str
    status: str
    """"met", "missed", "not measured" or "n/a"."""
    value: float | None = None
    threshold: float | None = None
    measured: str = ""
    note: str = ""


@dataclass(frozen=True)
class _Context:
    scheme: str
    latency_ms: float
    quick: bool
    results: dict[str, WorkloadResult]

    def pagekv(self, workload: str) -> Summary | None:
        result = self.results.get(workload)
        system = result.system("pagekv") if result else None
        return system.summary if system else None

    def ratio(self, workload: str, baseline: str) -> float | None:
        result = self.results.get(workload)
        if result is None:
            return None
        return next((r.speed_ratio for r in result.ratios if r.baseline == baseline), None)


def fmt_ratio(value: float) -> str:
    """`0.29x`; two significant digits below 0.1, so a small ratio never prints as 0.00x."""
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _at_least(value: float | None, threshold: float) -> str:
    return NOT_MEASURED if value is None else (MET if value >= threshold else MISSED)


def _at_most(value: float | None, threshold: float) -> str:
    return NOT_MEASURED if value is None else (MET if value <= threshold else MISSED)


def _ratio_target(
    target: str, workload: str, baseline: str, label: str, threshold: float, scheme: str
) -> Callable[[_Context], TargetResult]:
    def check(ctx: _Context) -> TargetResult:
        criterion = f"pagekv speed ≥ {threshold:g}x {label} (native time ÷ pagekv time)"
        if ctx.scheme != scheme:
            return TargetResult(
                target, workload, criterion, NOT_APPLICABLE, note=f"needs --kv {scheme}://"
            )
        if ctx.latency_ms:
            return TargetResult(
                target,
                workload,
                criterion,
                NOT_APPLICABLE,
                note=f"defined without simulated latency (this run: {ctx.latency_ms:g} ms)",
            )
        value = ctx.ratio(workload, baseline)
        measured = "" if value is None else fmt_ratio(value)
        note = ""
        return TargetResult(
            target,
            workload,
            criterion,
            _at_least(value, threshold),
            value,
            threshold,
            measured,
            note,
        )

    return check


def _round_trip_target(
    target: str, workload: str, threshold: int, size_note: Callable[[_Context], str] | None = None
) -> Callable[[_Context], TargetResult]:
    def check(ctx: _Context) -> TargetResult:
        summary = ctx.pagekv(workload)
        value = summary.round_trips_per_op_max if summary else None
        notes = []
        measured = ""
        if summary and value is not None:
            measured = f"{value:g} round trips"
            if ctx.latency_ms:
                median_ms = summary.median_s_per_op * 1000
                measured += f", {median_ms:,.0f} ms at {ctx.latency_ms:g} ms/round trip"
            else:
                notes.append(f"≈ {value * 20:g} ms at 20 ms/round trip (round trips x 20 ms)")
        if size_note is not None and ctx.quick and summary is not None:
            notes.append(size_note(ctx))
        return TargetResult(
            target,
            workload,
            f"≤ {threshold} KV round trips (worst sample)",
            _at_most(value, threshold),
            value,
            threshold,
            measured,
            "; ".join(notes),
        )

    return check


def _write_amp(with_compaction: bool, threshold: float) -> Callable[[_Context], TargetResult]:
    def check(ctx: _Context) -> TargetResult:
        summary = ctx.pagekv("blob-10m")
        value = None
        if summary is not None:
            value = (
                summary.write_amplification_with_compaction
                if with_compaction
                else summary.write_amplification
            )
        which = "including compaction" if with_compaction else "before compaction"
        return TargetResult(
            f"write amplification, 10 MiB insert, {which}",
            "blob-10m",
            f"KV bytes written ÷ SQLite page bytes ≤ {threshold:g}",
            _at_most(value, threshold),
            value,
            threshold,
            "" if value is None else f"{value:.3f}",
        )

    return check


def _scan_ratio(ctx: _Context) -> TargetResult:
    check = _ratio_target(
        "50 MiB cold scan throughput, memory://",
        "cold-scan",
        "native-memory-off-exclusive",
        "native MEMORY/OFF/EXCL file (reopened: cold SQLite cache, warm OS cache)",
        0.3,
        "memory",
    )
    result = check(ctx)
    if ctx.quick and result.status not in (NOT_APPLICABLE, NOT_MEASURED):
        result.note = "; ".join(filter(None, [result.note, "--quick: smaller table"]))
    return result


def _wake(ctx: _Context) -> TargetResult:
    small, big = ctx.pagekv("wake-small"), ctx.pagekv("wake-big")
    criterion = "round trips of a big open = round trips of a 1 MiB open"
    target = "wake of a 100 MiB database"
    if small is None or big is None or small.round_trips_by_op is None:
        return TargetResult(
            target, "wake-big", criterion, NOT_MEASURED, note="needs wake-small and wake-big"
        )
    same = small.round_trips_per_op_max == big.round_trips_per_op_max
    measured = (
        f"big: {big.round_trips_per_op_max:g} ({_by_op(big)}); "
        f"1 MiB: {small.round_trips_per_op_max:g} ({_by_op(small)})"
    )
    result = TargetResult(
        target,
        "wake-big",
        criterion,
        MET if same else MISSED,
        big.round_trips_per_op_max,
        small.round_trips_per_op_max,
        measured,
    )
    if ctx.quick:
        result.note = "--quick: the big database is smaller"
    return result


def _by_op(summary: Summary) -> str:
    return ", ".join(f"{op} {n:g}" for op, n in (summary.round_trips_by_op or {}).items())


_CHECKS: tuple[Callable[[_Context], TargetResult], ...] = (
    _ratio_target(
        "one-row commits, file:// vs DELETE+FULL",
        "commit-1",
        "native-delete-full",
        "native DELETE+FULL",
        2.0,
        "file",
    ),
    _ratio_target(
        "one-row commits, file:// vs WAL+FULL",
        "commit-1",
        "native-wal-full",
        "native WAL+FULL",
        0.8,
        "file",
    ),
    _ratio_target(
        "one-row commits, memory://",
        "commit-1",
        "native-memory-off-exclusive",
        "native MEMORY/OFF/EXCL file",
        0.5,
        "memory",
    ),
    _round_trip_target("1 MiB insert at 20 ms latency", "blob-1m", 3),
    _round_trip_target("10 MiB insert at 20 ms latency", "blob-10m", 13),
    _round_trip_target("cold read of 100 pages at 20 ms", "cold-read-100", 2),
    _round_trip_target(
        "50 MiB cold scan round trips",
        "cold-scan",
        64,
        lambda ctx: "--quick: smaller table, fewer round trips than at 50 MiB",
    ),
    _scan_ratio,
    _write_amp(False, 1.1),
    _write_amp(True, 2.2),
    _wake,
)


def evaluate(
    results: Sequence[WorkloadResult], url: str, latency_ms: float, quick: bool
) -> list[TargetResult]:
    ctx = _Context(urlsplit(url).scheme, latency_ms, quick, {r.name: r for r in results})
    return [check(ctx) for check in _CHECKS]
