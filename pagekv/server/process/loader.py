"""`app.py[:registry]`: load the registry a `pagekv serve` command names."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from pagekv.actor import Registry


class AppNotFound(ValueError):
    """The file or the attribute named by an app spec is missing, or is not a `Registry`."""


def load_registry(spec: str) -> Registry:
    """Import the file of `spec` (`path/app.py` or `path/app.py:attribute`, default attribute
    `registry`) as a module, with its directory on `sys.path` so it can import its neighbours."""
    path_text, _, attribute = spec.partition(":")
    attribute = attribute or "registry"
    path = Path(path_text).resolve()
    if not path.is_file():
        raise AppNotFound(f"no such file: {path_text}")
    module_name = f"pagekv_app_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise AppNotFound(f"{path_text} is not a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        found = "nothing" if registry is None else f"a {type(registry).__name__}"
        raise AppNotFound(
            f"{path_text}:{attribute} must be a pagekv.actor.Registry, but is {found}"
        )
    return registry
