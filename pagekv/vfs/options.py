"""The tuning knobs of one open database (`Options`) and what its page store counts (`Counters`).

Records shared by the page store's pieces: the coordinator (`page_store.py`) makes both, the reader,
the committer and the compaction read the options, and each bumps its own counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Final


@dataclass(frozen=True, slots=True)
class Options:
    """Tuning knobs of one open database (all counts are 4 KiB pages)."""

    cache_pages: int = 4096
    stage_pages: int = 2048
    """Dirty pages held in memory before a transaction is staged to KV early."""
    compact_deltas: int = 256
    """Auto-compact once this many commits are live as deltas ..."""
    compact_pages: int = 4096
    """... or their index entries exceed this many pages."""
    auto_compact: bool = True
    """False leaves compaction to `Database.compact()`, except for a head with `COMPACT_SHRINKS`
    shrinks (format.py)."""
    in_place_commits: bool = True
    """A small commit on a fully compacted database overwrites its base pages (in its one KV
    write) instead of adding a delta for compaction to fold later. False writes every commit as
    a delta: a read-only snapshot then lasts until the next compaction, not only until a page it
    has not read yet is rewritten."""
    preload_hints: bool = True
    """Learn which pages SQLite reads first after an open, save them at close, and fetch them
    with page 1 at the next open (preload.py); False preloads the first read-ahead window."""

    def __post_init__(self) -> None:
        check_options({name: getattr(self, name) for name in _OPTION_TYPES})


_OPTION_TYPES: Final[dict[str, type]] = {f.name: type(f.default) for f in fields(Options)}
"""Each option's type, that of its default (`int` counts and the `bool` switch)."""


def check_options(options: Mapping[str, object]) -> None:
    """Reject an unknown option, a value of the wrong type or a count below 1, naming the option.

    `open_database` calls it before making `Options`: compiled, a typed field rejects a wrong
    type on its own, with an error that does not say which option it was."""
    for name, value in options.items():
        kind = _OPTION_TYPES.get(name)
        if kind is None:
            raise TypeError(f"unknown option {name!r}; the options are {', '.join(_OPTION_TYPES)}")
        if type(value) is not kind:
            raise TypeError(f"option {name} must be {kind.__name__}, not {type(value).__name__}")
        if kind is int and isinstance(value, int) and value < 1:
            raise ValueError(f"option {name} must be at least 1, got {value}")


@dataclass(slots=True)
class Counters:
    """What the page store has done since it opened (part of `Database.metrics()`). Attributes,
    not a dict: four of them change on every commit. Guarded by the page store's lock, as every
    piece that bumps them is called with it held."""

    commits: int = 0
    commits_fast: int = 0
    commits_in_place: int = 0
    commits_staged: int = 0
    pages_committed: int = 0
    max_commit_pages: int = 0
    stage_batches: int = 0
    compactions: int = 0
    pages_compacted: int = 0
    compaction_bytes_written: int = 0
    compaction_round_trips: int = 0
    orphan_cleanups: int = 0
    pages_preloaded: int = 0
    hints_saved: int = 0
    hint_save_errors: int = 0
