"""The runtime's own tables inside each actor's database, and the reserved `_pagekv_` prefix.

Tables are versioned in `_pagekv_meta.schema_version` and upgraded by a ladder of migrations, all
the steps a database needs applied in one transaction; a database written by a newer runtime is
refused. The statements that read and write the tables' rows are in `sql`.
"""

from __future__ import annotations

from typing import cast

import apsw

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


def has_table(connection: apsw.Connection, name: str) -> bool:
    rows = connection.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", (name,)
    ).fetchall()
    return bool(rows)


def stored_version(connection: apsw.Connection) -> object:
    """The schema version the database records (None: none; an imported file may hold
    anything there)."""
    if not has_table(connection, "_pagekv_meta"):
        return None
    rows = cast(
        list[tuple[object]],
        connection.execute(
            "SELECT value FROM _pagekv_meta WHERE key = 'schema_version'"
        ).fetchall(),
    )
    return rows[0][0] if rows else None


def migrate(connection: apsw.Connection) -> int:
    """Bring the internal tables to `SCHEMA_VERSION`; return the version found before."""
    version = cast(int, stored_version(connection) or 0)
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
