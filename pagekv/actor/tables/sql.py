"""Every statement the runtime runs on its own `_pagekv_*` tables, and the typed rows they hold.

Why one module: these tables are a persisted format (export, import, copy and upgrades read
them), so what is written to them, and how, is reviewed in one place, beside the schema that
makes them (`schema`). Callers pass the connection of the transaction they are in and get
frozen dataclasses back; none of them writes SQL on these tables.

Invariants: every function runs inside its caller's transaction and opens none of its own,
except the creation commit (`mark_initialized`) and the upgrade a wake may make (`load`, through
`schema.migrate`); blobs stay the bytes stored, their CBOR decoded by the caller, except the
state's (`encode_state`, `read_state`), which is decoded here; the caller sets the `Reserved`
authorizer's `internal` flag (`ActorDb.locked(..., internal=True)`), as only the runtime writes
these tables.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, cast

import apsw
import cbor2

from pagekv.actor.tables.schema import has_table, migrate

Row = tuple[Any, ...]


# -- meta and state ------------------------------------------------------------------------


@dataclass(frozen=True)
class ActorMeta:
    """`_pagekv_meta`: what the runtime records of the actor. Fields are `object` where an
    imported file may hold anything; the runtime writes a bool, str, str and a Unix time."""

    initialized: bool
    name: object
    key: object
    created_at: object


def read_meta(connection: apsw.Connection) -> ActorMeta:
    rows = dict(
        cast(Iterable[tuple[str, Any]], connection.execute("SELECT key, value FROM _pagekv_meta"))
    )
    return ActorMeta(
        bool(rows.get("initialized")), rows.get("name"), rows.get("key"), rows.get("created_at")
    )


def is_initialized(connection: apsw.Connection) -> bool:
    """Whether the database holds a created actor (read only: nothing is migrated)."""
    if not has_table(connection, "_pagekv_meta"):
        return False
    rows = connection.execute("SELECT value FROM _pagekv_meta WHERE key = 'initialized'")
    return bool(rows.fetchall())


def name_actor(connection: apsw.Connection, name: str, key: str) -> None:
    """Record the name and key the actor is known by (an import may rename it)."""
    connection.executemany(
        "INSERT OR REPLACE INTO _pagekv_meta VALUES (?, ?)", [("name", name), ("key", key)]
    )


def read_state(connection: apsw.Connection) -> Any:
    """The committed state, decoded (None before the first commit, or without the table)."""
    if not has_table(connection, "_pagekv_state"):
        return None
    rows = cast(
        list[tuple[bytes]],
        connection.execute("SELECT data FROM _pagekv_state WHERE id = 1").fetchall(),
    )
    return cbor2.loads(rows[0][0]) if rows else None


def save_state(connection: apsw.Connection, data: bytes) -> None:
    """Write the state row (`data`: the CBOR of `encode_state`); the hot path of an action."""
    connection.execute("INSERT OR REPLACE INTO _pagekv_state(id, data) VALUES (1, ?)", (data,))


def encode_state(state: Any) -> bytes:
    try:
        return cbor2.dumps(state)
    except (cbor2.CBOREncodeError, TypeError, ValueError) as e:
        raise TypeError(f"actor state must be CBOR-serialisable: {e}") from e


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
    if not has_table(connection, "_pagekv_meta"):
        return Loaded(False, None, None, fresh=True)
    migrate(connection)
    meta = read_meta(connection)
    return Loaded(meta.initialized, read_state(connection), earliest_due(connection), fresh=False)


# -- queue ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueMessage:
    """A row of `_pagekv_queue`: ids grow with every append (AUTOINCREMENT), so id order is
    arrival order; `body` is the message's CBOR."""

    id: int
    name: str
    body: bytes
    created: float


def queue_size(connection: apsw.Connection) -> int:
    return cast(int, connection.execute("SELECT count(*) FROM _pagekv_queue").fetchall()[0][0])


def queue_append(connection: apsw.Connection, name: str, body: bytes) -> int:
    """Append a message created now; its id."""
    connection.execute(
        "INSERT INTO _pagekv_queue(name, body, created) VALUES (?, ?, ?)",
        (name, body, time.time()),
    )
    return connection.last_insert_rowid()


