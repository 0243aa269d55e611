"""Running workloads on pagekv and its native baselines, interleaved, and summarising the samples.

Why interleaved: the machine this runs on is shared and noisy, and noise drifts over seconds. Each
repetition runs every system once, one after the other (the order rotates per repetition so no
system always goes first), so slow phases hit every system alike; ratios come from those paired
runs. Every per-sample figure (time, KV round trips, bytes, VFS counters) is kept, so the JSON can
be re-analysed and the summary checked.

Memory is measured in one extra, untimed pass per system, because tracing slows Python code down:
peak Python heap (`tracemalloc`, allocations made during the body) and peak SQLite heap
(`apsw.memory_high_water`, process-wide, above what SQLite held before the body). For `memory://`
the Python figure includes the pages the in-process KV store keeps (see `python_retained_bytes`).
The concurrent workload has no memory pass: its N threads share one process-wide heap figure.

Flushes: where the store counts its durable flushes (`flush_counts()`, the `file:` store), each
pagekv sample records how many the body caused, so the report can say how many commits shared one.
"""

from __future__ import annotations

import os
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import apsw

from pagekv.bench.systems import PAGE_SIZE, PAGEKV_COUNTERS, Subject, SystemSpec, Workspace
from pagekv.bench.workloads import Prepare, Sizes, Workload, build

MEMORY_METHOD = (
    "one untimed pass per system: tracemalloc peak of allocations made during the body "
    "(Python heap) and apsw.memory_high_water above its value before the body (SQLite heap)"
)


@dataclass
class Sample:
    """One timed run of a workload's body on one system."""

    rep: int
    order: int
    """Position of this system within its repetition (0 = ran first)."""
    seconds: float
    ops: int
    round_trips: dict[str, int] = field(default_factory=dict)
    kv_bytes_written: int = 0
    kv_bytes_read: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    """Changes of the VFS counters during the body (pagekv only)."""
    final_compaction_bytes: int = 0
    """KV bytes of the compaction pass run after the body (untimed), to fold what it committed."""
    store_writes: int | None = None
    """Writes the store made durable during the body (None: native, or no `flush_counts`)."""
    flushes: int | None = None
    """Durable flushes of the store during the body (None: as `store_writes`)."""
    cpu_seconds: float = 0.0
    """CPU time of the whole process (user + system, every thread) during the body: on two cores
    with the GIL, the time per operation hides what a system spends on it."""

    @property
    def seconds_per_op(self) -> float:
        return self.seconds / self.ops


@dataclass
class MemoryUse:
    python_peak_bytes: int
    python_retained_bytes: int
    sqlite_peak_bytes: int


@dataclass
class Summary:
    """Figures derived from the samples (the table's row)."""

    median_s_per_op: float
    min_s_per_op: float
    max_s_per_op: float
    q1_s_per_op: float
    q3_s_per_op: float
    ops_per_s: float
    mib_per_s: float | None
    round_trips_per_op: float | None = None
    round_trips_per_op_max: float | None = None
    round_trips_by_op: dict[str, float] | None = None
    kv_bytes_written_per_op: float | None = None
    kv_bytes_read_per_op: float | None = None
    sqlite_page_bytes_per_op: float | None = None
    write_amplification: float | None = None
    """KV bytes written by the body, less compaction inside it, ÷ SQLite page bytes committed."""
    write_amplification_with_compaction: float | None = None
    """All KV bytes the body wrote plus those of a compaction pass right after it, ÷ the same."""
    compactions_per_sample: float | None = None
    flushes_per_op: float | None = None
    """Median over samples of the store's durable flushes ÷ operations (None: not counted)."""
    store_writes_per_op: float | None = None
    cpu_s_per_op: float | None = None
    """Median over samples of the process's CPU seconds ÷ operations."""


