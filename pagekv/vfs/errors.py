"""Errors of the VFS layer."""

from __future__ import annotations

from pagekv.kv import FenceMismatch


class StorageCorrupt(Exception):
    """Stored pages or records fail their checks: a CRC mismatch, a missing page below EOF, a
    malformed record. Never answered with zeros."""


class SnapshotExpired(Exception):
    """A read-only snapshot can no longer be served: the writer compacted past it. Reopen."""


class DatabaseDead(Exception):
    """The database instance is dead after a fenced or indeterminate write; close and reopen.

    `cause` is the error that killed it (the same for every later call on the instance, whose
    own chain does not hold it), and `fenced` says whether that was a takeover elsewhere (a
    `FenceMismatch`): callers decide on these fields, never on the message."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(
            f"database is dead after {type(cause).__name__}: {cause}; close and reopen it"
        )
        self.cause = cause
        self.fenced = isinstance(cause, FenceMismatch)


def caused_by_interrupt(error: BaseException) -> bool:
    """Whether `error` is a Ctrl-C or was caused by one. One that lands in a SQLite callback of
    the VFS kills the database, so the code around it sees SQLite's `IOError` (or the next
    call's `DatabaseDead`), whose chain, or the `DatabaseDead`'s `cause`, is the
    `KeyboardInterrupt`: a tool that stops on Ctrl-C must not report that as a failure."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and not any(current is s for s in seen):
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.append(current)
        if isinstance(current, DatabaseDead):
            current = current.cause
        else:
            current = current.__cause__ or current.__context__
    return False
