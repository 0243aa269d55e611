"""pagekv: stateful actors whose SQLite databases live in a key-value store.

`pagekv.COMPILED` says whether the modules that setup.py compiles with mypyc (`[tool.pagekv]
compiled` in pyproject.toml) run compiled in this process, and `build_description()` says how
many, or why not and how to get them compiled (`pagekv --version`, the bench header). Both are
worked out on first use, so `import pagekv` stays cheap.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_RECORD = "pagekv-build.json"
"""The build record that setup.py writes into the install's metadata: the modules it compiles
(or would), and why it did not."""


@dataclass(frozen=True)
class BuildInfo:
    modules: tuple[str, ...]
    """The modules the install compiles, or would have (from its build record)."""
    compiled: tuple[str, ...]
    """Those of `modules` that this process imports from a C extension."""
    interpreted: str | None
    """The build record's reason for not compiling, and how to compile (None: it compiled)."""
    recorded: bool = True
    """False when the install has no build record (made before pagekv kept one): `modules` is
    then pyproject.toml's list, where pagekv runs from its source tree."""

    @property
    def is_compiled(self) -> bool:
        return bool(self.modules) and self.compiled == self.modules

    def describe(self) -> str:
        """One line for `pagekv --version` and the bench header."""
        n = len(self.modules)
        if self.is_compiled:
            return f"compiled: {n} modules"
        if self.compiled:
            rest = ", ".join(m for m in self.modules if m not in self.compiled)
            return f"partly compiled: {len(self.compiled)} of {n} modules, not {rest}; reinstall"
        if not self.recorded:
            return "interpreted: the install has no build record to say why; reinstall"
        if self.interpreted:
            return f"interpreted: {self.interpreted}"
        return (
            f"interpreted: the {n} modules compiled at install are not in use (their files are "
            "gone, or were built for another Python); reinstall"
        )


def is_extension(module: str) -> bool:
    """Whether `module` is (or would be) imported from a shared library rather than source:
    its `__file__` once imported, else the file the import system would pick."""
    from importlib.machinery import EXTENSION_SUFFIXES
    from importlib.util import find_spec

    loaded = sys.modules.get(module)
    if loaded is not None:
        path = getattr(loaded, "__file__", None)
    else:
        try:
            spec = find_spec(module)
        except ImportError:
            return False
        path = spec.origin if spec is not None else None
    return isinstance(path, str) and path.endswith(tuple(EXTENSION_SUFFIXES))


@functools.cache
def build_info() -> BuildInfo:
    """How this install of pagekv was built, and what this process runs of it."""
    from importlib import metadata

    try:
        text = metadata.distribution("pagekv").read_text(_RECORD)
    except metadata.PackageNotFoundError:
        text = None
    if text is not None:
        record = json.loads(text)
        modules, interpreted = tuple(record["modules"]), record["interpreted"]
    else:  # an install older than the record: the tree's list, if pagekv runs from its tree
        modules, interpreted = _tree_modules(), None
    compiled = tuple(m for m in modules if is_extension(m))
    return BuildInfo(modules, compiled, interpreted, recorded=text is not None)


def _tree_modules() -> tuple[str, ...]:
    import tomllib
    from pathlib import Path

    try:
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
            sources = tomllib.load(f)["tool"]["pagekv"]["compiled"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return ()
    return tuple(s.removesuffix(".py").replace("/", ".") for s in sources)


def build_description() -> str:
    """`compiled: 19 modules`, or `interpreted: <why>; <how to get them compiled>`."""
    return build_info().describe()


if TYPE_CHECKING:
    COMPILED: bool
    """True when every module that setup.py compiles runs compiled in this process."""


def __getattr__(name: str) -> object:
    if name == "COMPILED":
        return build_info().is_compiled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
