"""Build hook: compile the modules listed in `[tool.pagekv] compiled` with mypyc.

Why: a one-row commit runs a few hundred lines of Python (the VFS's commit, the KV contract's
checks, the store's append), and mypyc turns the same typed source into C, cutting the
instructions per commit by about half (benchmarks/RESULTS.md). Nothing is written twice: with
`PAGEKV_PURE_PYTHON=1` at install time the same modules run interpreted.
"""

import os
import tomllib

from setuptools import setup

with open("pyproject.toml", "rb") as f:
    compiled = tomllib.load(f)["tool"]["pagekv"]["compiled"]

if os.environ.get("PAGEKV_PURE_PYTHON") == "1":
    ext_modules = []
else:
    from mypyc.build import mypycify

    # The build's own mypy cache: one shared with mypy runs in another environment (where apsw,
    # say, resolves) can hide an error that a clean build then hits.
    ext_modules = mypycify(["--cache-dir", "build/mypy-cache", *compiled], opt_level="3")

setup(ext_modules=ext_modules)
