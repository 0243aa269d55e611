"""The performance targets pagekv is measured against, evaluated on a run's results (measured,
never asserted in tests).

The targets: one-row commits on a warm database at least 2x native DELETE+FULL and 1.0x native
WAL+FULL on `file://` and 0.5x native MEMORY/OFF/EXCLUSIVE on `memory://`; at most 3 and 13 KV round
trips for a 1 and a 10 MiB insert, 2 for a cold read of 100 pages and 64 for a cold scan of 50 MiB
(at 20 ms a round trip, their cost over a remote KV); a 50 MiB cold scan at 0.3x native speed; write
amplification of a 10 MiB insert at most 1.1 before compaction and 2.2 with it; and a wake of a 100
MiB database costing the round trips of a 1 MiB one; with 64 concurrent writers on a `file:` store
at most 0.2 durable flushes per commit, and, with every flush 2 ms longer (`flush_delay_ms=2`, a
slower disk), at least 10x the aggregate commits/s of one writer.

Each target is named for what ran (the sizes come from the run's `Sizes`) and checked only where it
means something: a target for `file://` is "n/a" on `memory://`, a speed target is "n/a" under
simulated latency or with `flush_delay_ms` (native SQLite does not pay the delay), and a target
whose workload was not selected is "not measured". A threshold set for a full-size workload whose
result depends on the size (the round trips and the throughput of a 50 MiB scan) is judged at that
size only: at a smaller size (`--quick`) it is "n/a" and the note says why. Round-trip targets use
the worst sample, not the median, because round trips should not vary between runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from pagekv.bench.sampling import Summary, WorkloadResult
from pagekv.bench.workloads import WORKLOADS, MiB, Sizes

MET, MISSED, NOT_MEASURED, NOT_APPLICABLE = "met", "missed", "not measured", "n/a"
REMOTE_LATENCY_MS = 20
"""The latency of a remote KV round trip the round-trip thresholds are set for."""


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
    sizes: Sizes
    results: dict[str, WorkloadResult]
    flush_delay_ms: float | None = None
    """The store URL's `flush_delay_ms` (None: not given)."""

    def pagekv(self, workload: str, name: str = "pagekv") -> Summary | None:
        result = self.results.get(workload)
        system = result.system(name) if result else None
        return system.summary if system else None

    def ratio(self, workload: str, baseline: str) -> float | None:
        result = self.results.get(workload)
        if result is None:
            return None
        return next((r.speed_ratio for r in result.ratios if r.baseline == baseline), None)


Check = Callable[[_Context], TargetResult]
SizeGate = Callable[[Sizes], str | None]
"""Why a threshold cannot be judged at these sizes (None: it can)."""


def fmt_ratio(value: float) -> str:
    """`0.29x`; two significant digits below 0.1, so a small ratio never prints as 0.00x."""
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _at_least(value: float | None, threshold: float) -> str:
    return NOT_MEASURED if value is None else (MET if value >= threshold else MISSED)


def _at_most(value: float | None, threshold: float) -> str:
    return NOT_MEASURED if value is None else (MET if value <= threshold else MISSED)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _gated(result: TargetResult, why: str | None) -> TargetResult:
    """`result`, but "n/a" with the reason when its threshold does not apply at this size."""
    if why is None or result.status in (NOT_APPLICABLE, NOT_MEASURED):
        return result
    result.status = NOT_APPLICABLE
    result.note = _join(f"n/a at --quick size: {why}", result.note)
    return result


def _mib(workload: str, sizes: Sizes) -> int:
    payload = WORKLOADS[workload].payload_bytes
    assert payload is not None
    return payload(sizes) // MiB


def _ratio_target(
    name: Callable[[Sizes], str],
    workload: str,
    baseline: str,
    label: str,
    threshold: float,
    scheme: str,
    gate: SizeGate | None = None,
) -> Check:
    def check(ctx: _Context) -> TargetResult:
        target = name(ctx.sizes)
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
        if ctx.flush_delay_ms:
            return TargetResult(
                target,
                workload,
                criterion,
                NOT_APPLICABLE,
                note="native SQLite does not pay the store's flush_delay_ms",
            )
        value = ctx.ratio(workload, baseline)
        result = TargetResult(
            target,
            workload,
            criterion,
            _at_least(value, threshold),
            value,
            threshold,
            "" if value is None else fmt_ratio(value),
        )
        return _gated(result, gate(ctx.sizes) if gate else None)

    return check


