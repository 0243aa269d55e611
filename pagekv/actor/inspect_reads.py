"""Read-only views of actors, for the HTTP inspector and `pagekv inspect`.

Which actors exist comes from the registry's index; what an actor holds comes from a read-only
snapshot of its database (`open_database(..., read_only=True)`): a consistent view of what is
committed in the KV, which never takes the actor over and never writes, so it is safe beside a
live instance in this or any other process. It shows durable data, not the uncommitted changes
of an action in flight: exactly what a crash right now would leave.

Nothing here creates a namespace that does not exist yet: `open_index` and `snapshot` check
first, so inspecting a store (or a mistyped actor) leaves it untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, cast, runtime_checkable

import apsw
import cbor2

from pagekv.actor.directory import records
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.directory.records import ActorRecord as ActorRecord
from pagekv.actor.directory.records import list_actors as list_actors
from pagekv.actor.errors import ActorError, ActorNotFound
from pagekv.actor.schedule import MAX_SCHEDULES
from pagekv.actor.tables.schema import PREFIX, has_table
from pagekv.actor.tables.sql import queue_messages, schedules
from pagekv.actor.tables.sql import read_state as read_state
from pagekv.kv import ActorKv, KvStore
from pagekv.vfs import Database, SnapshotExpired, open_database

T = TypeVar("T")
_READ_OPS = {apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION, apsw.SQLITE_RECURSIVE}
_READ_PRAGMAS = {
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "page_count",
    "freelist_count",
}
"""Pragmas that only report; a pragma that sets anything is refused with every other one."""
_PROGRESS_STEPS = 1000


@runtime_checkable
class ListableStore(Protocol):
    """A store that can say which namespaces exist (every backend of `pagekv.kv` can)."""

    def actor_ids(self) -> list[str]: ...


class InspectError(ActorError, ValueError):
    """A read-only request that cannot be answered as asked (the message says why)."""


class QueryRefused(InspectError):
    """Read-only SQL that tried to write, attach, set a pragma, ran more than one statement or
    ran out of time."""


class QueryTooLarge(QueryRefused):
    """A query whose sorts and temporary tables need more temp file bytes than a read may write
    (`limit` names the cap)."""

    limit = "inspect_temp_bytes"

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        super().__init__(
            f"read-only query refused: its sorts and temporary tables would write more than "
            f"{allowed} bytes of temp files ({self.limit}); ask for less (LIMIT, fewer columns, "
            "no ORDER BY on large values)"
        )


class TableNotFound(InspectError, LookupError):
    """No table of that name in the actor's database."""


class AnswerTooLarge(InspectError):
    """The rows asked for hold more bytes than the answer may (`limit` names the cap)."""

    limit = "inspect_max_bytes"

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        super().__init__(
            f"the answer would hold more than {allowed} bytes of values ({self.limit}); "
            "ask for fewer rows or columns"
        )


@dataclass(frozen=True)
class TableInfo:
    name: str
    internal: bool
    """A runtime table (`_pagekv_` prefix), not one of the actor's own."""
    columns: list[str]
    rows: int


@dataclass(frozen=True)
class Rows:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False
    """More rows matched than were returned."""


def open_index(store: KvStore) -> ActorKv | None:
    """The registry's index namespace, or None if no registry ever ran on this store."""
    if isinstance(store, ListableStore) and REGISTRY_NAMESPACE not in store.actor_ids():
        return None
    return store.namespace(REGISTRY_NAMESPACE)


def find_actor(index: ActorKv, name: str, key: str) -> ActorRecord:
    record = records.find_actor(index, name, key)
    if record is None:
        raise ActorNotFound(f"no actor {name!r} with key {key!r}")
    return record


@contextmanager
def snapshot(
    store: KvStore, record: ActorRecord, max_bytes: int | None = None
) -> Iterator[Database]:
    """A read-only, consistent snapshot of an existing actor's database. With `max_bytes`,
    SQLite makes no string or blob longer than that (`SQLITE_LIMIT_LENGTH`): a query cannot
    build a value bigger than the answer may hold (`zeroblob(300000000)`), nor read one."""
    with _snapshot(store.namespace(record.actor_id), max_bytes, None) as database:
        yield database


@contextmanager
def _snapshot(kv: ActorKv, max_bytes: int | None, temp_bytes: int | None) -> Iterator[Database]:
    database = open_database(kv, read_only=True, temp_bytes=temp_bytes)
    try:
        if max_bytes is not None:
            database.connection.limit(apsw.SQLITE_LIMIT_LENGTH, max_bytes)
        yield database
    finally:
        database.close()


