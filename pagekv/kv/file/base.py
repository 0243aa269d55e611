"""The base: `kv.sqlite3`, every namespace's rows as of the last folded epoch, and the fold that
checkpoints an epoch's pending state into it.

`namespaces(id, name, generation, used)`, `entries(ns, key, value)`, `log_state(epoch)` (the last
epoch folded in) and `store(id)` (the store's identity, also in the log header); `docs/FORMAT.md`
describes them. A rollback journal with `synchronous=FULL`, not WAL: only folds write the base,
always under the log's exclusive lock, so WAL's concurrent readers buy nothing, and a fold writes
its pages once instead of to the WAL and again at the checkpoint (measured: half the fold time).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import apsw

from pagekv.kv.errors import FormatTooNew, KvIndeterminate, KvUnavailable
from pagekv.kv.file.lock_holders import lock_holders, processes_holding
from pagekv.kv.file.pending import Pending

SCHEMA_VERSION: Final = 4
"""3: the log holds namespace creations (older versions would refuse the log as damaged).
4: log format 3 (record nonces, the store's identity and `kv.shm`'s in the header), `kv.shm`
format 1, and the `store` table (older versions would take the new log header for no log)."""
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS namespaces (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        generation INTEGER NOT NULL DEFAULT 0,
        used INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS entries (
        ns INTEGER NOT NULL,
        key BLOB NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (ns, key)
    ) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS log_state (epoch INTEGER NOT NULL)",
    "INSERT INTO log_state(epoch) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM log_state)",
    "CREATE TABLE IF NOT EXISTS store (id BLOB NOT NULL)",
    "INSERT INTO store(id) SELECT randomblob(16) WHERE NOT EXISTS (SELECT 1 FROM store)",
)
_UPSERT_ROWS: Final = 64
"""Rows per statement when a fold writes the base: one statement of many rows cost 45 % less
per row than one statement per row (65,536 rows of 100 B: 53-72 ms against 90-129 ms)."""


def _upsert(rows: int) -> str:
    values = ", ".join(["(?, ?, ?)"] * rows)
    return (
        f"INSERT INTO entries(ns, key, value) VALUES {values} "
        "ON CONFLICT(ns, key) DO UPDATE SET value = excluded.value"
    )


_UPSERT_ONE: Final = _upsert(1)
_UPSERT_MANY: Final = _upsert(_UPSERT_ROWS)
SIZE: Final = "length(key) + length(value)"
"""The column expression of an entry's charged size, for `Base.values` and `Base.range`."""
BASE_PAGE_SIZE: Final = 32 * 1024
_KEYS_PER_QUERY: Final = 500


