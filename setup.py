"""Build hook: compile the modules listed in `[tool.pagekv] compiled` with mypyc, where it can.

Why: a one-row commit runs a few hundred lines of Python (the VFS's commit, the KV contract's
checks, the store's append), and mypyc turns the same typed source into C, cutting the
instructions per commit by about half (benchmarks/RESULTS.md). Nothing is written twice: the same
modules run interpreted when they are not compiled.

What is built (`plan`) follows `PAGEKV_PURE_PYTHON` at install time:
- `1`: interpreted.
- unset or empty: compiled if this machine's C compiler builds a small extension with the Python
  headers (`compiler_problem`), else interpreted, with one line (a warning, which pip shows)
  saying so and how to get the compiled build.
- `0`: compiled, or a one-line error naming what is missing or failed.

The outcome goes into the installed metadata (`pagekv-build.json`): `pagekv --version` reads it
(`pagekv.build_info`), and ./run and ./test keep to its choice (scripts/env.sh). An interpreted
editable install also deletes the tree's compiled files of those modules, which Python would
otherwise still import in preference to the sources.

Only the standard library at the top: scripts/env.sh and tests/test_install.py import this file
for its functions (`main` runs only as a script, which is how setuptools runs it).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RECORD = "pagekv-build.json"
"""The build record's file name in the install's metadata directory."""
HOW_TO_COMPILE = (
    "for the compiled build, apt-get install -y gcc python3-dev (Debian) and reinstall: "
    "PAGEKV_PURE_PYTHON=0 ./run, or pip install -e ."
)

MYPYC_STEP = "pagekv: mypyc: type-checking the compiled modules and generating their C"
"""The line each run of this file prints before mypyc starts (once per setuptools step)."""


def compiled_sources(root: Path = ROOT) -> list[str]:
    """The `[tool.pagekv] compiled` list of pyproject.toml: source paths relative to `root`."""
    with open(root / "pyproject.toml", "rb") as f:
        sources: list[str] = tomllib.load(f)["tool"]["pagekv"]["compiled"]
    return sources


def module_name(source: str) -> str:
    """`pagekv/kv/fence.py` -> `pagekv.kv.fence`."""
    return source.removesuffix(".py").replace("/", ".")


PROBE = """#include <Python.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&probe); }
"""
"""A C extension in five lines: what the compiler must build for mypyc's modules to build."""
PROBE_TIMEOUT = 60.0


def probe_problem(compiler: list[str], include: str) -> str | None:
    """Why `compiler` fails to compile `PROBE` against the headers in `include`, or None.

    Why: a compiler that is found can still fail (no Python headers where it looks, a broken
    toolchain), and would then fail the install a minute later inside setuptools, with pip's
    many-line error and no fallback; this costs a fraction of a second."""
    shown = shlex.join(compiler)
    with tempfile.TemporaryDirectory(prefix="pagekv-cc-") as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(PROBE)
        command = [*compiler, "-fPIC", f"-I{include}", "-c", "probe.c", "-o", "probe.o"]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=PROBE_TIMEOUT, cwd=tmp
            )
        except OSError as e:
            return f"a failing C compiler ({shown} could not be run: {e.strerror or e})"
        except subprocess.TimeoutExpired:
            return f"a failing C compiler ({shown} took over {PROBE_TIMEOUT:.0f} s on a test file)"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    said = next((line for line in lines if "error" in line), lines[0] if lines else "")
    detail = f": {said[:200]}" if said else ""
    return (
        f"a failing C compiler ({shown} exited with {done.returncode} on a test file "
        f"that includes Python.h{detail})"
    )


def compiler_problem(
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
    exists: Callable[[str], bool] = os.path.exists,
    probe: Callable[[list[str], str], str | None] = probe_problem,
) -> str | None:
    """Why this machine cannot build mypyc's C extensions, or None if it can: the compiler that
    setuptools runs (`$CC`, else the one Python was built with) must be found, `Python.h` be in
    this Python's include directory, and the one compile a small extension with it (`probe`)."""
    if sys.platform == "win32":
        return None  # setuptools finds MSVC by itself, not through CC
    cc = env.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(cc)  # CC may carry a wrapper or flags: `ccache gcc`, `gcc -pthread`
    program = words[0] if words else "cc"
    if which(program) is None:
        return f"no C compiler ({program} not found)"
    include = sysconfig.get_paths()["include"]
    header = os.path.join(include, "Python.h")
    if not exists(header):
        return f"no Python headers ({header} not found)"
    return probe(words or [program], include)


