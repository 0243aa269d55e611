"""Logical checksums of a namespace: what `pagekv copy` verifies, and what a round trip through
an exported file keeps.

Two namespaces have the same checksum when they hold the same logical content, however their
pages are laid out (compacted or not, written in place or as deltas, stamped with any writer's
generation): the database's schema (every entry of `sqlite_schema` but its root page) and rows
(every table, the runtime's `_pagekv_` ones and `sqlite_sequence` included, each row with its
rowid, in key order), and every KV entry outside the database's own keys (the actor's `ctx.kv`
entries, or whatever a namespace that holds no database holds). The database is read from one
read-only snapshot (`read_namespace`), so the sum is of one committed state of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, Final, cast

import apsw
import cbor2

from pagekv.actor.inspect_reads import read_namespace
from pagekv.kv import ActorKv, prefix_end
from pagekv.transfer.chunked_io import scan
from pagekv.vfs import Database
from pagekv.vfs.format import PREFIX as DATABASE_PREFIX

_ROWID_NAMES: Final = ("rowid", "oid", "_rowid_")


def namespace_checksum(kv: ActorKv) -> str:
    """The hex SHA-256 of `kv`'s logical content (see the module's docstring)."""
    return combine(read_namespace(kv, _database_digest), other_entries(kv))


def combine(database: bytes, entries: Iterable[tuple[bytes, bytes]]) -> str:
    """The checksum of a namespace whose database has the digest `database` (`database_digest`)
    and whose other entries are `entries`, in key order (`combine(b"", entries)`: a digest of
    entries alone)."""
    digest = EntriesDigest(database)
    for key, value in entries:
        digest.add(key, value)
    return digest.hexdigest()


class EntriesDigest:
    """`combine`'s digest fed one entry at a time, for a caller that streams them elsewhere."""

    def __init__(self, database: bytes = b"") -> None:
        self._sha = hashlib.sha256(database)

    def add(self, key: bytes, value: bytes) -> None:
        self._sha.update(cbor2.dumps([key, value]))

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def other_entries(kv: ActorKv) -> Iterator[tuple[bytes, bytes]]:
    """Every entry of `kv` outside the database's keys, in key order."""
    yield from scan(kv, None, DATABASE_PREFIX)
    yield from scan(kv, prefix_end(DATABASE_PREFIX), None)


def _database_digest(database: Database) -> bytes:
    return database_digest(database.connection)


def database_digest(connection: apsw.Connection) -> bytes:
    """SHA-256 of a database's schema and rows (the database part of `namespace_checksum`)."""
    digest = hashlib.sha256()
    schema = connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name"
    )
    for row in schema:
        digest.update(cbor2.dumps(list(row)))
    tables = cast(
        list[tuple[str, int]],
        connection.execute(
            "SELECT name, wr FROM pragma_table_list WHERE schema = 'main' "
            "AND type IN ('table', 'shadow') AND name NOT IN ('sqlite_schema', 'sqlite_master') "
            "ORDER BY name"
        ).fetchall(),
    )
    for name, without_rowid in tables:
        digest.update(cbor2.dumps(["table", name]))
        for row in connection.execute(_scan(connection, name, bool(without_rowid))):
            digest.update(cbor2.dumps(list(row)))
    return digest.digest()


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _scan(connection: apsw.Connection, table: str, without_rowid: bool) -> str:
    """Every row of `table` in its b-tree's key order: rowid first for a rowid table (under a
    name no column of it has), the primary key's order for a WITHOUT ROWID one."""
    info = cast(
        list[tuple[int, str, str, int, Any, int]],
        connection.execute(f"PRAGMA table_info({_quote(table)})").fetchall(),
    )
    if without_rowid:
        keys = [row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        order = ", ".join(_quote(k) for k in keys)
        return f"SELECT * FROM {_quote(table)} ORDER BY {order}"
    columns = {row[1].lower() for row in info}
    rowid = next((n for n in _ROWID_NAMES if n not in columns), None)
    if rowid is None:  # every name of the rowid is a column's: it cannot be read, nor differ
        return f"SELECT * FROM {_quote(table)}"
    return f"SELECT {rowid}, * FROM {_quote(table)} ORDER BY {rowid}"