class Base:
    """The store's SQLite file: opened and upgraded here, read by every operation, written only by
    a fold (`fold`) and by the schema upgrade at open.

    Invariants: a fold applies one whole epoch and records it in `log_state` in the same
    transaction, so the base holds an epoch entirely or not at all, and applying an epoch the base
    already holds changes nothing. Every wait for the base's lock ends within `lock_timeout`.

    `db` (package-internal, for white-box tests) is used only under the store's section, or at
    open and close (which hold the section's thread lock or run before anything shares the
    store); so are all the methods.
    """

    def __init__(self, directory: Path, lock_timeout: float) -> None:
        self.path = directory
        self.lock_timeout = lock_timeout
        try:
            self.db = apsw.Connection(str(directory / "kv.sqlite3"))
        except apsw.Error as e:
            raise KvUnavailable(f"cannot open the file store at {directory}: {e}") from e

    def open(self) -> bytes:
        """Check the base and upgrade its schema; return the store's identity.

        Before the log is opened, so that an upgrade can tell that no other process has the
        log open (one that has is an older pagekv, or a copy or backup tool in the middle of
        reading it): this process's own open of the log would look like one.
        """
        db = self.db
        try:
            db.set_busy_timeout(min(int(self.lock_timeout * 1000), 2**31 - 1))
            # One statement per execute: APSW runs a multi-statement string lazily, so a second
            # pragma after one that returns a row (journal_mode does) would never run. A store
            # another process holds open in WAL mode (pagekv before the log) stays in WAL until
            # every process has closed it; both modes are durable with synchronous=FULL.
            if db.execute("PRAGMA page_count").get == 0:
                # A new base: pages that hold a 4 KiB value in the leaf. The VFS stores 4.1 KB
                # values; with 32 KiB pages a fold of them took 9 µs per entry instead of 21,
                # and a random 128-key read of them 1.65 ms instead of 2.45 (100 B values: fold
                # 2.4 vs 3.0 µs, read 0.93 vs 0.79 ms). Existing bases keep their page size.
                db.execute(f"PRAGMA page_size={BASE_PAGE_SIZE}")
            mode = str(db.execute("PRAGMA journal_mode=TRUNCATE").get).lower()
            db.execute("PRAGMA synchronous=FULL")
            synchronous = db.execute("PRAGMA synchronous").get
            if mode not in ("truncate", "wal") or synchronous != 2:
                raise apsw.Error(
                    f"journal_mode={mode}, synchronous={synchronous}; need truncate, 2"
                )
            # Written only when the schema is older, so a store on a full disk still opens.
            if db.execute("PRAGMA user_version").get != SCHEMA_VERSION:
                with self.transaction() as tx:
                    self._upgrade(tx, tx.execute("PRAGMA user_version").get)
            store_id: bytes = db.execute("SELECT id FROM store").get
            return store_id
        except apsw.Error as e:
            raise KvUnavailable(
                f"cannot open the file store at {self.path}: {_describe(e, self.path)}"
            ) from e

    def _upgrade(self, db: apsw.Connection, version: int) -> None:
        """Bring the base from schema `version` to this build's, inside a base transaction.

        The version fences older builds: one that reads a newer version refuses the store at
        open. One that has the store open already does not look again, and would misread the
        new log, so the upgrade of a store that had a log (schema 2 on) waits until no other
        process has it open. The log itself is upgraded at the first exclusive section (this
        open's): an epoch of an older log format is folded, and the next is of this build's.
        """
        if version == SCHEMA_VERSION:
            return  # another process upgraded it first
        if version > SCHEMA_VERSION:
            raise FormatTooNew(self.path / "kv.sqlite3", "schema", str(version), SCHEMA_VERSION)
        if version >= 2:
            holders = processes_holding([self.path / "kv.log", self.path / "kv.shm"])
            if holders:
                raise KvUnavailable(
                    f"cannot upgrade the file store at {self.path} from schema version {version} "
                    f"to {SCHEMA_VERSION} while other processes have it open: "
                    f"{', '.join(holders)}; stop them first (an older pagekv would misread what "
                    "this one writes); nothing was changed"
                )
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def transaction(self) -> Transaction:
        return Transaction(self.db, self.path)

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.db.execute(sql, args).fetchall()
        except apsw.Error as e:
            raise KvUnavailable(f"file store {self.path} is busy or unreadable: {e}") from e

    def range(
        self,
        ns: int,
        column: str,
        start: bytes | None,
        end: bytes | None,
        reverse: bool,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, Any]]:
        """`(key, column)` of the rows in `[start, end)` in key order, read lazily."""
        where = "ns = ?"
        args: list[int | bytes] = [ns]
        if start is not None:
            where += " AND key >= ?"
            args.append(start)
        if end is not None:
            where += " AND key < ?"
            args.append(end)
        order = "DESC" if reverse else "ASC"
        sql = f"SELECT key, {column} FROM entries WHERE {where} ORDER BY key {order} LIMIT ?"
        try:
            yield from self.db.execute(sql, (*args, -1 if limit is None else limit))
        except apsw.Error as e:
            raise KvUnavailable(f"file store {self.path} is busy or unreadable: {e}") from e

    def folded_epoch(self) -> int:
        epoch: int = self.query("SELECT epoch FROM log_state")[0][0]
        return epoch

    def head(self, ns: int) -> tuple[int, int]:
        """Namespace `ns`'s generation and usage."""
        rows = self.query("SELECT generation, used FROM namespaces WHERE id = ?", (ns,))
        if not rows:
            raise KvUnavailable(f"namespace {ns} vanished from {self.path}")
        generation, used = rows[0]
        return generation, used

    def values(self, ns: int, keys: list[bytes], column: str) -> dict[bytes, Any]:
        """`column` of the rows of `keys` that exist, by key."""
        found: dict[bytes, Any] = {}
        for i in range(0, len(keys), _KEYS_PER_QUERY):
            part = keys[i : i + _KEYS_PER_QUERY]
            marks = ",".join("?" * len(part))
            sql = f"SELECT key, {column} FROM entries WHERE ns = ? AND key IN ({marks})"
            found.update(self.query(sql, (ns, *part)))
        return found

    def resolve(self, ns: int, pending: Pending) -> None:
        """Look up the base sizes `pending` still owes, making `pending.used` exact."""
        if pending.unresolved:
            sizes = self.values(ns, pending.unresolved, SIZE)
            pending.used -= sum(sizes.values())
            pending.unresolved.clear()

    def fold(self, epoch: int, pending: dict[int, Pending]) -> bool:
        """Apply `epoch`'s pending state and record the epoch folded, in one transaction; False
        if the base holds it already (folded by a process that died before starting the next)."""
        with self.transaction() as db:
            if db.execute("SELECT epoch FROM log_state").get >= epoch:
                return False
            for ns, changes in pending.items():
                self.resolve(ns, changes)  # old sizes from the base before the fold
            for ns, changes in pending.items():
                for start, end in changes.hidden:
                    if end is None:
                        db.execute("DELETE FROM entries WHERE ns = ? AND key >= ?", (ns, start))
                    else:
                        db.execute(
                            "DELETE FROM entries WHERE ns = ? AND key >= ? AND key < ?",
                            (ns, start, end),
                        )
                items = changes.entries.items()
                db.executemany(
                    "DELETE FROM entries WHERE ns = ? AND key = ?",
                    [(ns, k) for k, v in items if v is None],
                )
                _upsert_all(db, [(ns, k, v) for k, v in items if v is not None])
                if changes.created is None:
                    db.execute(
                        "UPDATE namespaces SET generation = ?, used = ? WHERE id = ?",
                        (changes.generation, changes.used, ns),
                    )
                else:
                    db.execute(
                        "INSERT INTO namespaces(id, name, generation, used) VALUES (?,?,?,?)",
                        (ns, changes.created, changes.generation, changes.used),
                    )
            db.execute("UPDATE log_state SET epoch = ?", (epoch,))
        return True

    def close(self) -> None:
        self.db.close()


