"""`pagekv check-backend`: the conformance check from the command line, and its replay files.

Exit status: 0 when the backend conforms, 1 when it violates the contract (each violation is
printed and written to a replay file), 2 for a usage error (a factory that cannot be loaded or
called, a replay file made with another factory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pagekv.cli_args import positive_seconds
from pagekv.testing.check import DEFAULT_SECONDS, PARTS, CheckResult, check_backend, replay
from pagekv.testing.outcome import PartResult
from pagekv.testing.report import Violation
from pagekv.testing.subject import Subject, UsageError, load_factory


def add_check_backend_command(commands: argparse._SubParsersAction, summary: str) -> None:
    p = commands.add_parser(
        "check-backend",
        help=summary,
        description="Check a KV backend of your own against pagekv's contract: every clause, "
        "a concurrent model-based run, a restart run (when the factory makes stores it can "
        "reopen) and the page-I/O fuzz. FACTORY is MODULE:CALLABLE; the callable returns a "
        "fresh namespace or store, and is passed limits= and location= if it declares them. "
        "Exits 0 when the backend conforms, 1 when it violates the contract, 2 on usage errors.",
    )
    p.add_argument("factory", metavar="MODULE:CALLABLE", help="the backend factory")
    p.add_argument(
        "--seconds",
        type=positive_seconds,
        default=DEFAULT_SECONDS,
        help=f"time shared by the timed parts (default {DEFAULT_SECONDS:g})",
    )
    p.add_argument("--seed", type=int, help="seed (default: random, printed)")
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run (default all: {','.join(PARTS)})",
    )
    p.add_argument("--replay", type=Path, help="re-run the violations of a replay file")
    p.add_argument(
        "--out", type=Path, help="where to write violations (default ./pagekv-check-SEED.json)"
    )
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # MODULE is looked up where the command runs
    try:
        factory = load_factory(args.factory)
        if args.replay is not None:
            return _replay(args.factory, factory, args.replay)
        parts = [p for p in args.parts.split(",") if p]
        unknown = sorted(set(parts) - set(PARTS))
        if unknown or not parts:
            raise UsageError(f"unknown --parts {unknown}; the parts are {', '.join(PARTS)}")
        seed = args.seed
        if seed is None:
            import random

            seed = random.SystemRandom().randrange(2**32)
        print(f"pagekv check-backend: {args.factory}, seed {seed}, {args.seconds:g} s", flush=True)
        result = check_backend(
            factory,
            seconds=args.seconds,
            seed=seed,
            name=args.factory,
            parts=parts,
            progress=_print_part,
        )
    except UsageError as e:
        print(f"pagekv check-backend: {e}", file=sys.stderr)
        return 2
    return _conclude(result, args.out or Path(f"pagekv-check-{seed}.json"))


def _print_part(result: PartResult) -> None:
    print(result.line(), flush=True)
    for reason in result.not_checked:
        print(f"    not checked: {reason}", flush=True)


def _conclude(result: CheckResult, out: Path) -> int:
    if result.ok:
        print(f"ok: {result.factory} conforms (seed {result.seed})")
        return 0
    for violation in result.violations:
        print(file=sys.stderr)
        print(violation.report(), file=sys.stderr)
    save(out, result.factory, result.seed, result.violations)
    print(
        f"\n{len(result.violations)} violation(s); replay with: "
        f"pagekv check-backend {result.factory} --replay {out}",
        file=sys.stderr,
    )
    return 1


def save(path: Path, factory: str, seed: int, violations: list[Violation]) -> None:
    """A replay file: the factory it was made with, and each violation with what replays it."""
    data: dict[str, Any] = {
        "factory": factory,
        "seed": seed,
        "violations": [
            {"part": v.part, "clause": v.clause, "details": v.details, "report": v.report()}
            for v in violations
        ],
    }
    path.write_text(json.dumps(data, indent=1))


def _replay(name: str, factory: Any, path: Path) -> int:
    try:
        data = json.loads(path.read_text())
        made_with, entries = data["factory"], data["violations"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise UsageError(f"cannot replay {path}: {reason}") from None
    if made_with != name:
        raise UsageError(
            f"{path} was made with factory {made_with}, not {name}: a replay against another "
            "backend proves nothing"
        )
    subject = Subject(factory, name)
    reproduced = 0
    try:
        for entry in entries:
            found = replay(subject, entry["part"], entry["details"])
            if found is None:
                print(f"{entry['part']}: {entry['clause']}: did not reproduce")
            else:
                reproduced += 1
                print(found.report(), file=sys.stderr)
    finally:
        subject.close()
    print(f"{reproduced} of {len(entries)} violation(s) reproduced")
    return 1 if reproduced else 0
