"""The floor under one-row commits on `memory://`: what a Python VFS over APSW can reach at best.

Run (mypyc compiles the floor's file classes, as pagekv's own hot path is compiled):

    .venv/bin/pip install mypy==2.4.1      # the version pyproject's build uses
    .venv/bin/python benchmarks/commit_floor.py [--reps 9] [--commits 3000]

Five systems commit the same one-row INSERTs (autocommit, 100-byte BLOB, 300 warm-up rows), each
repetition in a fresh database, the systems in shuffled order within each repetition:
- `native`: SQLite on a local file, `journal_mode=MEMORY, synchronous=OFF, locking_mode=EXCLUSIVE`
  (the `pagekv bench` baseline of the `memory://` target);
- `no-op VFS`, `essential VFS`, `essential VFS, overwrite`: the file classes of `_floor_file.py`
  under the same pragmas;
- `pagekv`: `open_database` on a fresh `memory://` namespace.
Reported: median µs per commit, and the median over repetitions of native's time ÷ the system's
in the same repetition (pagekv's target is ≥ 0.5).
Results: `benchmarks/RESULTS.md`, "The floor of a Python VFS".
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import apsw

from pagekv.kv import open_kv
from pagekv.vfs import open_database

PRAGMAS = ("page_size=4096", "locking_mode=exclusive", "journal_mode=memory", "synchronous=off")
ROW = os.urandom(100)
INSERT = "INSERT INTO t(v) VALUES (?)"


def _floor_module(compile_it: bool, workdir: Path) -> ModuleType:
    source = Path(__file__).with_name("_floor_file.py")
    shutil.copy(source, workdir / source.name)
    if compile_it:
        try:
            import mypyc  # noqa: F401
        except ImportError:
            sys.exit("mypyc is missing: `.venv/bin/pip install mypy==2.4.1`, or pass --interpreted")
        subprocess.run(
            [sys.executable, "-m", "mypyc", source.name],
            cwd=workdir,
            check=True,
            capture_output=True,
        )
    sys.path.insert(0, str(workdir))
    return importlib.import_module(source.stem)


class _OneFileVfs(apsw.VFS):
    """Hands SQLite whichever file object `file` holds (one database at a time)."""

    def __init__(self, name: str) -> None:
        self.file: Any = None
        super().__init__(name, base="")

    def xOpen(self, name: Any, flags: list[int]) -> Any:  # type: ignore[override]
        flags[1] = flags[0]
        return self.file

    def xAccess(self, pathname: str, flags: int) -> bool:
        return False

    def xFullPathname(self, name: str) -> str:
        return name

    def xDelete(self, filename: str, syncdir: bool) -> None:
        pass


def _run(connection: apsw.Connection, commits: int) -> float:
    """µs per one-row commit on `connection`, after creating the table and 300 warm-up rows.
    Closes `connection` (APSW's `with` is a transaction, not a close)."""
    try:
        return _timed(connection, commits)
    finally:
        connection.close()


def _timed(connection: apsw.Connection, commits: int) -> float:
    connection.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    execute = connection.execute
    for _ in range(300):
        execute(INSERT, (ROW,))
    start = time.perf_counter()
    for _ in range(commits):
        execute(INSERT, (ROW,))
    return (time.perf_counter() - start) / commits * 1e6


def _pinned(connection: apsw.Connection) -> apsw.Connection:
    for pragma in PRAGMAS:
        connection.execute(f"PRAGMA {pragma}")
    return connection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--interpreted", action="store_true", help="do not compile the floor")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="pagekv-floor-"))
    floor = _floor_module(not args.interpreted, workdir)
    vfs = _OneFileVfs("pagekv-floor")
    native_path = workdir / "native.db"
    store = open_kv("memory://")

    def native() -> float:
        native_path.unlink(missing_ok=True)
        return _run(_pinned(apsw.Connection(str(native_path))), args.commits)

    def through(make_file: Callable[[], object]) -> Callable[[], float]:
        def sample() -> float:
            vfs.file = make_file()
            return _run(_pinned(apsw.Connection("floor.db", vfs="pagekv-floor")), args.commits)

        return sample

    namespaces = iter(range(1_000_000))

    def pagekv() -> float:
        db = open_database(store.namespace(f"floor-{next(namespaces)}"))
        try:
            return _timed(db.connection, args.commits)
        finally:
            db.close()

    systems: dict[str, Callable[[], float]] = {
        "native": native,
        "no-op VFS": through(floor.NoopFile),
        "essential VFS": through(lambda: floor.EssentialFile(False)),
        "essential VFS, overwrite": through(lambda: floor.EssentialFile(True)),
        "pagekv": pagekv,
    }
    times: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for rep in range(args.reps):
        random.shuffle(names)
        for name in names:
            times[name].append(systems[name]())
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    compiled = "interpreted" if args.interpreted else "compiled with mypyc"
    print(f"one-row commits, {args.commits} per sample, {args.reps} reps; floor {compiled}")
    for name in systems:
        ratios = sorted(n / t for n, t in zip(times["native"], times[name], strict=True))
        print(
            f"  {name:26} {statistics.median(times[name]):6.2f} µs/commit"
            f"  native ÷ system {statistics.median(ratios):5.2f}"
            f" (reps {ratios[0]:.2f}..{ratios[-1]:.2f})"
        )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
