"""The native SQLite oracle: the same statements on an in-memory database, and content digests."""

from __future__ import annotations

import hashlib

import apsw

from pagekv.fuzz.steps import Txn


def digest(connection: apsw.Connection) -> str:
    """A hash of the schema and every row of every table, in rowid order."""
    h = hashlib.sha256()
    schema = connection.execute(
        "SELECT type, name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    h.update(repr(schema).encode())
    for kind, name, _ in schema:
        if kind == "table":
            for row in connection.execute(f'SELECT * FROM "{name}" ORDER BY rowid'):
                h.update(repr(row).encode())
    return h.hexdigest()


def run_txn(connection: apsw.Connection, txn: Txn) -> None:
    """Run `txn`'s statements; a failure rolls back an explicit transaction and re-raises."""
    if txn.explicit:
        connection.execute("BEGIN")
    try:
        for statement in txn.statements:
            connection.execute(statement.sql, statement.bindings()).fetchall()
        if txn.explicit:
            connection.execute("COMMIT")
    except BaseException:
        if txn.explicit and connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


class Oracle:
    """Acknowledged state, plus at most one transaction whose outcome is still unknown."""

    def __init__(self) -> None:
        self.connection = apsw.Connection(":memory:")
        self.pending: Txn | None = None

    def apply(self, txn: Txn) -> None:
        run_txn(self.connection, txn)

    def states(self) -> tuple[str, str | None]:
        """Digests of the acknowledged state and of it plus the pending transaction."""
        old = digest(self.connection)
        if self.pending is None:
            return old, None
        self.connection.execute("SAVEPOINT pending")
        try:
            for statement in self.pending.statements:
                if statement.sql != "VACUUM":
                    self.connection.execute(statement.sql, statement.bindings()).fetchall()
            new = digest(self.connection)
        finally:
            self.connection.execute("ROLLBACK TO pending")
            self.connection.execute("RELEASE pending")
        return old, new

    def resolve(self, committed: bool) -> None:
        """The pending transaction turned out committed (apply it) or not (drop it)."""
        if self.pending is not None and committed:
            self.apply(self.pending)
        self.pending = None
