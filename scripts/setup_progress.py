"""Run the set-up's `pip install -v ...` and show what it is doing in a few lines (scripts/env.sh).

Why: the compiled build spends about two minutes in one pip command, most of it in a single
`gcc` run on the C that mypyc generates for all the compiled modules, and `pip --quiet` says
nothing meanwhile; pip's verbose output is hundreds of lines of compiler command lines. This
turns it into a line per step of the build (mypy and mypyc, gcc, installing),
and a line after every `TICK` seconds without one, so a slow machine is seen working. The
steps start with the line setup.py prints before mypyc runs, which an interpreted build never
prints: it shows at most the ticks, if it is slow. When pip fails, its output of the failing
step is shown, as `pip --quiet` would.

Standard library only: it runs with the system's python3 before .venv has anything else.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

TICK = 20.0
"""Seconds without a line shown before a line saying which step is still going on."""


def step_of(line: str, modules: int) -> str | None:
    """The step that a line of pip's verbose output starts, as shown, or None."""
    text = line.strip()
    if text.startswith("pagekv: mypyc: "):  # setup.py's MYPYC_STEP
        return f"mypy and mypyc: type-checking {modules} modules and generating their C"
    if text.startswith("building '") and text.endswith("__mypyc' extension"):
        return f"gcc: compiling the C of the {modules} modules (the longest step)"
    if text.startswith("building 'pagekv."):
        return f"gcc: building the {modules} modules' own files"
    if text.startswith("Installing build dependencies: started"):
        return "installing the build tools (setuptools, mypy) for the build"
    if line.startswith("Installing collected packages"):  # pip's own, not the build tools'
        return "installing pagekv and its dependencies"
    return None


def run(
    command: list[str],
    out: TextIO,
    modules: int,
    tick: float = TICK,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Runs `command` (pip with `-v`), writes the steps to `out`, and returns its exit status.

    Steps print from the first of mypyc's on: an interpreted build shows at most ticks."""
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert child.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    start = clock()
    shown: set[str] = set()
    step, since, said = "pip install", start, start
    compiling = False
    section: list[str] = []  # pip's output since its last "Running command", shown on failure
    while True:
        wait = said + tick - clock()
        if wait <= 0:
            said = clock()
            out.write(f"  ... {step}, {said - since:.0f} s ({said - start:.0f} s in all)\n")
            out.flush()
            continue
        try:
            line = lines.get(timeout=wait)
        except queue.Empty:
            continue
        if line is None:
            break
        if "Running command" in line:
            section = []
        section.append(line)
        found = step_of(line, modules)
        if found is None or found in shown:
            continue
        shown.add(found)
        compiling = compiling or found.startswith("mypy")
        step, since = found, clock()
        if compiling:
            said = since
            out.write(f"  [{since - start:3.0f} s] {found}\n")
            out.flush()
    status = child.wait()
    if status != 0:
        out.write("".join(section[-80:]))
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[2:], sys.stderr, int(sys.argv[1])))
