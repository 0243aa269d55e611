"""`pagekv fuzz`: the command-line face of the fuzzer."""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from pagekv.cli_args import kv_url, positive_int, positive_seconds
from pagekv.fuzz.processes import DEFAULT_WRITERS, fuzz_processes
from pagekv.fuzz.runner import Coverage, FuzzFailure
from pagekv.fuzz.session import FuzzConfig, Runner, fuzz, load_replay
from pagekv.fuzz.steps import EVENTS, PROCESS_EVENTS, Step, to_json
from pagekv.kv import KvLimits, open_kv, redact_url


def add_fuzz_command(commands: argparse._SubParsersAction, summary: str) -> None:
    p = commands.add_parser(
        "fuzz",
        help=summary,
        description="Run seeded random workloads on pagekv and native SQLite, injecting KV "
        "faults, crashes, takeovers and compactions, and check that nothing acknowledged is "
        "lost or corrupted. Exits 1 with a minimised, replayable failure.",
    )
    p.add_argument("--kv", default="memory://", type=kv_url, help="store URL (default memory://)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=positive_seconds, help="run for this long (default 60)")
    budget.add_argument("--runs", type=positive_int, help="run this many seeded runs")
    p.add_argument("--seed", type=int, help="session seed (default: random, printed)")
    p.add_argument(
        "--faults",
        help=f"comma-separated disruptions to inject (default all: {','.join(EVENTS)}; "
        f"with --processes: {','.join(PROCESS_EVENTS)})",
    )
    p.add_argument("--steps", type=positive_int, default=40, help="steps per run (default 40)")
    p.add_argument(
        "--max-blob",
        type=positive_int,
        default=3 * 2**20,
        help="largest blob in bytes (default 3 MiB)",
    )
    p.add_argument(
        "--processes",
        action="store_true",
        help="real crashes: SIGKILL a child committing on a durable --kv, then verify",
    )
    p.add_argument(
        "--writers",
        type=positive_int,
        help="with --processes: actors each child commits on at once, one thread each, so "
        f"their commits share flushes; each is verified after every kill (default "
        f"{DEFAULT_WRITERS}; 1: one actor, no group commit)",
    )
    p.add_argument("--replay", type=Path, help="replay a failure file written by a failed run")
    p.add_argument(
        "--out", type=Path, help="where to write a failure (default ./pagekv-fuzz-SEED.json)"
    )
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        return _replay(args.replay)
    if args.processes and not args.kv.startswith("file:"):
        raise SystemExit(
            "pagekv fuzz: --processes needs a durable store the processes share, a file: one "
            f"(e.g. --kv file:./.fuzz); got {redact_url(args.kv)}"
        )
    if args.writers is not None and not args.processes:
        raise SystemExit("pagekv fuzz: --writers goes with --processes")
    known = PROCESS_EVENTS if args.processes else EVENTS
    faults = args.faults if args.faults is not None else ",".join(known)
    events = frozenset(e for e in faults.split(",") if e)
    unknown = events - set(known)
    if unknown:
        mode = " with --processes" if args.processes else ""
        raise SystemExit(
            f"pagekv fuzz: unknown --faults {sorted(unknown)}{mode}; known: {', '.join(known)}"
        )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    seconds = args.seconds if args.seconds is not None or args.runs is not None else 60.0
    print(f"pagekv fuzz: seed {seed}, store {redact_url(args.kv)}", flush=True)
    if args.processes:
        try:
            coverage = fuzz_processes(
                args.kv,
                seed,
                seconds or 60.0,
                max_blob=args.max_blob,
                events=events,
                writers=args.writers or DEFAULT_WRITERS,
            )
        except FuzzFailure as failure:
            print(f"FAILED (seed {seed}): {failure}", file=sys.stderr)
            return 1
        _report(coverage)
        return 0
    config = FuzzConfig(
        kv=args.kv,
        seed=seed,
        runs=args.runs,
        seconds=seconds,
        steps_per_run=args.steps,
        events=events,
        max_blob=args.max_blob,
    )
    coverage, found = fuzz(config, progress=_Progress(sys.stderr.isatty()))
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if found is None:
        _report(coverage)
        return 0
    out = args.out or Path(f"pagekv-fuzz-{seed}.json")
    found.save(out, config)
    print(f"FAILED (seed {seed}, run seed {found.seed}): {found.failure}", file=sys.stderr)
    print(f"minimised to {len(found.steps)} steps:", file=sys.stderr)
    _print_steps(found.steps)
    print(f"replay with: pagekv fuzz --replay {out}", file=sys.stderr)
    return 1


def _replay(path: Path) -> int:
    try:
        steps, data = load_replay(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise SystemExit(f"pagekv fuzz: cannot replay {path}: {reason}") from None
    url = data.get("kv", "memory://")
    quota = data.get("max_storage_bytes")
    store = open_kv(url, limits=None if quota is None else KvLimits(max_storage_bytes=quota))
    try:
        coverage = Runner(
            lambda: store.namespace(f"pagekv-fuzz-replay/{path.name}"), **data.get("db_options", {})
        ).run(steps)
    except FuzzFailure as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        _print_steps(steps)
        return 1
    finally:
        store.close()
    print(f"replay of {len(steps)} steps passed")
    _report(coverage)
    return 0


def _print_steps(steps: list[Step]) -> None:
    for n, step in enumerate(steps):
        print(f"  {n:3d} {to_json(step)}", file=sys.stderr)


class _Progress:
    """Coverage so far on stderr: rewritten in place on a terminal, else one line every
    `EVERY_S` seconds (a log or a pipe gets a few lines, not one per run)."""

    EVERY_S = 5.0

    def __init__(self, terminal: bool) -> None:
        self.terminal = terminal
        self.last = time.monotonic()

    def __call__(self, coverage: Coverage) -> None:
        line = (
            f"runs {coverage.runs}, steps {coverage.steps}, commits {coverage.commits}, "
            f"faults {sum(coverage.faults.values())}, takeovers {coverage.takeovers}, "
            f"crashes {coverage.crashes}"
        )
        if self.terminal:
            print(f"\r  {line}", end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self.last >= self.EVERY_S:
            self.last = time.monotonic()
            print(f"pagekv fuzz: {line}", file=sys.stderr, flush=True)


def _report(c: Coverage) -> None:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(c.faults.items())) or "none"
    print(
        f"ok: {c.runs} runs, {c.steps} steps, {c.commits} commits acknowledged, "
        f"{c.failed_commits} commits failed under faults\n"
        f"    faults fired: {faults}\n"
        f"    takeovers {c.takeovers}, crashes {c.crashes}, reopens {c.reopens}, "
        f"compactions {c.compactions}, latency changes {c.latency_steps}, "
        f"verifications {c.verifications}, "
        f"{c.bytes_written / 2**20:.1f} MiB written to KV\n"
        f"    quota refusals {c.quota_refusals}, re-creations under a snapshot "
        f"{c.recreations} ({c.snapshots_expired} snapshots expired)"
    )
    if c.store_writes:
        print(
            f"    store flushes per write in the children {c.store_flushes / c.store_writes:.2f} "
            f"({c.store_flushes} flushes for {c.store_writes} writes)"
        )