SNAPSHOT_ATTEMPTS: Final = 5
"""Snapshots `read_snapshot` opens before it gives up on a writer that keeps rewriting pages.
A database of up to 4 MiB is read whole at the open and never needs a second one; a bigger one
can be overtaken by in-place commits while a query reads it (`benchmarks/HISTORY.md`, "In-place
commits")."""


def read_snapshot(
    store: KvStore,
    record: ActorRecord,
    fn: Callable[[Database], T],
    *,
    max_bytes: int | None = None,
    temp_bytes: int | None = None,
) -> T:
    """`fn(database)` on a fresh snapshot, reopened while the writer rewrites (in place) or
    compacts away a page the snapshot had not read yet: `SNAPSHOT_ATTEMPTS` opens in all.
    `max_bytes` caps any one value (see `snapshot`): one over it is `AnswerTooLarge`.
    `temp_bytes`: SQLite sorts on disk, in temp files of at most that many bytes together
    (`open_database`), so a sort of large values is bounded in memory; past it the read is
    `QueryTooLarge`. None: sorts stay in memory.

    `ActorNotFound` if the namespace holds no database although the index records the actor:
    it was destroyed, and its destroyer stopped (a crash) before it deleted the record, which
    the actor's next wake does; a created actor always wrote its database."""

    def read(database: Database) -> T:
        if not database.connection.execute("PRAGMA page_count").fetchall()[0][0]:
            raise ActorNotFound(
                f"no actor {record.name!r} with key {record.key!r}: it was destroyed (its "
                "record in the index goes at its next call)"
            )
        return fn(database)

    return read_namespace(
        store.namespace(record.actor_id), read, max_bytes=max_bytes, temp_bytes=temp_bytes
    )


def read_namespace(
    kv: ActorKv,
    fn: Callable[[Database], T],
    *,
    max_bytes: int | None = None,
    temp_bytes: int | None = None,
) -> T:
    """`read_snapshot` of the database in namespace `kv` (an actor's, or any other)."""
    for _ in range(SNAPSHOT_ATTEMPTS - 1):
        try:
            return _read_once(kv, fn, max_bytes, temp_bytes)
        except SnapshotExpired:
            continue
    return _read_once(kv, fn, max_bytes, temp_bytes)


def _read_once(
    kv: ActorKv, fn: Callable[[Database], T], max_bytes: int | None, temp_bytes: int | None
) -> T:
    """SQLite reports a page the snapshot cannot have as an I/O error; the `SnapshotExpired`
    behind it, which the database keeps, tells it from any other failure. It reports temp files
    past their budget as `SQLITE_FULL`, which the database's `temp_files_full` tells apart."""
    with _snapshot(kv, max_bytes, temp_bytes) as database:
        try:
            return fn(database)
        except apsw.TooBigError as e:
            assert max_bytes is not None, "SQLite's own length limit is 1 GB"
            raise AnswerTooLarge(max_bytes) from e
        except apsw.FullError as e:
            full = database.temp_files_full
            if full is not None:
                raise QueryTooLarge(full.allowed) from e
            raise
        except apsw.IOError as e:
            cause = database.take_last_kv_error()
            if isinstance(cause, SnapshotExpired):
                raise cause from e
            raise


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def list_tables(connection: apsw.Connection) -> list[TableInfo]:
    names = [
        name
        for (name,) in connection.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )
    ]
    tables = []
    for name in names:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({_quote(name)})")]
        (count,) = cast(
            tuple[int], connection.execute(f"SELECT count(*) FROM {_quote(name)}").fetchall()[0]
        )
        tables.append(TableInfo(name, name.startswith(PREFIX), columns, count))
    return tables


def _size(value: Any) -> int:
    """Bytes a value adds to an answer, about: its length for text and blobs, 8 otherwise."""
    return len(value) if isinstance(value, str | bytes) else 8


def _collect(rows: Iterable[Sequence[Any]], limit: int, max_bytes: int | None) -> list[list[Any]]:
    """Up to `limit + 1` rows (one more tells that there were more), stopping with
    `AnswerTooLarge` as soon as their values pass `max_bytes`: never more in memory."""
    out: list[list[Any]] = []
    total = 0
    for row in rows:
        if len(out) > limit:
            break
        if max_bytes is not None:
            total += sum(_size(v) for v in row)
            if total > max_bytes:
                raise AnswerTooLarge(max_bytes)
        out.append(list(row))
    return out


def read_rows(
    connection: apsw.Connection,
    table: str,
    *,
    limit: int,
    offset: int,
    max_bytes: int | None = None,
) -> Rows:
    """One page of a table's rows in storage order (rowid, or primary key WITHOUT ROWID)."""
    if not has_table(connection, table):
        raise TableNotFound(f"no table {table!r} in this actor's database")
    cursor = connection.execute(
        f"SELECT * FROM {_quote(table)} LIMIT ? OFFSET ?", (limit + 1, offset)
    )
    columns = _description(cursor)
    rows = _collect(cursor, limit, max_bytes)
    if not columns:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({_quote(table)})")]
    return Rows(columns, rows[:limit], truncated=len(rows) > limit)