@dataclass
class SystemResult:
    system: str
    label: str
    kind: str
    settings: str
    samples: list[Sample] = field(default_factory=list)
    summary: Summary | None = None
    memory: MemoryUse | None = None
    skipped: str | None = None
    writers: int = 0
    """Concurrent writers (0: one database, no threads)."""
    scaling: float | None = None
    """Aggregate rate ÷ the same system's with one writer (medians; concurrent workload only)."""
    scaling_paired: list[float] = field(default_factory=list)
    """The same ratio within each repetition."""
    wal_bytes_before: int | None = None
    """Size of the native WAL file(s) before the first timed sample (None: not WAL, or fresh)."""
    wal_bytes_after: int | None = None
    """And after the last one: a warm WAL does not grow while timed."""


@dataclass
class Ratio:
    """pagekv's speed relative to one baseline: `native time ÷ pagekv time` (> 1: pagekv faster).

    `speed_ratio` is the ratio of the medians; `paired` holds the ratio of each repetition's two
    samples, which ran back to back."""

    baseline: str
    baseline_label: str
    speed_ratio: float
    paired: list[float]
    paired_min: float
    paired_max: float


@dataclass
class WorkloadResult:
    name: str
    title: str
    unit: str
    prepare: str
    payload_bytes_per_op: int | None
    systems: list[SystemResult]
    ratios: list[Ratio]
    seconds: float
    """Wall time spent on this workload, set-up and memory pass included."""

    def system(self, name: str) -> SystemResult | None:
        return next((s for s in self.systems if s.system == name), None)


class Steps(Protocol):
    """Where a run reports each step as it starts or ends (the CLI's progress line,
    `pagekv.cli.benchmark.BenchProgress`); `count_steps` says how many there will be."""

    def step(self, text: str) -> None: ...


def variants(workload: Workload, systems: Sequence[SystemSpec]) -> list[SystemSpec]:
    """The rows of `workload`'s table: the systems (one marked `fresh` only where the others
    are warm, and not among concurrent writers), at every writer count of a concurrent
    workload, grouped by count."""
    warm = workload.prepare is Prepare.WARM and not workload.writers
    shown = [s for s in systems if warm or not s.fresh]
    if not workload.writers:
        return shown
    return [s.with_writers(n) for n in workload.writers for s in shown]


def runnable(workload: Workload, systems: Sequence[SystemSpec]) -> list[SystemSpec]:
    return [s for s in systems if s.can_reopen or not workload.needs_reopen]


def count_steps(workloads: Sequence[Workload], systems: Sequence[SystemSpec], repeat: int) -> int:
    """Progress steps: every sample, plus a build and a memory pass per system and workload."""
    return sum(len(runnable(w, variants(w, systems))) * (repeat + 2) for w in workloads)


def _rotated(systems: list[SystemSpec], rep: int) -> list[SystemSpec]:
    k = rep % len(systems)
    return systems[k:] + systems[:k]


def fmt_time(s: float) -> str:
    """A duration in seconds as µs, ms or s, for the report and the progress line."""
    if s < 1e-3:
        return f"{s * 1e6:,.1f} µs"
    if s < 1:
        return f"{s * 1e3:,.2f} ms"
    return f"{s:,.2f} s"