def queue_messages(
    connection: apsw.Connection,
    *,
    limit: int,
    names: Sequence[str] | None = None,
    skip: Sequence[int] = (),
) -> Iterator[QueueMessage]:
    """Up to `limit` messages, oldest first: of `names` if given, none of the ids in `skip`.
    Read as iterated (an inspector stops early on a size limit)."""
    where = f"id NOT IN ({','.join('?' * len(skip))})" if skip else "1"
    params: list[Any] = list(skip)
    if names is not None:
        where += f" AND name IN ({','.join('?' * len(names))})"
        params.extend(names)
    params.append(limit)
    cursor = connection.execute(
        f"SELECT id, name, body, created FROM _pagekv_queue WHERE {where} ORDER BY id LIMIT ?",
        params,
    )
    return (QueueMessage(*row) for row in cursor)


def queue_delete(connection: apsw.Connection, ids: Iterable[int]) -> None:
    connection.executemany("DELETE FROM _pagekv_queue WHERE id = ?", [(i,) for i in ids])


def queue_give_back(connection: apsw.Connection, messages: Sequence[QueueMessage]) -> None:
    """Put received messages back under their own ids (so in their order); one there already
    stays as it is."""
    connection.executemany(
        "INSERT OR IGNORE INTO _pagekv_queue(id, name, body, created) VALUES (?, ?, ?, ?)",
        [_queue_values(m) for m in messages],
    )


# -- schedules -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduledCall:
    """A row of `_pagekv_schedule`: call `action` with the CBOR list `args` at `due` (Unix
    time), then every `every` seconds if set. `id` is unique: putting one replaces it."""

    id: str
    due: float
    action: str
    args: bytes
    every: float | None
    created: float


def schedule_count(connection: apsw.Connection, *, other_than: str) -> int:
    """How many schedules there are besides the one with id `other_than`."""
    rows = connection.execute("SELECT count(*) FROM _pagekv_schedule WHERE id != ?", (other_than,))
    return cast(int, rows.fetchall()[0][0])


def schedule_put(connection: apsw.Connection, call: ScheduledCall) -> None:
    connection.execute(
        "INSERT OR REPLACE INTO _pagekv_schedule VALUES (?, ?, ?, ?, ?, ?)", _schedule_values(call)
    )


def schedules(
    connection: apsw.Connection, *, due_by: float | None = None
) -> Iterator[ScheduledCall]:
    """The schedules (due by `due_by`, if given), soonest first; read as iterated."""
    where, params = ("due <= ?", (due_by,)) if due_by is not None else ("1", ())
    cursor = connection.execute(
        "SELECT id, due, action, args, every, created FROM _pagekv_schedule "
        f"WHERE {where} ORDER BY due, id",
        params,
    )
    return (ScheduledCall(*row) for row in cursor)


def schedule_due(connection: apsw.Connection, call_id: str) -> float | None:
    """When the schedule `call_id` is due; None if there is none."""
    rows = connection.execute("SELECT due FROM _pagekv_schedule WHERE id = ?", (call_id,))
    found = cast(list[tuple[float]], rows.fetchall())
    return found[0][0] if found else None


def earliest_due(connection: apsw.Connection) -> float | None:
    rows = connection.execute("SELECT min(due) FROM _pagekv_schedule").fetchall()
    return cast(float | None, rows[0][0])


def due_types(connection: apsw.Connection) -> set[str]:
    """The SQLite types of the stored due times (an imported file may hold any)."""
    rows = connection.execute("SELECT DISTINCT typeof(due) FROM _pagekv_schedule").fetchall()
    return {cast(str, kind) for (kind,) in rows}


def schedule_cancel(connection: apsw.Connection, call_id: str) -> bool:
    """Remove the schedule `call_id`; whether there was one."""
    connection.execute("DELETE FROM _pagekv_schedule WHERE id = ?", (call_id,))
    return connection.changes() > 0


def is_scheduled(connection: apsw.Connection, call_id: str, due: float) -> bool:
    """Whether `call_id` is still due at `due` (not cancelled, nor moved, since it was read)."""
    rows = connection.execute(
        "SELECT 1 FROM _pagekv_schedule WHERE id = ? AND due = ?", (call_id, due)
    ).fetchall()
    return bool(rows)


def schedule_done(
    connection: apsw.Connection, call_id: str, due: float, then: float | None
) -> None:
    """After the call due at `due` ran: remove it (`then` None), or move it to `then`. A row
    due at another time was replaced meanwhile and is left alone."""
    if then is None:
        connection.execute("DELETE FROM _pagekv_schedule WHERE id = ? AND due = ?", (call_id, due))
    else:
        connection.execute(
            "UPDATE _pagekv_schedule SET due = ? WHERE id = ? AND due = ?", (then, call_id, due)
        )


# -- workflow ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowOutcome:
    """`_pagekv_workflow`: the history's format version and the workflow's outcome, as stored
    (`state` None: none recorded yet; `output` and `error` CBOR)."""

    format_version: int | None
    state: str | None
    output: bytes | None
    error: bytes | None