def _round_trip_target(
    name: Callable[[Sizes], str], workload: str, threshold: int, gate: SizeGate | None = None
) -> Check:
    """At most `threshold` KV round trips in the worst sample. The name claims no latency: the
    note gives the time the round trips take at 20 ms each, or the time measured when the run
    had simulated latency."""

    def check(ctx: _Context) -> TargetResult:
        summary = ctx.pagekv(workload)
        value = summary.round_trips_per_op_max if summary else None
        measured = note = ""
        if summary is not None and value is not None:
            measured = f"{value:g} round trips"
            if ctx.latency_ms:
                median_ms = summary.median_s_per_op * 1000
                note = f"median {median_ms:,.0f} ms measured at {ctx.latency_ms:g} ms a round trip"
            else:
                note = (
                    f"≈ {value * REMOTE_LATENCY_MS:,.0f} ms at {REMOTE_LATENCY_MS} ms a round trip"
                )
        result = TargetResult(
            name(ctx.sizes),
            workload,
            f"≤ {threshold} KV round trips (worst sample; "
            f"≈ {threshold * REMOTE_LATENCY_MS:,} ms at {REMOTE_LATENCY_MS} ms each)",
            _at_most(value, threshold),
            value,
            threshold,
            measured,
            note,
        )
        return _gated(result, gate(ctx.sizes) if gate else None)

    return check


def _write_amp(with_compaction: bool, threshold: float) -> Check:
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
            f"{_mib('blob-10m', ctx.sizes)} MiB insert: write amplification {which}",
            "blob-10m",
            f"KV bytes written ÷ SQLite page bytes ≤ {threshold:g}",
            _at_most(value, threshold),
            value,
            threshold,
            "" if value is None else f"{value:.3f}",
        )

    return check


FULL = Sizes.full()


def _scan_round_trips_gate(sizes: Sizes) -> str | None:
    if sizes.scan_mib == FULL.scan_mib:
        return None
    return (
        f"≤ 64 is set for a {FULL.scan_mib} MiB scan; scanning {sizes.scan_mib} MiB takes "
        "fewer round trips"
    )


def _scan_speed_gate(sizes: Sizes) -> str | None:
    if sizes.scan_mib == FULL.scan_mib:
        return None
    return (
        f"≥ 0.3x is set for a {FULL.scan_mib} MiB scan; pagekv's read-ahead grows from 128 to "
        f"512 pages during a scan, so scanning {sizes.scan_mib} MiB reads a larger share of the "
        "pages in small fetches"
    )


def _cold_read_gate(sizes: Sizes) -> str | None:
    if sizes.cold_read_pages == FULL.cold_read_pages:
        return None
    return f"≤ 2 is set for a read of {FULL.cold_read_pages} pages"


def _wake(ctx: _Context) -> TargetResult:
    small, big = ctx.pagekv("wake-small"), ctx.pagekv("wake-big")
    small_mib, big_mib = ctx.sizes.wake_small_mib, ctx.sizes.wake_big_mib
    criterion = f"round trips of the {big_mib} MiB open = round trips of the {small_mib} MiB open"
    target = f"wake of a {big_mib} MiB database"
    if small is None or big is None or small.round_trips_by_op is None:
        return TargetResult(
            target, "wake-big", criterion, NOT_MEASURED, note="needs wake-small and wake-big"
        )
    same = small.round_trips_per_op_max == big.round_trips_per_op_max
    measured = (
        f"{big_mib} MiB: {big.round_trips_per_op_max:g} ({_by_op(big)}); "
        f"{small_mib} MiB: {small.round_trips_per_op_max:g} ({_by_op(small)})"
    )
    note = ""
    if big_mib != FULL.wake_big_mib:
        note = (
            f"the target is set for {FULL.wake_big_mib} MiB; it compares two opens of the same "
            f"run, so it is judged at {big_mib} MiB"
        )
    return TargetResult(
        target,
        "wake-big",
        criterion,
        MET if same else MISSED,
        big.round_trips_per_op_max,
        small.round_trips_per_op_max,
        measured,
        note,
    )


WRITERS = 64


