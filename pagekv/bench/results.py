"""The bench report: machine facts, the per-workload tables, the targets, and the JSON form.

The text table and the JSON carry the same figures; the JSON adds every raw sample, so any summary
(medians, ratios) can be recomputed from it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import textwrap
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import apsw

from pagekv import __version__, build_description
from pagekv.bench.sampling import MEMORY_METHOD, SystemResult, WorkloadResult, fmt_time
from pagekv.bench.targets import MET, MISSED, TargetResult, fmt_ratio

SCHEMA_VERSION = 2
"""2: warm commit workloads, concurrent writers (`writers`, `scaling`), flushes, WAL sizes."""
RATIO_DEFINITION = (
    "speed ratio = native median time per op ÷ pagekv median time per op "
    "(> 1: pagekv faster; 0.5: pagekv at half native speed)"
)


@dataclass
class Machine:
    python: str
    implementation: str
    platform: str
    cpu_count: int | None
    cpu_model: str
    apsw: str
    sqlite: str
    pagekv: str
    load_average_start: list[float]
    build: str = ""
    """Whether the compiled modules ran (`pagekv.build_description()`): that halves a
    commit's cost, so a figure means little without it."""
    load_average_end: list[float] = field(default_factory=list)

    @classmethod
    def current(cls) -> Machine:
        return cls(
            python=platform.python_version(),
            implementation=platform.python_implementation(),
            platform=platform.platform(),
            cpu_count=os.cpu_count(),
            cpu_model=_cpu_model(),
            apsw=apsw.apsw_version(),
            sqlite=apsw.sqlite_lib_version(),
            pagekv=__version__,
            load_average_start=_load(),
            build=build_description(),
        )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


@dataclass
class Config:
    kv: str
    latency_ms: float
    quick: bool
    large: bool
    repeat: int
    workloads: list[str]
    systems: list[str]
    sizes: dict[str, int]
    scratch_dir: str
    scratch_filesystem: str
    writers: list[int] = field(default_factory=list)
    """The writer counts of the concurrent workload (empty: it did not run)."""
    flush_counts: str = ""
    """Where flushes per operation come from, or why there are none ("n/a: ...")."""
    memory_method: str = MEMORY_METHOD
    ratio_definition: str = RATIO_DEFINITION
    interleaving: str = (
        "each repetition runs every system once, back to back; the order rotates per repetition"
    )


@dataclass
class BenchReport:
    command: str
    argv: list[str]
    started: str
    elapsed_s: float
    machine: Machine
    config: Config
    workloads: list[WorkloadResult]
    targets: list[TargetResult]
    schema: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return _finite(dataclasses.asdict(self))


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_json(report: BenchReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=1, ensure_ascii=False) + "\n")