@dataclass(frozen=True)
class HistoryRow:
    """A row of `_pagekv_workflow_history`: one entry's metadata in columns and its kind's
    payload as CBOR (`data`; see `pagekv.actor.workflow.payloads`)."""

    location: str
    seq: int
    name: str
    kind: str
    data: bytes
    status: str
    attempts: int
    error: str | None
    created: float
    last_attempt: float | None
    completed: float | None
    rollback_completed: float | None
    rollback_error: str | None


_HISTORY_COLUMNS = (
    "location, seq, name, kind, data, status, attempts, error, created, last_attempt, "
    "completed, rollback_completed, rollback_error"
)


def read_workflow_outcome(connection: apsw.Connection) -> WorkflowOutcome:
    meta = dict(
        cast(
            Iterable[tuple[str, Any]], connection.execute("SELECT key, value FROM _pagekv_workflow")
        )
    )
    return WorkflowOutcome(
        meta.get("format_version"), meta.get("state"), meta.get("output"), meta.get("error")
    )


def read_workflow_names(connection: apsw.Connection) -> dict[str, int]:
    """The name registry: name -> index (locations hold indexes)."""
    rows = connection.execute("SELECT idx, name FROM _pagekv_workflow_names")
    return {name: idx for idx, name in rows}


def read_history(connection: apsw.Connection) -> Iterator[HistoryRow]:
    cursor = connection.execute(f"SELECT {_HISTORY_COLUMNS} FROM _pagekv_workflow_history")
    return (HistoryRow(*row) for row in cursor)


def delete_history(connection: apsw.Connection, low: str, high: str) -> None:
    """Delete the entries whose locations are in `[low, high)`."""
    connection.execute(
        "DELETE FROM _pagekv_workflow_history WHERE location >= ? AND location < ?", (low, high)
    )


def put_history(connection: apsw.Connection, rows: Sequence[HistoryRow]) -> None:
    connection.executemany(
        f"INSERT OR REPLACE INTO _pagekv_workflow_history({_HISTORY_COLUMNS}) "
        f"VALUES ({', '.join('?' * 13)})",
        [_history_values(row) for row in rows],
    )


def add_workflow_names(connection: apsw.Connection, names: Sequence[tuple[int, str]]) -> None:
    """Append `(index, name)` pairs to the name registry (never rewritten)."""
    connection.executemany("INSERT INTO _pagekv_workflow_names(idx, name) VALUES (?, ?)", names)


def put_workflow_outcome(connection: apsw.Connection, outcome: WorkflowOutcome) -> None:
    connection.executemany(
        "INSERT OR REPLACE INTO _pagekv_workflow(key, value) VALUES (?, ?)",
        [
            ("format_version", outcome.format_version),
            ("state", outcome.state),
            ("output", outcome.output),
            ("error", outcome.error),
        ],
    )


# -- realtime connections ------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionRow:
    """A row of `_pagekv_connections`: a realtime connection's parameters (CBOR) and its
    state and subscriptions (`data`: the CBOR of `[state, sorted subscriptions]`)."""

    id: str
    params: bytes
    data: bytes


def read_connections(connection: apsw.Connection) -> list[ConnectionRow]:
    rows = connection.execute("SELECT id, params, data FROM _pagekv_connections")
    return [ConnectionRow(*row) for row in cast(list[tuple[str, bytes, bytes]], rows.fetchall())]


def put_connections(connection: apsw.Connection, rows: Sequence[ConnectionRow]) -> None:
    connection.executemany(
        "INSERT OR REPLACE INTO _pagekv_connections(id, params, data) VALUES (?, ?, ?)",
        [_connection_values(row) for row in rows],
    )


def has_connection(connection: apsw.Connection, connection_id: str) -> bool:
    rows = connection.execute("SELECT 1 FROM _pagekv_connections WHERE id = ?", (connection_id,))
    return bool(rows.fetchall())


def delete_connection(connection: apsw.Connection, connection_id: str) -> None:
    connection.execute("DELETE FROM _pagekv_connections WHERE id = ?", (connection_id,))


def _values(record: type) -> attrgetter[Row]:
    """A record's fields as a tuple, in column order (no copy, unlike `dataclasses.astuple`)."""
    return attrgetter(*(f.name for f in fields(record)))


_queue_values = _values(QueueMessage)
_schedule_values = _values(ScheduledCall)
_history_values = _values(HistoryRow)
_connection_values = _values(ConnectionRow)