def _describe(error: apsw.Error, directory: Path) -> str:
    """SQLite's error, and who holds the base's lock when it waited for it in vain."""
    if isinstance(error, apsw.BusyError):
        holders = lock_holders(directory / "kv.sqlite3")
        return f"{error}; waited for the lock on kv.sqlite3, held by {holders}"
    return str(error)


def _upsert_all(db: apsw.Connection, rows: list[tuple[int, bytes, bytes]]) -> None:
    """Write `rows` (`ns, key, value`; keys distinct) into the base, `_UPSERT_ROWS` a statement."""
    whole = len(rows) - len(rows) % _UPSERT_ROWS
    db.executemany(
        _UPSERT_MANY,
        [
            tuple(itertools.chain.from_iterable(rows[i : i + _UPSERT_ROWS]))
            for i in range(0, whole, _UPSERT_ROWS)
        ],
    )
    db.executemany(_UPSERT_ONE, rows[whole:])


class Transaction:
    """`with base.transaction() as db:` — one write transaction on the base.

    `BEGIN IMMEDIATE` takes SQLite's write lock, which excludes other processes. An exception in
    the block rolls back; a failed COMMIT that left no transaction open may have been applied and
    is reported as indeterminate. Holds no state but the connection it runs on.
    """

    __slots__ = ("_db", "_path")

    def __init__(self, db: apsw.Connection, path: Path) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> apsw.Connection:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except apsw.Error as e:
            raise KvUnavailable(
                f"file store {self._path} is busy or unreadable: {_describe(e, self._path)}"
            ) from e
        return self._db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        db = self._db
        if exc_type is not None:
            if db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL)
                db.execute("ROLLBACK")
            if isinstance(exc, apsw.Error):
                raise KvUnavailable(f"file store {self._path} failed: {exc}") from exc
            return
        try:
            db.execute("COMMIT")
        except apsw.Error as e:
            if not db.in_transaction:
                raise KvIndeterminate(f"commit to {self._path} failed: {e}") from e
            db.execute("ROLLBACK")
            raise KvUnavailable(f"commit to {self._path} failed: {e}") from e
