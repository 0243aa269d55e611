"""The embedded durable backend: one SQLite database (through APSW) in a directory.

Why SQLite in WAL mode with `synchronous=FULL` rather than LMDB or a log of our own: every write
must be durable when it returns and atomic across `kill -9` and power loss, and two OS processes
opening the same directory must see one generation counter. SQLite gives all three with one fsync
of the WAL per commit (the same price native SQLite WAL+FULL pays for a one-row commit), its file
locks make `BEGIN IMMEDIATE` an exclusive section across processes, and it is already a core
dependency. LMDB measured no faster here (it syncs data and meta pages, two flushes per commit; see
`benchmarks/RESULTS.md`) and would add a dependency; a hand-written log would repeat what SQLite
already proves.

The fence check, the quota check and the batch run inside one `BEGIN IMMEDIATE` transaction, so no
other writer — thread or process — can interleave between reading the generation and writing.

Usage accounting: each connection keeps `namespaces.used` exact with TEMP triggers on `entries`
(`_USAGE_TRIGGERS`), so a write never reads the old sizes of its keys first (that `IN` lookup cost
more than the rest of a one-page VFS commit's SQL together). Invariant: every row inserted,
resized or deleted on our connection changes its namespace's `used` by exactly its size
difference, in the same statement; only `drop` writes `used` directly. The triggers are TEMP, not
part of the file's schema: a store written by an older pagekv, which accounts in Python, stays
readable and writable by both, so the schema version is unchanged.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import apsw

from pagekv.kv.api import KvNamespace
from pagekv.kv.errors import KvIndeterminate, KvUnavailable
from pagekv.kv.fence import check_fence
from pagekv.kv.limits import KvLimits, WriteBatch, check_quota

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS namespaces (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    generation INTEGER NOT NULL DEFAULT 0,
    used INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS entries (
    ns INTEGER NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ns, key)
) WITHOUT ROWID;
"""
_USAGE_TRIGGERS = (
    """CREATE TEMP TRIGGER IF NOT EXISTS entries_usage_insert AFTER INSERT ON main.entries
    BEGIN
        UPDATE namespaces SET used = used + length(NEW.key) + length(NEW.value) WHERE id = NEW.ns;
    END""",
    """CREATE TEMP TRIGGER IF NOT EXISTS entries_usage_update AFTER UPDATE OF value ON main.entries
    WHEN length(NEW.value) != length(OLD.value)
    BEGIN
        UPDATE namespaces SET used = used + length(NEW.value) - length(OLD.value) WHERE id = NEW.ns;
    END""",
    """CREATE TEMP TRIGGER IF NOT EXISTS entries_usage_delete AFTER DELETE ON main.entries
    BEGIN
        UPDATE namespaces SET used = used - length(OLD.key) - length(OLD.value) WHERE id = OLD.ns;
    END""",
)
_UPSERT = (
    "INSERT INTO entries(ns, key, value) VALUES (?, ?, ?) "
    "ON CONFLICT(ns, key) DO UPDATE SET value = excluded.value"
)
_BUSY_TIMEOUT_MS = 30_000


class FileStore:
    """All namespaces of one directory. Safe to share between threads and between processes."""

    def __init__(self, path: str | os.PathLike[str], *, limits: KvLimits | None = None) -> None:
        self.path = Path(path)
        self.limits = limits or KvLimits()
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = apsw.Connection(str(self.path / "kv.sqlite3"))
            self._db.set_busy_timeout(_BUSY_TIMEOUT_MS)
            # One statement per execute: APSW runs a multi-statement string lazily, so a second
            # pragma after one that returns a row (journal_mode does) would never run.
            mode = self._db.execute("PRAGMA journal_mode=WAL").get
            self._db.execute("PRAGMA synchronous=FULL")
            synchronous = self._db.execute("PRAGMA synchronous").get
            if str(mode).lower() != "wal" or synchronous != 2:
                raise apsw.Error(f"journal_mode={mode}, synchronous={synchronous}; need wal, 2")
            with self._transaction():
                version = self._db.execute("PRAGMA user_version").fetchall()[0][0]
                if version > _SCHEMA_VERSION:
                    raise RuntimeError(
                        f"{self.path} holds KV schema version {version}; this pagekv reads "
                        f"up to {_SCHEMA_VERSION}"
                    )
                self._db.execute(_SCHEMA)
                self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            self._db.execute("PRAGMA temp_store=MEMORY")
            for trigger in _USAGE_TRIGGERS:
                self._db.execute(trigger)
        except apsw.Error as e:
            raise KvUnavailable(f"cannot open the file store at {self.path}: {e}") from e

    def _transaction(self, *, write: bool = True) -> _Transaction:
        """Run a block in one SQLite transaction; map engine failures to KV errors."""
        return _Transaction(self, write)

    def namespace(self, actor_id: str) -> FileNamespace:
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO namespaces(name) VALUES (?)", (actor_id,))
            ns_id = db.execute("SELECT id FROM namespaces WHERE name = ?", (actor_id,)).get
        return FileNamespace(actor_id, self, ns_id)

    def actor_ids(self) -> list[str]:
        with self._transaction(write=False) as db:
            return [r[0] for r in db.execute("SELECT name FROM namespaces ORDER BY name")]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """`with store._transaction() as db:` — a class, not a generator, as it runs on every write.

    Holds the store's thread lock for the whole block, so one connection never interleaves two
    threads' transactions; `BEGIN IMMEDIATE` takes SQLite's write lock, which excludes other
    processes. An exception in the block rolls back; a failed COMMIT that left no transaction
    open may have been applied and is reported as indeterminate.
    """

    __slots__ = ("_begin", "_db", "_store")

    def __init__(self, store: FileStore, write: bool) -> None:
        self._store = store
        self._db = store._db
        self._begin = "BEGIN IMMEDIATE" if write else "BEGIN"

    def __enter__(self) -> apsw.Connection:
        self._store._lock.acquire()
        try:
            self._db.execute(self._begin)
        except apsw.Error as e:
            self._store._lock.release()
            raise KvUnavailable(f"file store {self._store.path} is busy or unreadable: {e}") from e
        except BaseException:
            self._store._lock.release()
            raise
        return self._db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        db = self._db
        try:
            if exc_type is not None:
                db.execute("ROLLBACK")
                return
            try:
                db.execute("COMMIT")
            except apsw.Error as e:
                path = self._store.path
                if not db.in_transaction:
                    raise KvIndeterminate(f"commit to {path} failed: {e}") from e
                db.execute("ROLLBACK")
                raise KvUnavailable(f"commit to {path} failed: {e}") from e
        finally:
            self._store._lock.release()


