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