@dataclass(frozen=True)
class Plan:
    choice: str
    """`PAGEKV_PURE_PYTHON` as given: "1", "0" or "" (recorded: ./run and ./test keep to it)."""
    compile: bool
    interpreted: str | None = None
    """Why the modules are not compiled, and how to get them compiled (None when they are)."""


def plan(
    env: Mapping[str, str] = os.environ,
    problem: Callable[[], str | None] = compiler_problem,
) -> Plan:
    """What to build (see the module docstring). Raises SystemExit with a one-line message for a
    bad `PAGEKV_PURE_PYTHON`, or for `0` on a machine that cannot compile."""
    choice = env.get("PAGEKV_PURE_PYTHON", "")
    if choice == "1":
        chosen = (
            "PAGEKV_PURE_PYTHON=1 at install; for the compiled build, reinstall without it: "
            "PAGEKV_PURE_PYTHON=0 ./run, or pip install -e ."
        )
        return Plan(choice, False, chosen)
    if choice not in ("", "0"):
        raise SystemExit(f"pagekv: PAGEKV_PURE_PYTHON is 1, 0 or unset, not {choice!r}")
    why = problem()
    if why is None:
        return Plan(choice, True)
    if choice == "0":
        raise SystemExit(
            f"pagekv: PAGEKV_PURE_PYTHON=0 asks for the compiled build, but {why}: "
            "apt-get install -y gcc python3-dev (Debian), or set PAGEKV_PURE_PYTHON=1"
        )
    return Plan(choice, False, f"{why} at install; {HOW_TO_COMPILE}")


def setup_notice(
    env: Mapping[str, str] = os.environ,
    problem: Callable[[], str | None] = compiler_problem,
) -> str:
    """The line ./run and ./test print before they install into .venv (scripts/env.sh): the
    compiling build takes about two minutes."""
    build = plan(env, problem)
    if build.compile:
        n = len(compiled_sources())
        return (
            f"setting up .venv (compiling {n} modules with mypyc, ~2 min; "
            "PAGEKV_PURE_PYTHON=1 skips it)"
        )
    return f"setting up .venv, interpreted: {build.interpreted}"


def built_files(sources: list[str], root: Path = ROOT) -> list[Path]:
    """The compiled files in the tree that this Python would import instead of `sources`, and
    mypyc's shared library beside the package."""
    found: list[Path] = []
    for suffix in EXTENSION_SUFFIXES:
        for source in sources:
            built = root / (source.removesuffix(".py") + suffix)
            if built.exists():
                found.append(built)
        found += root.glob(f"*__mypyc{suffix}")
    return found


def main() -> None:
    from setuptools import setup
    from setuptools.command.egg_info import egg_info

    sources = compiled_sources()
    build = plan()
    record = {
        "choice": build.choice,
        "modules": [module_name(s) for s in sources],
        "compiled": build.compile,
        "interpreted": build.interpreted,
    }

    class EggInfo(egg_info):  # type: ignore[misc]
        """Also writes the build record, which goes into the installed dist-info."""

        def run(self) -> None:
            super().run()
            path = os.path.join(self.egg_info, RECORD)
            self.write_file("build record", path, json.dumps(record))

    ext_modules = []
    if build.compile:
        from mypyc.build import mypycify

        # pip shows it with -v, where scripts/setup_progress.py turns it into a step of the set-up
        print(MYPYC_STEP, flush=True)
        # The build's own mypy cache: one shared with mypy runs in another environment (where
        # apsw, say, resolves) can hide an error that a clean build then hits.
        ext_modules = mypycify(["--cache-dir", "build/mypy-cache", *sources], opt_level="3")
    else:
        commands = set(sys.argv)
        # Said once per install, where the wheel is built (setuptools runs this file for each
        # step). pip shows a build backend's warnings for a local directory, and line 0 puts
        # no source line under it; ./run and ./test have said it already.
        wheel = {"editable_wheel", "bdist_wheel", "develop"} & commands
        if wheel and os.environ.get("PAGEKV_SETUP_NOTICE_SHOWN") != "1":
            message = f"pagekv runs interpreted: {build.interpreted}"
            warnings.warn_explicit(message, UserWarning, "setup.py", 0)
        if {"editable_wheel", "develop"} & commands:
            for path in built_files(sources):
                path.unlink()
    # setuptools' advice on every editable install of a flat layout, which pip shows as a
    # ten-line warning: pagekv's tests and commands run from the tree on purpose.
    warnings.filterwarnings("ignore", message="Editable installation", module="setuptools")
    setup(ext_modules=ext_modules, cmdclass={"egg_info": EggInfo})


if __name__ == "__main__":
    main()