def _flushes_per_commit(ctx: _Context) -> TargetResult:
    threshold = 0.2
    target = f"{WRITERS} concurrent writers: flushes per commit, file://"
    criterion = f"≤ {threshold:g} durable flushes of the store per one-row commit"
    result = TargetResult(target, "writers", criterion, NOT_MEASURED, threshold=threshold)
    if ctx.scheme != "file":
        result.status, result.note = NOT_APPLICABLE, "needs --kv file:DIR"
        return result
    summary = ctx.pagekv("writers", f"pagekv-x{WRITERS}")
    if summary is None:
        result.note = f"needs --writers {WRITERS}"
        return result
    value = summary.flushes_per_op
    if value is None:
        result.status, result.note = NOT_APPLICABLE, "the store keeps no count of its flushes"
        return result
    result.status, result.value, result.measured = _at_most(value, threshold), value, f"{value:.3g}"
    if summary.store_writes_per_op:
        result.note = f"{summary.store_writes_per_op:.3g} durable writes per commit"
    return result


def _writers_scaling(ctx: _Context) -> TargetResult:
    threshold, delay = 10.0, 2
    target = f"{WRITERS} writers vs 1, one-row commits, file:?flush_delay_ms={delay}"
    criterion = (
        f"pagekv's aggregate commits/s with {WRITERS} writers ≥ {threshold:g}x its rate with 1"
    )
    result = TargetResult(target, "writers", criterion, NOT_MEASURED, threshold=threshold)
    if ctx.scheme != "file" or ctx.flush_delay_ms != delay or ctx.latency_ms:
        result.status = NOT_APPLICABLE
        result.note = f"needs --kv 'file:DIR?flush_delay_ms={delay}' without --latency-ms"
        return result
    writers = ctx.results.get("writers")
    system = writers.system(f"pagekv-x{WRITERS}") if writers else None
    if system is None or system.scaling is None:
        result.note = f"needs --writers {WRITERS}"
        return result
    value = system.scaling
    result.status, result.value = _at_least(value, threshold), value
    result.measured = fmt_ratio(value)
    if system.scaling_paired:
        low, high = min(system.scaling_paired), max(system.scaling_paired)
        result.note = f"per repetition {fmt_ratio(low)}..{fmt_ratio(high)}"
    return result


def _by_op(summary: Summary) -> str:
    return ", ".join(f"{op} {n:g}" for op, n in (summary.round_trips_by_op or {}).items())


_CHECKS: tuple[Check, ...] = (
    _ratio_target(
        lambda s: "one-row commits on a warm database, file:// vs DELETE+FULL",
        "commit-1",
        "native-delete-full",
        "native DELETE+FULL",
        2.0,
        "file",
    ),
    _ratio_target(
        lambda s: "one-row commits on a warm database, file:// vs WAL+FULL",
        "commit-1",
        "native-wal-full",
        "native WAL+FULL (warm)",
        1.0,
        "file",
    ),
    _ratio_target(
        lambda s: "one-row commits, memory://",
        "commit-1",
        "native-memory-off-exclusive",
        "native MEMORY/OFF/EXCL file",
        0.5,
        "memory",
    ),
    _round_trip_target(lambda s: f"{_mib('blob-1m', s)} MiB insert: KV round trips", "blob-1m", 3),
    _round_trip_target(
        lambda s: f"{_mib('blob-10m', s)} MiB insert: KV round trips", "blob-10m", 13
    ),
    _round_trip_target(
        lambda s: f"cold read of {s.cold_read_pages} pages: KV round trips",
        "cold-read-100",
        2,
        _cold_read_gate,
    ),
    _round_trip_target(
        lambda s: f"{s.scan_mib} MiB cold scan: KV round trips",
        "cold-scan",
        64,
        _scan_round_trips_gate,
    ),
    _ratio_target(
        lambda s: f"{s.scan_mib} MiB cold scan throughput, memory://",
        "cold-scan",
        "native-memory-off-exclusive",
        "native MEMORY/OFF/EXCL file (reopened: cold SQLite cache, warm OS cache)",
        0.3,
        "memory",
        _scan_speed_gate,
    ),
    _write_amp(False, 1.1),
    _write_amp(True, 2.2),
    _wake,
    _flushes_per_commit,
    _writers_scaling,
)


def evaluate(
    results: Sequence[WorkloadResult], url: str, latency_ms: float, sizes: Sizes
) -> list[TargetResult]:
    """Every target on `results`, a run on the store `url` with `latency_ms` of simulated latency
    per round trip and the workload sizes `sizes` (which name the targets and decide which
    thresholds apply)."""
    parts = urlsplit(url)
    delay = parse_qs(parts.query).get("flush_delay_ms")
    ctx = _Context(
        parts.scheme,
        latency_ms,
        sizes,
        {r.name: r for r in results},
        float(delay[-1]) if delay else None,
    )
    return [check(ctx) for check in _CHECKS]