class Harness:
    """The databases of one workload on some systems, and their untimed preparation.

    `open()` builds the databases that are reused across samples (warmed up first where the
    workload is warm); `ready(spec)` hands out the database for one sample, prepared as the
    workload says (fresh, reopened cold, or closed); `done` disposes of it; `close()` deletes
    everything. `pagekv bench` and the pytest-benchmark suite both time `workload.body` between
    `ready` and `done`. `systems` are the table's rows (see `variants`).
    """

    def __init__(
        self, workspace: Workspace, workload: Workload, systems: Sequence[SystemSpec], sizes: Sizes
    ) -> None:
        self.ws = workspace
        self.workload = workload
        self.systems = runnable(workload, systems)
        self.sizes = sizes
        self._kept: dict[str, Subject] = {}

    def _fresh(self, spec: SystemSpec) -> bool:
        return self.workload.prepare is Prepare.FRESH or spec.fresh

    def open(self, spec: SystemSpec) -> None:
        """Build the reused database of `spec` (nothing to do for fresh-per-sample ones)."""
        if not self._fresh(spec):
            self._kept[spec.name] = self._new_subject(
                spec, warm=self.workload.prepare is Prepare.WARM
            )

    def _new_subject(self, spec: SystemSpec, *, warm: bool = False) -> Subject:
        subject = self.ws.subject(spec, self.workload.name)
        try:
            if warm:
                subject.warm_up()
            build(self.workload, subject, self.sizes)
        except BaseException:
            subject.destroy()
            raise
        return subject

    def wal_bytes(self, spec: SystemSpec) -> int | None:
        """The size of the kept database's native WAL (None: fresh, or not WAL)."""
        kept = self._kept.get(spec.name)
        return kept.wal_bytes() if kept is not None else None

    def ready(self, spec: SystemSpec) -> Subject:
        prepare = self.workload.prepare
        if self._fresh(spec):
            return self._new_subject(spec)
        subject = self._kept[spec.name]
        if prepare is Prepare.COLD:
            subject.reopen()
        elif prepare is Prepare.CLOSED:
            subject.close()
        return subject

    def done(self, subject: Subject) -> None:
        if self._fresh(subject.spec):
            subject.destroy()

    def close(self) -> None:
        for subject in self._kept.values():
            subject.destroy()
        self._kept.clear()


