"""The runtime's own tables inside each actor's database, and the reserved `_pagekv_` prefix.

Tables are versioned in `_pagekv_meta.schema_version` and upgraded by a ladder of migrations, all
the steps a database needs applied in one transaction; a database written by a newer runtime is
refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import apsw
import cbor2

from pagekv.actor.errors import ActorError

SCHEMA_VERSION = 3
PREFIX = "_pagekv_"

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE _pagekv_meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID",
        "CREATE TABLE _pagekv_state(id INTEGER PRIMARY KEY CHECK (id = 1), data BLOB NOT NULL)",
        "CREATE TABLE _pagekv_schedule(id TEXT PRIMARY KEY, due REAL NOT NULL, action TEXT NOT "
        "NULL, args BLOB NOT NULL, every REAL, created REAL NOT NULL) WITHOUT ROWID",
        "CREATE INDEX _pagekv_schedule_due ON _pagekv_schedule(due)",
        "CREATE TABLE _pagekv_queue(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
        "body BLOB NOT NULL, created REAL NOT NULL)",
        "CREATE INDEX _pagekv_queue_name ON _pagekv_queue(name, id)",
    ),
    2: (
        "CREATE TABLE _pagekv_workflow(key TEXT PRIMARY KEY, value) WITHOUT ROWID",
        "CREATE TABLE _pagekv_workflow_names(idx INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
        "CREATE TABLE _pagekv_workflow_history(location TEXT PRIMARY KEY, seq INTEGER NOT NULL "
        "UNIQUE, name TEXT NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL, status TEXT NOT "
        "NULL, attempts INTEGER NOT NULL, error TEXT, created REAL NOT NULL, last_attempt REAL, "
        "completed REAL, rollback_completed REAL, rollback_error TEXT) WITHOUT ROWID",
    ),
    3: (
        "CREATE TABLE _pagekv_connections(id TEXT PRIMARY KEY, params BLOB NOT NULL, "
        "data BLOB NOT NULL) WITHOUT ROWID",
    ),
}

_WRITES = {
    apsw.SQLITE_CREATE_INDEX,
    apsw.SQLITE_CREATE_TABLE,
    apsw.SQLITE_CREATE_TEMP_INDEX,
    apsw.SQLITE_CREATE_TEMP_TABLE,
    apsw.SQLITE_CREATE_TRIGGER,
    apsw.SQLITE_CREATE_VIEW,
    apsw.SQLITE_DELETE,
    apsw.SQLITE_DROP_INDEX,
    apsw.SQLITE_DROP_TABLE,
    apsw.SQLITE_DROP_TRIGGER,
    apsw.SQLITE_DROP_VIEW,
    apsw.SQLITE_INSERT,
    apsw.SQLITE_UPDATE,
    apsw.SQLITE_ALTER_TABLE,
}


class Reserved:
    """An authorizer that lets only the runtime write `_pagekv_` tables.

    `internal` is set while the runtime runs its own SQL (all SQL of one actor runs serialised,
    so a flag is enough); `violation` names what user SQL tried to touch.
    """

    def __init__(self) -> None:
        self.internal = False
        self.violation: str | None = None

    def __call__(self, op: int, p1: str | None, p2: str | None, db: str | None, trig: str | None):
        if self.internal or op not in _WRITES:
            return apsw.SQLITE_OK
        for name in (p1, p2):
            if name and name.lower().startswith(PREFIX):
                self.violation = name
                return apsw.SQLITE_DENY
        return apsw.SQLITE_OK


def migrate(connection: apsw.Connection) -> int:
    """Bring the internal tables to `SCHEMA_VERSION`; return the version found before."""
    exists = connection.execute(
        "SELECT 1 FROM sqlite_schema WHERE name = '_pagekv_meta'"
    ).fetchall()
    version = 0
    if exists:
        row = cast(
            list[tuple[int]],
            connection.execute(
                "SELECT value FROM _pagekv_meta WHERE key = 'schema_version'"
            ).fetchall(),
        )
        version = row[0][0] if row else 0
    if version > SCHEMA_VERSION:
        raise ActorError(
            f"actor database has internal schema version {version}; this pagekv knows up to "
            f"{SCHEMA_VERSION}. Upgrade pagekv."
        )
    if version == SCHEMA_VERSION:
        return version
    with connection:  # every step in one commit: one KV write, and never a version half done
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for sql in MIGRATIONS[target]:
                connection.execute(sql)
        connection.execute(
            "INSERT OR REPLACE INTO _pagekv_meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
        )
    return version


def _has_tables(connection: apsw.Connection) -> bool:
    rows = connection.execute("SELECT 1 FROM sqlite_schema WHERE name = '_pagekv_meta'")
    return bool(rows.fetchall())


def is_initialized(connection: apsw.Connection) -> bool:
    """Whether the database holds a created actor (read only: nothing is migrated)."""
    if not _has_tables(connection):
        return False
    rows = connection.execute("SELECT value FROM _pagekv_meta WHERE key = 'initialized'")
    return bool(rows.fetchall())


@dataclass(frozen=True)
class Loaded:
    """What a wake reads: whether the database holds a created actor, its state, its next
    schedule due, and whether it has no internal tables yet (`fresh`)."""

    initialized: bool
    state: Any
    due: float | None
    fresh: bool


def load(connection: apsw.Connection, *, create: bool) -> Loaded | None:
    """Every read a wake needs, in one go, once the internal tables of a database that has
    them are brought up to date (`migrate`). None if it holds no actor and `create` is false,
    with nothing written. A fresh database is left as it is: its tables are created in the
    commit that creates the actor, or by a `migrate` of their own just before the first hook."""
    if not create and not is_initialized(connection):
        return None
    if not _has_tables(connection):
        return Loaded(False, None, None, fresh=True)
    migrate(connection)
    rows = dict(
        cast(
            list[tuple[str, Any]],
            connection.execute("SELECT key, value FROM _pagekv_meta").fetchall(),
        )
    )
    state = cast(
        list[tuple[bytes]],
        connection.execute("SELECT data FROM _pagekv_state WHERE id = 1").fetchall(),
    )
    due = cast(
        float | None,
        connection.execute("SELECT min(due) FROM _pagekv_schedule").fetchall()[0][0],
    )
    stored = cbor2.loads(state[0][0]) if state else None
    return Loaded(bool(rows.get("initialized")), stored, due, fresh=False)


def save_state(connection: apsw.Connection, data: bytes) -> None:
    connection.execute("INSERT OR REPLACE INTO _pagekv_state(id, data) VALUES (1, ?)", (data,))


def mark_initialized(
    connection: apsw.Connection, name: str, key: str, data: bytes, *, fresh: bool = False
) -> None:
    """Record creation and the first state in one transaction, with the internal tables too
    if `fresh` (a new actor whose creation runs no hook: it then costs one commit)."""
    with connection:
        if fresh:
            migrate(connection)
        connection.executemany(
            "INSERT OR REPLACE INTO _pagekv_meta VALUES (?, ?)",
            [("initialized", 1), ("name", name), ("key", key), ("created_at", time.time())],
        )
        save_state(connection, data)


def encode_state(state: Any) -> bytes:
    try:
        return cbor2.dumps(state)
    except (cbor2.CBOREncodeError, TypeError, ValueError) as e:
        raise TypeError(f"actor state must be CBOR-serialisable: {e}") from e