# -- text -------------------------------------------------------------------------------------


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _num(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _rate(result: SystemResult, unit: str) -> str:
    s = result.summary
    assert s is not None
    if s.mib_per_s is not None:
        return f"{s.mib_per_s:,.1f} MiB/s"
    return f"{s.ops_per_s:,.0f} {unit}/s"


_HEADERS = (
    "system",
    "median/op",
    "CPU/op",
    "spread: min..max",
    "IQR",
    "rate",
    "pagekv speed",
    "scaling",
    "RT/op",
    "flush/op",
    "KV wr/op",
    "KV rd/op",
    "WA",
    "WA+comp",
    "py peak",
    "sqlite peak",
)
DROP_ORDER: tuple[tuple[str, ...], ...] = (
    ("IQR",),
    ("py peak", "sqlite peak"),
    ("WA+comp",),
    ("spread: min..max",),
    ("WA",),
    ("KV rd/op",),
    ("KV wr/op",),
    ("CPU/op",),
    ("rate",),
)
"""Columns left out, least important first, until the tables fit the terminal (system, median,
pagekv speed, scaling, round trips and flushes always stay; rate, the median restated, goes last
as it is the figure of concurrent writers: their aggregate commits/s)."""
OPTIONAL = ("scaling", "flush/op")
"""Columns a table has only where they mean something: scaling for concurrent writers, flushes
where the store counts them (and for concurrent writers always, "n/a" if it does not)."""

Row = tuple[str, ...]
_UNLIMITED = 10_000
"""The width rich lays a table out in: wider than any table, which gets its natural width."""


def _rows(result: WorkloadResult) -> list[Row]:
    """One row per system: every column of `_HEADERS`, or (label, "skipped: why")."""
    rows: list[Row] = []
    ratio = {r.baseline: r for r in result.ratios}
    for system in result.systems:
        s = system.summary
        if s is None:
            rows.append((system.label, f"skipped: {system.skipped or 'no samples'}"))
            continue
        r = ratio.get(system.system)
        speed = (
            f"{fmt_ratio(r.speed_ratio)} ({fmt_ratio(r.paired_min)}..{fmt_ratio(r.paired_max)})"
            if r is not None
            else ""
        )
        mem = system.memory
        scaling = fmt_ratio(system.scaling) if system.scaling is not None else "-"
        flushes = "-"
        if system.kind == "pagekv":
            flushes = "n/a" if s.flushes_per_op is None else f"{s.flushes_per_op:.3g}"
        rows.append(
            (
                system.label,
                fmt_time(s.median_s_per_op),
                fmt_time(s.cpu_s_per_op) if s.cpu_s_per_op is not None else "-",
                f"{fmt_time(s.min_s_per_op)}..{fmt_time(s.max_s_per_op)}",
                f"{fmt_time(s.q1_s_per_op)}..{fmt_time(s.q3_s_per_op)}",
                _rate(system, result.unit),
                speed,
                scaling,
                _num(s.round_trips_per_op, ".3g"),
                flushes,
                fmt_bytes(s.kv_bytes_written_per_op) if s.round_trips_per_op is not None else "-",
                fmt_bytes(s.kv_bytes_read_per_op) if s.round_trips_per_op is not None else "-",
                _num(s.write_amplification, ".3f"),
                _num(s.write_amplification_with_compaction, ".3f"),
                fmt_bytes(mem.python_peak_bytes) if mem else "-",
                fmt_bytes(mem.sqlite_peak_bytes) if mem else "-",
            )
        )
    return rows


def absent_columns(result: WorkloadResult) -> set[str]:
    """The `OPTIONAL` columns `result`'s table goes without."""
    concurrent = any(s.writers for s in result.systems)
    counted = any(s.summary and s.summary.flushes_per_op is not None for s in result.systems)
    absent = set()
    if not concurrent:
        absent.add("scaling")
        if not counted:
            absent.add("flush/op")
    return absent


def _grid(rows: Sequence[Row], hidden: Collection[str]) -> tuple[int, list[str]]:
    """The first column's width and the table's lines (header first; skipped rows excluded),
    laid out by rich at their natural width: no cell wraps (`hidden_columns` leaves columns out
    to fit instead), the system left-aligned, the figures right-aligned, two spaces before each
    column. rich is imported here, not with the module: `pagekv bench --help` need not pay
    its ~20 ms."""
    from rich.console import Console
    from rich.table import Table

    keep = [i for i, h in enumerate(_HEADERS) if h not in hidden]
    full = [r for r in rows if len(r) == len(_HEADERS)]
    table = Table(box=None, padding=(0, 0, 0, 2), pad_edge=True, header_style="")
    for i in keep:
        table.add_column(_HEADERS[i], justify="left" if i == 0 else "right", no_wrap=True)
    for r in full:
        table.add_row(*(r[i] for i in keep))
    console = Console(width=_UNLIMITED, color_system=None, highlight=False, emoji=False)
    with console.capture() as captured:
        console.print(table)
    first = max(len(_HEADERS[0]), *(len(r[0]) for r in full))
    return first, [line.rstrip() for line in captured.get().splitlines()]


def _wrap(text: str, width: int | None, indent: str = "", hang: str | None = None) -> list[str]:
    """`text` after `indent`, as lines of at most `width` (None: one line); continuation lines
    start with `hang` (default: `indent` and two spaces). Words are never broken, so a long path
    stays whole (and may overflow)."""
    if width is None or len(indent) + len(text) <= width:
        return [indent + text]
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  " if hang is None else hang,
        break_long_words=False,
        break_on_hyphens=False,
    )


def workload_table(
    result: WorkloadResult,
    repeat: int,
    *,
    hidden: Collection[str] = (),
    width: int | None = None,
) -> str:
    """One workload's table without the columns named in `hidden`; its title, skipped rows and
    round-trip line wrap to `width` (None: no limit)."""
    rows = _rows(result)
    first, grid = _grid(rows, {*hidden, *absent_columns(result)})
    lines = _wrap(
        f"{result.name} — {result.title}; per {result.unit}, {repeat} interleaved "
        f"repetition{'s' if repeat != 1 else ''}",
        width,
    )
    lines.append(grid[0])
    table_rows = iter(grid[1:])
    for row in rows:
        if len(row) != len(_HEADERS):
            prefix = f"  {row[0].ljust(first)}  "
            lines += _wrap(row[1], width, prefix, " " * len(prefix))
            continue
        lines.append(next(table_rows))
    pagekv = result.system("pagekv")
    if pagekv and pagekv.summary and pagekv.summary.round_trips_by_op:
        by_op = ", ".join(f"{op} {n:.3g}" for op, n in pagekv.summary.round_trips_by_op.items())
        extra = f"pagekv round trips per {result.unit}: {by_op}"
        if pagekv.summary.compactions_per_sample:
            extra += f"; compactions per sample: {pagekv.summary.compactions_per_sample:g}"
        lines += _wrap(extra, width, "  ")
    return "\n".join(lines)


