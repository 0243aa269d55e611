"""The gates beside the suite: ruff (lint and format) over the code and mypy over the package,
each at zero findings (configured in pyproject.toml). They run as tests, so that `./test` and
CI fail on a finding the same way as on a failing test, with the tool's output in the report."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("pagekv", "tests", "benchmarks")


def _run(*args: str) -> None:
    """`python -m ARGS` from the checkout's root, with the venv's interpreter; exit 0 or fail
    with what the tool printed."""
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, (
        f"`{' '.join(args)}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )


def test_ruff_check() -> None:
    _run("ruff", "check", *CODE)


def test_ruff_format() -> None:
    _run("ruff", "format", "--check", *CODE)


def test_mypy() -> None:
    _run("mypy", "pagekv")


def test_mypy_strict_on_the_compiled_modules() -> None:
    """The modules mypyc compiles (`[tool.pagekv] compiled`) run as C where a compiler exists,
    and mypyc trusts their types: an `Any` that reaches typed code there is a check skipped at
    run time, not only on paper. So they meet `--strict`, the rest of the package plain mypy."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        compiled = tomllib.load(f)["tool"]["pagekv"]["compiled"]
    assert len(compiled) > 20, compiled
    _run("mypy", "--strict", *compiled)
