"""The import graph of `pagekv`, read from the sources: no circles, and layers that depend one way
(`kv` <- `vfs` <- `actor` <- `protocol` <- `client` <- `server`; the tools and the CLI above).

Why: modules in a circle can only be read, tested and changed together, and a circle closed only
by an import under `if TYPE_CHECKING:` is one all the same (the types say each side knows the
other). Every import counts: at module level, under `TYPE_CHECKING`, inside functions. What the
source cannot show is not seen: imports by name through `importlib`, which only the lazy exports of
`pagekv.server` and `pagekv.actor` (the transfer tools' names it held before they moved) make.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = (
    "pagekv.kv",
    "pagekv.vfs",
    "pagekv.actor",
    "pagekv.protocol",
    "pagekv.client",
    "pagekv.server",
)
"""The runtime, bottom up: a module of one imports nothing of pagekv but its own layer and those
below (and the top package's build metadata)."""
TOOLS = ("pagekv.transfer", "pagekv.bench", "pagekv.fuzz", "pagekv.testing")
"""What runs beside the runtime, never inside it: offline data tools, the benchmark, the fuzzer
and the backend conformance kit."""
BOUNDARIES = (
    "pagekv.kv",
    "pagekv.kv.errors",
    "pagekv.kv.limits",
    "pagekv.kv.wrappers",
    "pagekv.kv.file.log",
    "pagekv.kv.file.holders",
    "pagekv.vfs",
    "pagekv.vfs.format",
    "pagekv.actor",
    "pagekv.actor.errors",
    "pagekv.actor.directory",
    "pagekv.actor.tables",
    "pagekv.actor.views",
    "pagekv.actor.user_kv",
    "pagekv.actor.workflow.history",
)
"""What a tool may import of the runtime: each package's public surface, and the modules that
define what the runtime persists (the page format, the file store's log, the directory's keys,
the internal tables, the reserved `ctx.kv` prefix) or injects faults with. A tool that needs
more is reaching into the runtime's workings, which change without notice."""


def _modules() -> dict[str, Path]:
    """Every module of pagekv by dotted name; a package by its own name (its `__init__.py`)."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / "pagekv").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of pagekv it imports. `from package import name` imports the
    submodule `name` if there is one, else the package (its `__init__.py`)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name if name in modules else None

    graph: dict[str, frozenset[str]] = {}
    for module, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module, f"{path}: a relative import"
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else known(node.module))
        graph[module] = frozenset(t for t in targets if t is not None and t != module)
    return graph


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """One import circle of `graph` as the path around it (first module repeated last), or
    None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        pending = [iter(sorted(graph[start]))]
        while pending:
            target = next(pending[-1], None)
            if target is None:
                done.add(path.pop())
                pending.pop()
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target not in done:
                path.append(target)
                pending.append(iter(sorted(graph[target])))
    return None


def test_no_import_circle() -> None:
    """Over all of pagekv, not only within a package: a circle may pass through several."""
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_layers_depend_downwards() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        for rank, layer in enumerate(LAYERS)
        if _within(module, layer)
        for target in sorted(targets)
        if not any(_within(target, below) for below in LAYERS[: rank + 1])
    ]
    assert not wrong, "imports against the layers (kv <- vfs <- actor <- ...):\n" + "\n".join(wrong)


def test_runtime_never_imports_tools_or_cli() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        if any(_within(module, layer) for layer in LAYERS)
        for target in sorted(targets)
        if any(_within(target, above) for above in (*TOOLS, "pagekv.cli"))
    ]
    assert not wrong, "the runtime imports a tool or the CLI:\n" + "\n".join(wrong)


def test_tools_reach_the_runtime_only_through_its_boundaries() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        if any(_within(module, tool) for tool in TOOLS)
        for target in sorted(targets)
        if any(_within(target, layer) for layer in LAYERS)
        and not any(target == b or (b.count(".") > 1 and _within(target, b)) for b in BOUNDARIES)
    ]
    assert not wrong, "a tool reaches into the runtime:\n" + "\n".join(wrong)


def test_only_the_cli_imports_the_cli() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        if not _within(module, "pagekv.cli") and module != "pagekv.__main__"
        for target in sorted(targets)
        if _within(target, "pagekv.cli")
    ]
    assert not wrong, "imports of the CLI from outside it:\n" + "\n".join(wrong)


def test_no_module_imports_its_own_package() -> None:
    """A package's `__init__.py` imports its submodules to re-export them, so a submodule that
    imports the package (`from pagekv.actor import Registry`) closes a circle through it: it
    imports the sibling directly instead. The top package is left out: its `__init__.py` holds
    the build's metadata and imports no module of pagekv (which the circle check holds it to)."""
    wrong = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        for target in sorted(targets)
        if target != "pagekv" and _within(module, target)
    ]
    assert not wrong, "modules importing their own package:\n" + "\n".join(wrong)


def test_no_two_modules_share_a_name() -> None:
    """A name says what a module is, so two modules with one name are two things a reader must
    tell apart by their folder. Each package's errors are its `errors.py`, the one exception."""
    by_name: dict[str, list[str]] = {}
    for path in (ROOT / "pagekv").rglob("*.py"):
        if path.stem not in ("__init__", "__main__", "errors"):
            by_name.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules sharing a name: {shared}"


def test_architecture_names_only_files_that_exist() -> None:
    """docs/ARCHITECTURE.md maps concepts to files; a file it names that has moved or gone
    would send a newcomer nowhere."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = ("kv", "vfs", "actor", "server", "client", "transfer", "cli", "bench", "fuzz")
    pattern = r"`((?:" + "|".join(packages) + r")/[\w/]+\.py)`"
    named = set(re.findall(pattern, text))
    assert len(named) > 30, named
    missing = sorted(p for p in named if not (ROOT / "pagekv" / p).exists())
    modules = {path.name for path in (ROOT / "pagekv").rglob("*.py")}
    missing += sorted(set(re.findall(r"`(\w+\.py)`", text)) - modules)
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