class WorkloadRun:
    """Runs one workload on a list of systems: build, interleaved samples, memory pass."""

    def __init__(
        self,
        workspace: Workspace,
        workload: Workload,
        systems: Sequence[SystemSpec],
        sizes: Sizes,
        progress: Steps,
        *,
        memory: bool = True,
    ) -> None:
        self.workload = workload
        self.workspace = workspace
        self.all_systems = variants(workload, systems)
        self.harness = Harness(workspace, workload, self.all_systems, sizes)
        self.systems = self.harness.systems
        self.sizes = sizes
        self.progress = progress
        self.memory = memory and not workload.writers

    def run(self, repeat: int) -> WorkloadResult:
        w = self.workload
        started = time.perf_counter()
        results = {
            s.name: SystemResult(s.name, s.label, s.kind, s.settings(), writers=s.writers)
            for s in self.all_systems
        }
        for spec in self.all_systems:
            if spec not in self.systems:
                results[spec.name].skipped = "a :memory: database cannot be closed and reopened"
        try:
            for spec in self.systems:
                fresh = w.prepare is Prepare.FRESH or spec.fresh
                what = "fresh database per sample" if fresh else "building"
                if w.prepare is Prepare.WARM and not fresh:
                    what = "warming up and building"
                self.progress.step(f"{w.name}: {spec.label} ({what})")
                self.harness.open(spec)
                results[spec.name].wal_bytes_before = self.harness.wal_bytes(spec)
            for rep in range(repeat):
                data = w.inputs(self.sizes, random.Random(f"{w.name}:{rep}"))
                for order, spec in enumerate(_rotated(self.systems, rep)):
                    sample = self.sample(spec, data, rep, order)
                    results[spec.name].samples.append(sample)
                    self.progress.step(
                        f"{w.name} rep {rep + 1}/{repeat} {spec.label}: "
                        f"{fmt_time(sample.seconds_per_op)}/{w.unit}"
                    )
                del data
            for spec in self.systems:
                results[spec.name].wal_bytes_after = self.harness.wal_bytes(spec)
                if self.memory:
                    data = w.inputs(self.sizes, random.Random(f"{w.name}:memory"))
                    results[spec.name].memory = self.measure_memory(spec, data)
                self.progress.step(f"{w.name}: memory pass on {spec.label}")
        finally:
            self.harness.close()
        for result in results.values():
            if result.samples:
                result.summary = summarize(
                    result.samples, w.payload_bytes(self.sizes) if w.payload_bytes else None
                )
        for spec in self.all_systems:
            if spec.writers > 1:
                one = results[spec.name.removesuffix(f"-x{spec.writers}") + "-x1"]
                _scale(results[spec.name], one)
        ordered = [results[s.name] for s in self.all_systems]
        return WorkloadResult(
            name=w.name,
            title=w.describe(self.sizes),
            unit=w.unit,
            prepare=w.prepare.value,
            payload_bytes_per_op=w.payload_bytes(self.sizes) if w.payload_bytes else None,
            systems=ordered,
            ratios=ratios(ordered),
            seconds=time.perf_counter() - started,
        )

    def sample(self, spec: SystemSpec, data: object, rep: int, order: int) -> Sample:
        subject = self.harness.ready(spec)
        try:
            # No gc.collect() here: measured, a full collection right before a sample makes the
            # next native open ~3x slower (it empties free lists and returns arenas to the OS).
            if self.workspace.durable:
                os.sync()  # the last sample's writeback must not slow this one down
            subject.kv_reset()
            before = subject.counters()
            flushed = self.workspace.flush_counts() if spec.kind == "pagekv" else None
            cpu, started = time.process_time(), time.perf_counter()
            ops = self.workload.body(subject, data)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            kv = subject.kv_reset()
            delta = subject.counters()
            delta.subtract(before)
            sample = Sample(rep=rep, order=order, seconds=seconds, ops=ops, cpu_seconds=cpu)
            if flushed is not None and (now := self.workspace.flush_counts()) is not None:
                sample.store_writes = now.writes - flushed.writes
                sample.flushes = now.flushes - flushed.flushes
            if kv is not None:
                sample.round_trips = dict(sorted(kv.round_trips.items()))
                sample.kv_bytes_written = kv.bytes_written
                sample.kv_bytes_read = kv.bytes_read
                sample.counters = {k: delta[k] for k in PAGEKV_COUNTERS}
                if delta["pages_committed"]:
                    sample.final_compaction_bytes = self._compaction_bytes(subject)
            return sample
        finally:
            self.harness.done(subject)

    @staticmethod
    def _compaction_bytes(subject: Subject) -> int:
        before = subject.counters()["compaction_bytes_written"]
        subject.compact()
        subject.kv_reset()
        return subject.counters()["compaction_bytes_written"] - before

    def measure_memory(self, spec: SystemSpec, data: object) -> MemoryUse:
        subject = self.harness.ready(spec)
        try:
            apsw.memory_high_water(True)
            sqlite_before = apsw.memory_used()
            tracemalloc.start()
            try:
                self.workload.body(subject, data)
                retained, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            sqlite_peak = apsw.memory_high_water(False) - sqlite_before
            subject.kv_reset()
            return MemoryUse(peak, retained, max(0, sqlite_peak))
        finally:
            self.harness.done(subject)


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def _scale(result: SystemResult, one: SystemResult) -> None:
    """`result`'s aggregate rate over `one`'s, the same system with one writer: of the medians,
    and within each repetition (the two ran in it, interleaved)."""
    if result.summary is None or one.summary is None:
        return
    result.scaling = result.summary.ops_per_s / one.summary.ops_per_s
    own = {s.rep: s.seconds_per_op for s in one.samples}
    result.scaling_paired = [
        own[s.rep] / s.seconds_per_op for s in result.samples if s.rep in own and s.seconds_per_op
    ]


