"""`pagekv check-backend`: the conformance check from the command line, and its replay files.

Exit status: 0 when the backend conforms, 1 when it violates the contract (each violation is
printed and written to a replay file), 2 for a usage error (a factory that cannot be imported,
fails its first call or opens one store at every call, bad options, an --out that cannot be
written, a replay file that is malformed or was made with another factory), 3 when nothing could
be checked (every part run was not checked: no verdict either way), 130 when interrupted.

The process ends once the verdict is printed, even if the backend left a thread running that
would keep it alive.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from pagekv.cli.args import positive_seconds
from pagekv.testing.check import DEFAULT_SECONDS, PARTS, CheckResult, check_backend, replay
from pagekv.testing.outcome import PartResult
from pagekv.testing.subject import DEFAULT_CALL_TIMEOUT, Subject, UsageError, load_factory
from pagekv.testing.violation import Violation

NOTHING_CHECKED: Final = 3
INTERRUPTED: Final = 130


def add_check_backend_command(commands: argparse._SubParsersAction, summary: str) -> None:
    p = commands.add_parser(
        "check-backend",
        help=summary,
        description="Check a KV backend of your own against pagekv's contract: every clause, "
        "a concurrent model-based run, a restart run (when the factory makes stores it can "
        "reopen) and the page-I/O fuzz. FACTORY is MODULE:CALLABLE; the callable returns a "
        "fresh namespace or store, and is passed limits= and location= if it declares them. "
        "Exits 0 when the backend conforms, 1 when it violates the contract, 2 on usage errors, "
        "3 when nothing could be checked (no verdict), 130 when interrupted.",
    )
    p.add_argument("factory", metavar="MODULE:CALLABLE", help="the backend factory")
    p.add_argument(
        "--seconds",
        type=positive_seconds,
        default=DEFAULT_SECONDS,
        help="wall time of the whole check: the contract's clauses always run to the end, the "
        "timed parts (concurrent, restart, fuzz) share what they leave, and a part that finds "
        "a violation minimises it within what is left of its share, a few seconds at least "
        f"(default {DEFAULT_SECONDS:g})",
    )
    p.add_argument(
        "--call-timeout",
        type=positive_seconds,
        default=DEFAULT_CALL_TIMEOUT,
        help="seconds one backend call may take before it is reported as one that does not "
        f"return; the parts after it are then not run (default {DEFAULT_CALL_TIMEOUT:g})",
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
    try:
        code = _check(args)
    except UsageError as e:
        print(f"pagekv check-backend: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("pagekv check-backend: interrupted", file=sys.stderr)
        code = INTERRUPTED
    return _leave(code)


def _leave(code: int) -> int:
    """`code`, or the process ends here with it: a thread the backend left running (not a
    daemon) would keep it alive after the verdict. Only then, so that a caller of `main` in
    its own process gets the code back."""
    here = threading.current_thread()
    if any(t is not here and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _check(args: argparse.Namespace) -> int:
    if args.replay is not None:
        return _replay(args.factory, _factory(args.factory), args.replay, args.call_timeout)
    parts = _parts(args.parts)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out = args.out or Path(f"pagekv-check-{seed}.json")
    _writable(out)
    factory = _factory(args.factory)
    header = f"pagekv check-backend: {args.factory}, seed {seed}, {args.seconds:g} s"
    with _elsewhere():
        result = check_backend(
            factory,
            seconds=args.seconds,
            seed=seed,
            name=args.factory,
            parts=parts,
            progress=_print_part,
            call_timeout=args.call_timeout,
            started=lambda: print(header, flush=True),
        )
    return _conclude(result, out)


@contextmanager
def _elsewhere() -> Iterator[None]:
    """Run the factory in a scratch directory, removed after: one that opens a store at a
    relative place of its own (`open_kv()`'s `./.pagekv`) is refused (`Subject`), and writes
    nothing where the command runs, which may hold the user's own store."""
    home = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="pagekv-check-cwd-") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(home)


def _factory(spec: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # MODULE is looked up where the command runs
    return load_factory(spec)


def _parts(spec: str) -> list[str]:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"--parts names no part; name one or more of {', '.join(PARTS)}")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise UsageError(f"unknown --parts {unknown}; the parts are {', '.join(PARTS)}")
    return parts


def _writable(path: Path) -> None:
    """Refuse, before the check runs, an --out its violations could not be written to."""
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"--out {path} is a directory; name a file for the replay file")
    if not folder.is_dir():
        raise UsageError(f"--out {path}: there is no directory {folder}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--out {path} cannot be written")


def _print_part(result: PartResult) -> None:
    print(result.line(), flush=True)
    for reason in result.not_checked:
        print(f"    not checked: {reason}", flush=True)


def _conclude(result: CheckResult, out: Path) -> int:
    if result.ok and not result.checked:
        print(
            f"nothing checked: no part could check {result.factory} (see above); no verdict "
            f"(seed {result.seed})",
            file=sys.stderr,
        )
        return NOTHING_CHECKED
    if result.ok:
        print(f"ok: {result.factory} conforms (seed {result.seed})")
        return 0
    for violation in result.violations:
        print(file=sys.stderr)
        print(violation.report(), file=sys.stderr)
    try:
        save(out, result.factory, result.seed, result.violations)
        saved = f"; replay with: pagekv check-backend {result.factory} --replay {out}"
    except OSError as e:
        saved = f"; the replay file {out} could not be written: {e.strerror or e}"
    print(f"\n{len(result.violations)} violation(s){saved}", file=sys.stderr)
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


def _load(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """The factory a replay file was made with, and its violations, each checked for the keys
    a replay reads (what their details hold is checked by the part that replays them)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise UsageError(f"cannot replay {path}: {reason}") from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("factory"), str)
        and isinstance(data.get("violations"), list)
    ):
        raise UsageError(
            f"cannot replay {path}: a replay file is an object with a factory (a string) and "
            "violations (a list)"
        )
    for n, entry in enumerate(data["violations"]):
        if not (
            isinstance(entry, dict)
            and entry.get("part") in PARTS
            and isinstance(entry.get("clause"), str)
            and isinstance(entry.get("details"), dict)
        ):
            raise UsageError(
                f"cannot replay {path}: violation {n} must have a part (one of "
                f"{', '.join(PARTS)}), a clause and details"
            )
    return data["factory"], data["violations"]


def _replay(name: str, factory: Any, path: Path, call_timeout: float) -> int:
    made_with, entries = _load(path)
    if made_with != name:
        raise UsageError(
            f"{path} was made with factory {made_with}, not {name}: a replay against another "
            "backend proves nothing"
        )
    with _elsewhere():
        return _replay_in(made_with, factory, entries, call_timeout)


def _replay_in(name: str, factory: Any, entries: list[dict[str, Any]], call_timeout: float) -> int:
    subject = Subject(factory, name, call_timeout=call_timeout)
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