def hidden_columns(workloads: Sequence[WorkloadResult], width: int | None) -> list[str]:
    """The columns to leave out so that every workload table fits in `width` (None: none), the
    same for every table, least important first (`DROP_ORDER`)."""
    if width is None:
        return []
    tables = [(_rows(w), absent_columns(w)) for w in workloads]
    hidden: list[str] = []
    for group in ((), *DROP_ORDER):
        hidden += group
        if all(
            len(line) <= width
            for rows, absent in tables
            for line in _grid(rows, {*hidden, *absent})[1]
        ):
            break
    return hidden


def targets_table(targets: Sequence[TargetResult], width: int | None = None) -> str:
    """One line per target; when that line is wider than `width`, the target's name stands on
    its own line and the criterion, measurement and note wrap below it."""
    mark = {MET: "met", MISSED: "MISSED"}
    name_width = max(len(t.target) for t in targets)
    lines = ["Targets"]
    for t in targets:
        status = f"  [{mark.get(t.status, t.status):^12}] "
        text = t.criterion
        if t.measured:
            text += f": {t.measured}"
        if t.note:
            text += f"  ({t.note})"
        line = f"{status}{t.target.ljust(name_width)}  {text}"
        if width is None or len(line) <= width:
            lines.append(line)
            continue
        lines.append(status + t.target)
        lines += _wrap(text, width, " " * len(status), " " * len(status))
    return "\n".join(lines)


def header(report: BenchReport) -> str:
    m, c = report.machine, report.config
    latency = f", +{c.latency_ms:g} ms simulated latency per KV round trip" if c.latency_ms else ""
    if "flush_delay_ms=" in urlsplit(c.kv).query:
        latency += (
            " (flush_delay_ms: the store's flushes take that much longer, native SQLite's do not:"
            " speed ratios to native are not matched)"
        )
    return "\n".join(
        [
            f"pagekv bench — {report.command}",
            f"  pagekv {m.pagekv} ({m.build})",
            f"  store {c.kv}{latency}; native files in {c.scratch_dir} ({c.scratch_filesystem})",
            f"  Python {m.python} ({m.implementation}), apsw {m.apsw}, SQLite {m.sqlite}, "
            f"{m.cpu_count} CPUs ({m.cpu_model}), load average {m.load_average_start}",
            f"  {RATIO_DEFINITION}",
            "  CPU/op: this process's CPU time (user + system, every thread) per op, median of the "
            "samples; spread: min..max and IQR of per-op times; RT: KV round trips; KV wr/rd: "
            "KV bytes (keys + values) per op;",
            "  WA: KV bytes written ÷ SQLite page bytes committed (compaction inside the body "
            "excluded); WA+comp: with it and with a compaction pass right after the body;",
            "  peak: memory above the start of the body, from " + MEMORY_METHOD,
            "  warm: the commit workloads reuse a database already in use (a native WAL at the "
            "size SQLite's auto-checkpoint keeps); fresh: a new database file for every sample, "
            "its WAL growing while timed;",
            *(
                [
                    "  xN: N concurrent writers, each a thread and a database of its own (pagekv: "
                    "N namespaces of the one store; native: N files in one directory); scaling: "
                    "aggregate rate ÷ the same system's with 1 writer;"
                ]
                if c.writers
                else []
            ),
            f"  flush/op: durable flushes of the store per op, from {c.flush_counts}"
            if not c.flush_counts.startswith("n/a")
            else f"  flush/op: {c.flush_counts}",
        ]
    )


def render(report: BenchReport, width: int | None = None) -> str:
    """The text report. With a `width`, the tables leave out their least important columns until
    they fit (the header says which) and the text wraps; None (a file or a pipe): everything."""
    hidden = hidden_columns(report.workloads, width)
    head = [line for raw in header(report).splitlines() for line in _wrap_line(raw, width)]
    if hidden:
        head += _wrap(
            f"columns left out to fit {width} columns: {', '.join(hidden)} "
            "(--json has every figure)",
            width,
            "  ",
        )
    parts = ["\n".join(head)]
    parts += [
        workload_table(w, report.config.repeat, hidden=hidden, width=width)
        for w in report.workloads
    ]
    parts.append(targets_table(report.targets, width))
    parts.append(f"total {report.elapsed_s:.1f} s")
    return "\n\n".join(parts) + "\n"


def _wrap_line(line: str, width: int | None) -> list[str]:
    stripped = line.lstrip(" ")
    return _wrap(stripped, width, line[: len(line) - len(stripped)])


def terminal_width(stream: TextIO) -> int | None:
    """The width to fit the report to: the terminal's, or None when `stream` is not a terminal
    (a file or a pipe has no width; it gets every column)."""
    return shutil.get_terminal_size().columns if stream.isatty() else None


def print_report(report: BenchReport) -> None:
    sys.stdout.write(render(report, terminal_width(sys.stdout)))
    sys.stdout.flush()
