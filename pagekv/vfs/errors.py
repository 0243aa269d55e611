"""Errors of the VFS layer."""

from __future__ import annotations


class StorageCorrupt(Exception):
    """Stored pages or records fail their checks: a CRC mismatch, a missing page below EOF, a
    malformed record. Never answered with zeros."""


class SnapshotExpired(Exception):
    """A read-only snapshot can no longer be served: the writer compacted past it. Reopen."""


class DatabaseDead(Exception):
    """The database instance is dead after a fenced or indeterminate write; close and reopen."""
