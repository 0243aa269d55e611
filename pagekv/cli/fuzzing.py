"""`pagekv fuzz`: the command-line face of the fuzzer."""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from pagekv.cli.args import kv_url, positive_int, positive_seconds
from pagekv.cli.progress import StatusLine
from pagekv.fuzz.execution import Coverage, FuzzFailure
from pagekv.fuzz.processes import DEFAULT_WRITERS, Backend, fuzz_processes, load_kv_factory
from pagekv.fuzz.session import FuzzConfig, execute, fuzz, load_replay
from pagekv.fuzz.steps import EVENTS, FILE_ONLY_EVENTS, PROCESS_EVENTS, Step, to_json
from pagekv.kv import ActorKv, KvLimits, open_kv, redact_url
from pagekv.testing.subject import Subject, UsageError


def add_fuzz_command(commands: argparse._SubParsersAction, summary: str) -> None:
    p = commands.add_parser(
        "fuzz",
        help=summary,
        description="Run seeded random workloads on pagekv and native SQLite, injecting KV "
        "faults, crashes, takeovers and compactions, and check that nothing acknowledged is "
        "lost or corrupted. Exits 1 with a minimised, replayable failure, 2 on a usage error.",
    )
    store = p.add_mutually_exclusive_group()
    store.add_argument(
        "--kv",
        type=kv_url,
        help="store URL (default memory://; with --processes a file: store in a fresh "
        "temporary directory, removed after a run that passes)",
    )
    store.add_argument(
        "--kv-factory",
        metavar="MODULE:CALLABLE",
        help="fuzz your own backend: a callable returning a fresh namespace or store, passed "
        "limits= and location= if it declares them (MODULE is looked up in the current "
        "directory too); with --processes it must return a store and take location=",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=positive_seconds, help="run for this long (default 60)")
    budget.add_argument("--runs", type=positive_int, help="run this many seeded runs")
    p.add_argument("--seed", type=int, help="session seed (default: random, printed)")
    p.add_argument(
        "--faults",
        help=f"comma-separated disruptions to inject (default all: {','.join(EVENTS)}; "
        f"with --processes: {','.join(PROCESS_EVENTS)}, only crash with --kv-factory)",
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
        help="real crashes: SIGKILL a child committing on a durable --kv (or --kv-factory "
        "store), then verify",
    )
    p.add_argument(
        "--writers",
        type=positive_int,
        help="with --processes: actors each child commits on at once, one thread each, so "
        f"their commits share flushes; each is verified after every kill (default "
        f"{DEFAULT_WRITERS}; 1: one actor, no group commit)",
    )
    p.add_argument(
        "--replay",
        type=Path,
        help="replay a failure file written by a failed run (with the --kv-factory it was "
        "made with, if any)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="where to write a failure (default pagekv-fuzz-SEED.json in the temporary "
        "directory, $TMPDIR or /tmp)",
    )
    p.set_defaults(run=_run)


def _usage(message: str) -> NoReturn:
    """A usage error: one line, exit status 2 (1 is a failure found)."""
    print(f"pagekv fuzz: {message}", file=sys.stderr)
    raise SystemExit(2)


def _run(args: argparse.Namespace) -> int:
    spec: str | None = args.kv_factory
    if args.replay is not None:
        return _replay(args.replay, spec)
    if args.processes and args.kv is not None and not args.kv.startswith("file:"):
        _usage(
            "--processes needs a durable store the processes share, a file: one "
            f"(or none: a temporary one) or a --kv-factory; got {redact_url(args.kv)}"
        )
    if args.writers is not None and not args.processes:
        _usage("--writers goes with --processes")
    events = _events(args.faults, args.processes, spec is not None)
    subject = None if spec is None else _subject(spec)
    if subject is not None and args.processes:
        subject.close()
        _check_reopens(subject)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    seconds = args.seconds if args.seconds is not None or args.runs is not None else 60.0
    if args.kv is None and not args.processes:
        args.kv = "memory://"
    if spec is not None:
        on = f"factory {spec}"
    elif args.kv is None:
        on = "a file: store in a fresh temporary directory"
    else:
        on = f"store {redact_url(args.kv)}"
    print(f"pagekv fuzz: seed {seed}, {on}", flush=True)
    if args.processes:
        return _processes(args, spec, seed, seconds or 60.0, events)
    config = FuzzConfig(
        kv=args.kv,
        kv_factory=spec,
        seed=seed,
        runs=args.runs,
        seconds=seconds,
        steps_per_run=args.steps,
        events=events,
        max_blob=args.max_blob,
    )
    line = StatusLine()
    progress = _Progress(line)
    try:
        if subject is None:
            coverage, found = fuzz(config, progress=progress)
        else:
            try:
                coverage, found = fuzz(config, progress, subject.namespace, subject.close)
            finally:
                subject.close()
    finally:
        line.end()
    if found is None:
        _report(coverage)
        return 0
    out = args.out or Path(tempfile.gettempdir()) / f"pagekv-fuzz-{seed}.json"
    found.save(out, config)
    print(f"FAILED (seed {seed}, run seed {found.seed}): {found.failure}", file=sys.stderr)
    print(f"minimised to {len(found.steps)} steps:", file=sys.stderr)
    _print_steps(found.steps)
    again = "" if spec is None else f" --kv-factory {spec}"
    print(f"replay with: pagekv fuzz --replay {out}{again}", file=sys.stderr)
    return 1


def _events(faults: str | None, processes: bool, factory: bool) -> frozenset[str]:
    """The disruptions asked for, all known ones by default. `disk`, `future`, `shm` and
    `stop` act on a `file:` store's files, so a factory's store goes without them."""
    known = PROCESS_EVENTS if processes else EVENTS
    default = [e for e in known if not (factory and e in FILE_ONLY_EVENTS)]
    asked = faults if faults is not None else ",".join(default)
    events = frozenset(e for e in asked.split(",") if e)
    if not events:
        _usage(f"--faults names none of the disruptions; known: {', '.join(known)}")
    unknown = events - set(known)
    if unknown:
        mode = " with --processes" if processes else ""
        _usage(f"unknown --faults {sorted(unknown)}{mode}; known: {', '.join(known)}")
    file_only = sorted(events & set(FILE_ONLY_EVENTS)) if factory else []
    if file_only:
        _usage(
            f"--faults {','.join(file_only)} acts on a file: store's own files and is for --kv "
            "file: only; with --kv-factory, --processes injects crash"
        )
    return events


def _subject(spec: str) -> Subject:
    """The factory `spec` names, loaded and called once to see what it returns (a usage error
    if it cannot be)."""
    try:
        return Subject(load_kv_factory(spec), name=spec)
    except UsageError as e:
        _usage(str(e))
    except Exception as e:  # the user's module or factory failing: nothing to fuzz
        _usage(f"factory {spec} failed: {type(e).__name__}: {e}")


def _check_reopens(subject: Subject) -> None:
    """`--processes` opens the backend in every process, at one location: the factory must
    return a store and take `location=`."""
    if not subject.returns_store:
        _usage(
            f"--processes needs a factory that returns a store, which each process opens "
            f"itself; {subject.name} returns a namespace"
        )
    if not subject.takes_location:
        _usage(
            f"--processes needs a factory that takes location=, the directory every process "
            f"opens the store at; {subject.name} takes none"
        )


def _processes(
    args: argparse.Namespace, spec: str | None, seed: int, seconds: float, events: frozenset[str]
) -> int:
    """Real crashes on `--kv`, or on a store in a fresh directory (a `file:` one, or the
    factory's), left there for a look if the run fails: never in the directory it runs from."""
    fresh = spec is not None or args.kv is None
    location = Path(tempfile.mkdtemp(prefix="pagekv-fuzz-")) if fresh else None
    if spec is not None:
        backend = Backend(factory=spec, location=location)
    else:
        backend = Backend(url=args.kv or f"file://{location}")
    failed = False
    try:
        coverage = fuzz_processes(
            backend,
            seed,
            seconds,
            max_blob=args.max_blob,
            events=events,
            writers=args.writers or DEFAULT_WRITERS,
        )
    except FuzzFailure as failure:
        failed = True
        print(f"FAILED (seed {seed}): {failure}", file=sys.stderr)
        if location is not None:
            print(f"the store is left at {location}", file=sys.stderr)
        return 1
    finally:
        if location is not None and not failed:
            shutil.rmtree(location, ignore_errors=True)
    _report(coverage)
    return 0


def _replay(path: Path, spec: str | None) -> int:
    """Replay a failure file on the backend it was made with: its URL, or the same factory."""
    try:
        steps, data = load_replay(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        _usage(f"cannot replay {path}: {reason}")
    url = data.get("kv", "memory://")
    made_with = data.get("kv_factory")
    if made_with is None and spec is not None:
        _usage(
            f"{path} was made on store {redact_url(url)}, not with a factory: replay it "
            "without --kv-factory"
        )
    if made_with is not None and made_with != spec:
        given = "none" if spec is None else spec
        _usage(
            f"{path} was made with --kv-factory {made_with} (given: {given}): a replay on "
            "another backend proves nothing"
        )
    namespaces: Callable[[], ActorKv]
    if spec is None:
        quota = data.get("max_storage_bytes")
        store = open_kv(url, limits=None if quota is None else KvLimits(max_storage_bytes=quota))
        namespaces = functools.partial(store.namespace, f"pagekv-fuzz-replay/{path.name}")
        release = store.close
    else:
        subject = _subject(spec)
        namespaces, release = subject.namespace, subject.close
    try:
        coverage = execute(steps, namespaces, data.get("db_options", {}), release)
    except FuzzFailure as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        _print_steps(steps)
        return 1
    print(f"replay of {len(steps)} steps passed")
    _report(coverage)
    return 0


def _print_steps(steps: list[Step]) -> None:
    for n, step in enumerate(steps):
        print(f"  {n:3d} {to_json(step)}", file=sys.stderr)


class _Progress:
    """Coverage so far, on a `StatusLine` (kept on a terminal when the run ends)."""

    def __init__(self, line: StatusLine) -> None:
        self.line = line

    def __call__(self, coverage: Coverage) -> None:
        text = (
            f"runs {coverage.runs}, steps {coverage.steps}, commits {coverage.commits}, "
            f"faults {sum(coverage.faults.values())}, takeovers {coverage.takeovers}, "
            f"crashes {coverage.crashes}"
        )
        self.line.show(f"  {text}", plain=f"pagekv fuzz: {text}")


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
