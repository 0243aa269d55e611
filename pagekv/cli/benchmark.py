"""`pagekv bench`: the argparse definition and the run that ties systems, workloads and report.

Arguments are checked before anything runs (unknown workloads, a bad URL, a non-positive repeat
count, an unwritable JSON path), so a typo costs a usage message, not a half-finished run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pagekv.bench.results import BenchReport, Config, Machine, now, print_report, write_json
from pagekv.bench.sampling import count_steps, run_workloads
from pagekv.bench.systems import NATIVE_SYSTEMS, PAGEKV, Workspace, baselines_for
from pagekv.bench.targets import evaluate
from pagekv.bench.workloads import WORKLOADS, Sizes, default_selection, writers_workload
from pagekv.cli.args import kv_url, milliseconds, positive_int
from pagekv.cli.progress import StatusLine
from pagekv.kv import KvError, redact_url


class BenchProgress:
    """The run's steps on a `StatusLine`: on a terminal `[  n/N] elapsed  what`, removed at the
    end; in a log, a line every few seconds and the last one (`done`, or `stopped` when the run
    failed or was interrupted)."""

    def __init__(self, total: int, line: StatusLine) -> None:
        self.total = total
        self.done = 0
        self.line = line
        self.started = line.clock()

    def _summary(self) -> str:
        elapsed = self.line.clock() - self.started
        return f"pagekv bench: {self.done}/{self.total} steps, {elapsed:.0f} s"

    def step(self, text: str) -> None:
        self.done += 1
        elapsed = self.line.clock() - self.started
        self.line.show(
            f"[{self.done:>3}/{self.total}] {elapsed:6.1f}s  {text}",
            plain=f"{self._summary()} ({text})",
        )

    def finish(self, *, stopped: bool = False) -> None:
        self.line.end(f"{self._summary()}, {'stopped' if stopped else 'done'}")


DEFAULT_KV = "memory://"
DEFAULT_REPEAT = 5
QUICK_REPEAT = 3


def _one_of(what: str, names: Collection[str]) -> Callable[[str], str]:
    """An argparse type that takes one of `names` and, for anything else, lists them all."""

    def check(value: str) -> str:
        if value not in names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {value!r}; choose from: {', '.join(names)}"
            )
        return value

    return check


def add_bench_command(commands: Any, summary: str) -> argparse.ArgumentParser:
    """Register `bench` on the CLI's subparsers (`commands` is `add_subparsers()`'s result)."""
    workloads = "\n".join(
        f"  {name:<14} {w.describe(Sizes.full())}"
        + (" [--large]" if w.large_only else "")
        + (" [--writers]" if w.writers else "")
        for name, w in WORKLOADS.items()
    )
    bench = commands.add_parser(
        "bench",
        help=summary,
        description=(
            "Run each workload on pagekv and on native SQLite matched in durability, interleaved "
            "in the same run, and print medians, spreads, speed ratios, KV round trips and bytes, "
            "write amplification and peak memory, and whether pagekv meets its performance "
            "targets (speed ratios to native SQLite, KV round trips of inserts, cold reads and "
            "scans, write amplification, the round trips of a wake)."
        ),
        epilog=f"workloads:\n{workloads}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--kv",
        default=DEFAULT_KV,
        type=kv_url,
        metavar="URL",
        help=(
            f"store URL (default {DEFAULT_KV}): memory:// is compared with native "
            "MEMORY/OFF/EXCLUSIVE and :memory:, anything else with native DELETE+FULL and WAL+FULL"
        ),
    )
    bench.add_argument(
        "--latency-ms",
        type=milliseconds,
        default=0.0,
        metavar="N",
        help="add N ms of simulated latency to every KV round trip (pagekv only)",
    )
    bench.add_argument(
        "--workload",
        action="extend",
        nargs="+",
        type=_one_of("workload", WORKLOADS),
        metavar="NAME",
        help="run only these workloads (repeatable; default: all but writers)",
    )
    bench.add_argument(
        "--baseline",
        action="extend",
        nargs="+",
        type=_one_of("baseline", NATIVE_SYSTEMS),
        metavar="NAME",
        help=(
            f"also compare with these native systems (repeatable): {', '.join(NATIVE_SYSTEMS)}; "
            "the journal mode, synchronous and locking mode their names say (the report lists "
            "each system's settings)"
        ),
    )
    bench.add_argument(
        "--writers",
        action="extend",
        nargs="+",
        type=positive_int,
        metavar="N",
        help=(
            "run the concurrent workload with N writers (repeatable; 1 is always added as the "
            "reference): N threads, each committing on a database of its own, pagekv's N on the "
            "one store; without --workload it runs alone"
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"smaller sizes, {QUICK_REPEAT} repetitions (a target whose threshold is set for the "
            "full size and depends on it is then n/a)"
        ),
    )
    bench.add_argument(
        "--large", action="store_true", help="also run the 50 MiB single-blob insert"
    )
    bench.add_argument(
        "--repeat",
        type=positive_int,
        metavar="N",
        help=f"repetitions per workload (default {DEFAULT_REPEAT}, {QUICK_REPEAT} with --quick)",
    )
    bench.add_argument(
        "--json",
        nargs="?",
        const=_STDOUT,
        type=Path,
        metavar="FILE",
        help="print the figures as one JSON document instead of the text report (as every "
        "command's --json does), or with FILE write it there beside the report",
    )
    bench.add_argument(
        "--no-progress",
        action="store_true",
        help=(
            "no progress on stderr (otherwise: one line rewritten in place on a terminal, "
            "a line every 5 s into a file or pipe)"
        ),
    )
    bench.set_defaults(run=run_bench, bench_parser=bench)
    return bench


_STDOUT = Path("-")
"""`--json` without a file: the document goes to stdout."""


def canonical_command(args: argparse.Namespace, workloads: list[str]) -> str:
    """The command line that repeats this run, every choice spelled out (password redacted)."""
    parts = ["pagekv", "bench", "--kv", redact_url(args.kv)]
    if args.latency_ms:
        parts += ["--latency-ms", f"{args.latency_ms:g}"]
    if args.workload:
        parts += ["--workload", *(w for w in workloads if w != "writers" or not args.writers)]
    if args.baseline:
        parts += ["--baseline", *dict.fromkeys(args.baseline)]
    if args.writers:
        parts += ["--writers", *map(str, sorted(set(args.writers)))]
    if args.quick:
        parts.append("--quick")
    if args.large:
        parts.append("--large")
    if args.repeat is not None:
        parts += ["--repeat", str(args.repeat)]
    if args.json == _STDOUT:
        parts += ["--json"]
    elif args.json is not None:
        parts += ["--json", str(args.json)]
    return shlex.join(parts)


def _selection(args: argparse.Namespace) -> list[str]:
    """The workloads to run: those named, else the default ones, else with `--writers` alone
    the concurrent one; `--writers` adds it to those named."""
    if args.workload:
        names = list(args.workload)
    elif args.writers:
        names = []
    else:
        names = default_selection(large=args.large)
    if args.writers:
        names.append("writers")
    return list(dict.fromkeys(names))


def _flush_source(url: str, workspace: Workspace) -> str:
    if workspace.flush_counts() is not None:
        return "the store's own count (flush_counts)"
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return "n/a (memory:// makes nothing durable)"
    if scheme in ("postgresql", "postgres"):
        # measured: a backend's pg_stat_wal.wal_sync shows up to 10 s after its commits
        return "n/a (PostgreSQL reports its WAL syncs seconds late, past the sample they are of)"
    return "n/a (this store keeps no count of its flushes)"


def run_bench(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.bench_parser
    names = _selection(args)
    if args.json not in (None, _STDOUT) and not args.json.parent.is_dir():
        parser.error(f"--json: directory {str(args.json.parent)!r} does not exist")
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    sizes = (Sizes.quick() if args.quick else Sizes.full()).for_latency(args.latency_ms)
    started_at, started = now(), time.perf_counter()
    try:
        workspace = Workspace(args.kv, args.latency_ms)
    except (ValueError, KvError) as e:
        parser.error(f"--kv: {e}")
    try:
        systems = (PAGEKV, *baselines_for(args.kv, args.baseline or ()))
        concurrent = writers_workload(args.writers or WORKLOADS["writers"].writers)
        workloads = [concurrent if n == "writers" else WORKLOADS[n] for n in names]
        machine = Machine.current()
        config = Config(
            kv=redact_url(args.kv),
            latency_ms=args.latency_ms,
            quick=args.quick,
            large=args.large,
            repeat=repeat,
            workloads=names,
            systems=[s.name for s in systems],
            sizes=dataclasses.asdict(sizes),
            scratch_dir=str(workspace.scratch),
            scratch_filesystem=workspace.filesystem(),
            writers=list(concurrent.writers) if "writers" in names else [],
            flush_counts=_flush_source(args.kv, workspace),
        )
        line = StatusLine(enabled=not args.no_progress, keep=False)
        progress = BenchProgress(count_steps(workloads, systems, repeat), line)
        try:
            results = run_workloads(workspace, workloads, systems, sizes, repeat, progress)
        except BaseException:
            progress.finish(stopped=True)
            raise
        progress.finish()
    finally:
        workspace.close()
    machine.load_average_end = Machine.current().load_average_start
    report = BenchReport(
        command=canonical_command(args, names),
        argv=[redact_url(a) for a in sys.argv],
        started=started_at,
        elapsed_s=time.perf_counter() - started,
        machine=machine,
        config=config,
        workloads=results,
        targets=evaluate(results, args.kv, args.latency_ms, sizes),
    )
    if args.json == _STDOUT:
        print(json.dumps(report.to_json(), indent=1, ensure_ascii=False))
        return 0
    print_report(report)
    if args.json is not None:
        write_json(report, args.json)
    return 0