def summarize(samples: list[Sample], payload_bytes: int | None) -> Summary:
    per_op = [s.seconds_per_op for s in samples]
    median = statistics.median(per_op)
    q1, q3 = _quartiles(per_op)
    summary = Summary(
        median_s_per_op=median,
        min_s_per_op=min(per_op),
        max_s_per_op=max(per_op),
        q1_s_per_op=q1,
        q3_s_per_op=q3,
        ops_per_s=1 / median if median else float("inf"),
        mib_per_s=payload_bytes / median / 2**20 if payload_bytes and median else None,
        cpu_s_per_op=statistics.median(s.cpu_seconds / s.ops for s in samples),
    )
    if not any(s.round_trips or s.counters for s in samples):
        return summary
    ops = [s.ops for s in samples]

    def per_op_median(values: Sequence[float]) -> float:
        return statistics.median(v / n for v, n in zip(values, ops, strict=True))

    totals = [sum(s.round_trips.values()) for s in samples]
    summary.round_trips_per_op = per_op_median(totals)
    summary.round_trips_per_op_max = max(t / n for t, n in zip(totals, ops, strict=True))
    names = sorted({op for s in samples for op in s.round_trips})
    summary.round_trips_by_op = {
        op: per_op_median([s.round_trips.get(op, 0) for s in samples]) for op in names
    }
    summary.kv_bytes_written_per_op = per_op_median([s.kv_bytes_written for s in samples])
    summary.kv_bytes_read_per_op = per_op_median([s.kv_bytes_read for s in samples])
    page_bytes = [s.counters.get("pages_committed", 0) * PAGE_SIZE for s in samples]
    summary.sqlite_page_bytes_per_op = per_op_median(page_bytes)
    summary.compactions_per_sample = statistics.median(
        s.counters.get("compactions", 0) for s in samples
    )
    flushes, writes = [s.flushes for s in samples], [s.store_writes for s in samples]
    if all(f is not None for f in flushes):
        summary.flushes_per_op = per_op_median([f or 0 for f in flushes])
    if all(w is not None for w in writes):
        summary.store_writes_per_op = per_op_median([w or 0 for w in writes])
    if all(page_bytes):
        summary.write_amplification = statistics.median(
            (s.kv_bytes_written - s.counters.get("compaction_bytes_written", 0)) / p
            for s, p in zip(samples, page_bytes, strict=True)
        )
        summary.write_amplification_with_compaction = statistics.median(
            (s.kv_bytes_written + s.final_compaction_bytes) / p
            for s, p in zip(samples, page_bytes, strict=True)
        )
    return summary


def ratios(results: Sequence[SystemResult]) -> list[Ratio]:
    """pagekv vs each native baseline with as many writers, from the medians and from each
    repetition's pair."""
    out: list[Ratio] = []
    for writers in dict.fromkeys(r.writers for r in results):
        out += _ratios([r for r in results if r.writers == writers])
    return out


def _ratios(results: Sequence[SystemResult]) -> list[Ratio]:
    pagekv = next((r for r in results if r.kind == "pagekv" and r.summary), None)
    if pagekv is None or pagekv.summary is None:
        return []
    own = {s.rep: s.seconds_per_op for s in pagekv.samples}
    out: list[Ratio] = []
    for native in results:
        if native.kind != "native" or native.summary is None:
            continue
        paired = [
            s.seconds_per_op / own[s.rep] for s in native.samples if s.rep in own and own[s.rep] > 0
        ]
        out.append(
            Ratio(
                baseline=native.system,
                baseline_label=native.label,
                speed_ratio=native.summary.median_s_per_op / pagekv.summary.median_s_per_op,
                paired=paired,
                paired_min=min(paired, default=float("nan")),
                paired_max=max(paired, default=float("nan")),
            )
        )
    return out


def run_workloads(
    workspace: Workspace,
    workloads: Sequence[Workload],
    systems: Sequence[SystemSpec],
    sizes: Sizes,
    repeat: int,
    progress: Steps,
    *,
    memory: bool = True,
    on_result: Callable[[WorkloadResult], None] | None = None,
) -> list[WorkloadResult]:
    results = []
    for workload in workloads:
        result = WorkloadRun(workspace, workload, systems, sizes, progress, memory=memory).run(
            repeat
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