class FileNamespace(KvNamespace):
    def __init__(self, actor_id: str, store: FileStore, ns_id: int) -> None:
        super().__init__(actor_id, store.limits)
        self._store = store
        self._id = ns_id

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        with self._store._transaction(write=False) as db:
            found = dict(
                db.execute(
                    "SELECT key, value FROM entries WHERE ns = ? AND key IN "
                    f"({','.join('?' * len(keys))})",
                    (self._id, *keys),
                )
            )
        return [found.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        where, args = "ns = ?", [self._id]
        if start is not None:
            where += " AND key >= ?"
            args.append(start)
        if end is not None:
            where += " AND key < ?"
            args.append(end)
        order = "DESC" if reverse else "ASC"
        sql = f"SELECT key, value FROM entries WHERE {where} ORDER BY key {order} LIMIT ?"
        with self._store._transaction(write=False) as db:
            return [(k, v) for k, v in db.execute(sql, (*args, -1 if limit is None else limit))]

    def _head(self, db: apsw.Connection, fence: int | None) -> int:
        """Read the generation and usage in the write's own transaction and check the fence."""
        row = db.execute(
            "SELECT generation, used FROM namespaces WHERE id = ?", (self._id,)
        ).fetchall()
        if not row:
            raise KvUnavailable(f"namespace {self.actor_id!r} vanished from {self._store.path}")
        generation, used = row[0]
        check_fence(fence, generation)
        return used

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        with self._store._transaction() as db:
            used = self._head(db, fence)
            ns = self._id
            if batch.deletes:
                db.executemany(
                    "DELETE FROM entries WHERE ns = ? AND key = ?", [(ns, k) for k in batch.deletes]
                )
            if len(batch.puts) == 1:
                ((key, value),) = batch.puts.items()
                db.execute(_UPSERT, (ns, key, value))
            elif batch.puts:
                db.executemany(_UPSERT, [(ns, k, v) for k, v in batch.puts.items()])
            # The triggers have applied the exact delta; a rejected write is rolled back whole.
            after = db.execute("SELECT used FROM namespaces WHERE id = ?", (ns,)).get
            check_quota(self._store.limits, used, after - used)

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        with self._store._transaction() as db:
            self._head(db, fence)
            if start < end:
                db.execute(
                    "DELETE FROM entries WHERE ns = ? AND key >= ? AND key < ?",
                    (self._id, start, end),
                )

    def takeover(self) -> int:
        with self._store._transaction() as db:
            return db.execute(
                "UPDATE namespaces SET generation = generation + 1 WHERE id = ? "
                "RETURNING generation",
                (self._id,),
            ).get

    def generation(self) -> int:
        with self._store._transaction(write=False) as db:
            return db.execute("SELECT generation FROM namespaces WHERE id = ?", (self._id,)).get

    def used_bytes(self) -> int:
        with self._store._transaction(write=False) as db:
            return db.execute("SELECT used FROM namespaces WHERE id = ?", (self._id,)).get

    def drop(self, *, fence: int | None = None) -> None:
        with self._store._transaction() as db:
            self._head(db, fence)
            db.execute("DELETE FROM entries WHERE ns = ?", (self._id,))
            db.execute("UPDATE namespaces SET used = 0 WHERE id = ?", (self._id,))
