"""`app.py[:registry]`: load the registry a `pagekv serve` command names."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

from pagekv.actor import Registry

_OWN = str(Path(__file__).resolve().parents[2])
"""The pagekv package's directory: frames in it are not the user's."""


class AppNotFound(ValueError):
    """The file or the attribute named by an app spec is missing, or is not a `Registry`."""


class AppFailedToLoad(Exception):
    """The app's file raised while it was imported: a mistake in the user's code (`__cause__`
    is what it raised), shown to them by `user_traceback` without pagekv's own frames."""

    def __init__(self, path_text: str, error: BaseException) -> None:
        super().__init__(f"{path_text} failed to load: {type(error).__name__}: {error}")
        self.path_text = path_text
        self.error = error

    def report(self, who: str) -> str:
        """What to show the user: the traceback of `error` (and of the exceptions it chains)
        through their code, then one line saying `who` could not load the app. Without the
        loader's and importlib's frames before their code, nor pagekv's after it (where a
        decorator refused a declaration, say): those tell them nothing about their mistake and
        bury the line that does."""
        shown = traceback.TracebackException.from_exception(self.error)
        seen: set[int] = set()
        pending = [shown]
        while pending:
            exception = pending.pop()
            if id(exception) in seen:
                continue
            seen.add(id(exception))
            exception.stack = traceback.StackSummary.from_list(_users_frames(exception.stack))
            pending.extend(e for e in (exception.__cause__, exception.__context__) if e)
            pending.extend(getattr(exception, "exceptions", None) or [])
        failed = f"{self.path_text} failed to load with the {type(self.error).__name__} above"
        return f"{''.join(shown.format())}{who}: {failed}"


def _users_frames(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """`stack` from the first frame of the user's code to the last one that is not pagekv's."""
    frames = list(stack)
    while frames and _not_users(frames[0].filename, leading=True):
        del frames[0]
    while frames and _not_users(frames[-1].filename, leading=False):
        del frames[-1]
    return frames


def _not_users(filename: str, *, leading: bool) -> bool:
    if leading and filename.startswith("<frozen importlib"):
        return True
    return filename.startswith(_OWN + "/")


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
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise AppFailedToLoad(path_text, e) from e
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        found = "nothing" if registry is None else f"a {type(registry).__name__}"
        raise AppNotFound(
            f"{path_text}:{attribute} must be a pagekv.actor.Registry, but is {found}"
        )
    return registry
