"""The import graph of `pagekv`, read from the sources: no circles, and layers that depend one way
(`kv` <- `vfs` <- `actor` <- `server`, the CLI and the tools).

Why: modules in a circle can only be read, tested and changed together, and a circle closed only
by an import under `if TYPE_CHECKING:` is one all the same (the types say each side knows the
other). Every import counts: at module level, under `TYPE_CHECKING`, inside functions. What the
source cannot show is not seen: imports by name through `importlib`, which only the CLI and
`pagekv.server`'s lazy exports make, from the top of the graph.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = ("pagekv.kv", "pagekv.vfs", "pagekv.actor")
"""Bottom up: a module of one imports nothing of pagekv but its own layer and those below."""


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
    assert not wrong, "imports against the layers (kv <- vfs <- actor):\n" + "\n".join(wrong)


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