def read_queue(connection: apsw.Connection, *, limit: int, max_bytes: int | None = None) -> Rows:
    """Messages waiting in the actor's queue, oldest first, bodies decoded."""
    columns = ["id", "name", "body", "created"]
    if not has_table(connection, "_pagekv_queue"):
        return Rows(columns, [])
    messages = queue_messages(connection, limit=limit + 1)
    rows = _collect(((m.id, m.name, m.body, m.created) for m in messages), limit, max_bytes)
    decoded = [[i, name, cbor2.loads(body), created] for i, name, body, created in rows]
    return Rows(columns, decoded[:limit], truncated=len(decoded) > limit)


def read_schedules(connection: apsw.Connection, *, max_bytes: int | None = None) -> Rows:
    """Pending schedules, soonest first, arguments decoded (their number is bounded by the
    schedule limit, their bytes by `max_bytes`)."""
    columns = ["id", "due", "action", "args", "every", "created"]
    if not has_table(connection, "_pagekv_schedule"):
        return Rows(columns, [])
    calls = ((c.id, c.due, c.action, c.args, c.every, c.created) for c in schedules(connection))
    rows = _collect(calls, MAX_SCHEDULES, max_bytes)
    return Rows(columns, [[i, d, a, cbor2.loads(b), e, c] for i, d, a, b, e, c in rows])


def read_workflow(
    connection: apsw.Connection, *, max_bytes: int | None = None
) -> dict[str, Any] | None:
    """The actor's workflow state and history, or None if it has none; `AnswerTooLarge` if it
    holds more than `max_bytes` (a history is bounded by its pruning, not by a page size)."""
    from pagekv.actor.workflow import describe

    workflow = describe(connection)
    if max_bytes is not None and workflow is not None and len(cbor2.dumps(workflow)) > max_bytes:
        raise AnswerTooLarge(max_bytes)
    return workflow


class _ReadOnly:
    """Authorizer of `query`: reads only; names what it refused in `refused`."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, op: int, p1: str | None, p2: str | None, db: str | None, trig: str | None):
        if op in _READ_OPS or (op == apsw.SQLITE_PRAGMA and p1 in _READ_PRAGMAS):
            return apsw.SQLITE_OK
        what = apsw.mapping_authorizer_function.get(op, str(op))
        self.refused = f"{what} {p1 or ''}".strip()
        return apsw.SQLITE_DENY


def query(
    connection: apsw.Connection,
    sql: str,
    params: Sequence[Any] | dict[str, Any],
    *,
    max_rows: int,
    timeout_s: float,
    max_bytes: int | None = None,
) -> Rows:
    """Run one read-only statement on a snapshot connection.

    Writes are refused three times over: the connection is a snapshot opened read-only, an
    authorizer allows nothing but reads (no ATTACH, no pragmas that set, no transactions), and a
    statement tracer lets only one statement run. A progress handler stops it after `timeout_s`.
    """
    guard = _ReadOnly()
    deadline = time.monotonic() + timeout_s
    statements = 0

    def one_statement(cursor: apsw.Cursor, statement: str, bindings: Any) -> bool:
        nonlocal statements
        statements += 1
        return statements == 1

    connection.authorizer = guard
    connection.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
    cursor = connection.cursor()
    cursor.exec_trace = one_statement
    try:
        try:
            cursor.execute(sql, params)
        except (TypeError, KeyError) as e:  # APSW's answers to a value or name it cannot bind
            raise InspectError(f"invalid query parameters: {e}") from e
        columns = _description(cursor)
        rows = _collect(cursor, max_rows, max_bytes)
        return Rows(columns, rows[:max_rows], truncated=len(rows) > max_rows)
    except apsw.AuthError as e:
        raise QueryRefused(f"read-only query refused: {guard.refused or e}") from e
    except apsw.ExecTraceAbort as e:
        raise QueryRefused("read-only query refused: send exactly one statement") from e
    except apsw.InterruptError as e:
        raise QueryRefused(f"read-only query refused: it ran longer than {timeout_s} s") from e
    except apsw.ReadOnlyError as e:
        raise QueryRefused(f"read-only query refused: {e}") from e
    except (apsw.SQLError, apsw.BindingsError) as e:
        raise InspectError(f"invalid query: {e}") from e
    finally:
        connection.authorizer = None
        connection.set_progress_handler(None)


def _description(cursor: apsw.Cursor) -> list[str]:
    """Column names of the running statement ([] once it has finished: no rows)."""
    try:
        return [column[0] for column in cursor.get_description()]
    except apsw.ExecutionCompleteError:
        return []
