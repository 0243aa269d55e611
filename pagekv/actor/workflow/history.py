"""A workflow's history: entries keyed by location, stored in the actor's own database.

Tables (created by internal schema version 2, see `pagekv.actor.tables.schema`; read and
written through `pagekv.actor.tables.sql`):

- `_pagekv_workflow(key, value)`: `format_version`, and the workflow's `state`, `output` and
  `error` (CBOR).
- `_pagekv_workflow_names(idx, name)`: the append-only name registry; locations refer to names by
  index so that keys stay short however long the names are.
- `_pagekv_workflow_history(location, seq, ...)`: one row per entry, with its metadata (status,
  attempts, error, timing, rollback progress) in columns and its kind-specific data as CBOR.

A location is the path of name indexes from the root, joined by `/`; a loop iteration adds a
segment `~` + the zero-padded iteration number, so that one key range covers a run of old
iterations (history pruning is one `DELETE ... WHERE location >= ? AND location < ?`).

Invariant: the in-memory `History` is the truth and the database lags it by the `pending` writes,
which the runner writes inside its next transaction; `pending` is cleared only once that
transaction committed, so a rolled-back transaction loses nothing.
"""

from __future__ import annotations

import enum
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import apsw
import cbor2

from pagekv.actor.tables.schema import has_table
from pagekv.actor.tables.sql import (
    HistoryRow,
    QueueMessage,
    WorkflowOutcome,
    add_workflow_names,
    delete_history,
    put_history,
    put_workflow_outcome,
    queue_give_back,
    read_history,
    read_workflow_names,
    read_workflow_outcome,
)
from pagekv.actor.workflow.errors import WorkflowFormatError
from pagekv.actor.workflow.payloads import Kind, Payload, StepDone, decode, encode

P = TypeVar("P", bound=Payload)
FORMAT_VERSION = 2
"""The encoding of entries in `_pagekv_workflow_history` (their payloads: `payloads`); a newer
one is refused. Version 2 added `iteration` entries (version 1 histories read as they are)."""


class Status(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXHAUSTED = "exhausted"


class WorkflowState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SLEEPING = "sleeping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ROLLING_BACK = "rolling_back"


FINAL_STATES = frozenset({WorkflowState.COMPLETED, WorkflowState.FAILED, WorkflowState.CANCELLED})
"""States that end the workflow: later wakes do not run it (a failure of its code aside)."""


@dataclass
class Entry:
    """One durable operation of the workflow and its metadata."""

    location: str
    seq: int
    """Creation order, unique; replay-from-step deletes an entry and every later one."""
    name: str
    kind: Kind
    data: Payload
    status: Status = Status.PENDING
    attempts: int = 0
    error: str | None = None
    created: float = field(default_factory=time.time)
    last_attempt: float | None = None
    completed: float | None = None
    rollback_completed: float | None = None
    rollback_error: str | None = None

    def payload(self, expected: type[P]) -> P:
        """`data` as the payload type its kind records; `WorkflowFormatError` if it is not."""
        if not isinstance(self.data, expected):
            raise WorkflowFormatError(
                f"the {self.kind.value} entry {self.name!r} holds a {type(self.data).__name__}, "
                f"not a {expected.__name__}"
            )
        return self.data

    def settled(self, **changes: Any) -> Entry:
        """A completed copy (the original stays as it is until the copy is committed)."""
        return replace(self, status=Status.COMPLETED, completed=time.time(), **changes)


def child(scope: str, segment: int | str) -> str:
    return f"{scope}/{segment}" if scope else str(segment)


def iteration_scope(loop_location: str, iteration: int) -> str:
    return f"{loop_location}/~{iteration:010d}"


def iteration_index(loop_location: str, location: str) -> int | None:
    """The iteration of the loop at `loop_location` that holds `location`, if any."""
    prefix = f"{loop_location}/~"
    if not location.startswith(prefix):
        return None
    return int(location[len(prefix) : len(prefix) + 10])


def scope_of(location: str) -> str:
    return location.rpartition("/")[0]


def subtree_range(scope: str) -> tuple[str, str]:
    """The key range of every location strictly below `scope` (`/` + 1 is `0`)."""
    return f"{scope}/", f"{scope}0"


class History:
    """One workflow's history in memory: its entries by location, the name registry, its outcome,
    and the writes the database still lacks. It is the truth, and the database lags it by the
    pending writes until the runner's next transaction commits them (see the module).
    Event loop only: the runner and the `wf` scopes of one instance use it, one at a time."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.names: dict[str, int] = {}
        self.state = WorkflowState.PENDING
        self.recorded = False
        """Whether the database holds an outcome (state) for this workflow yet."""
        self.output: Any = None
        self.error: dict[str, Any] | None = None
        self.next_seq = 1
        self.unvisited: defaultdict[str, set[str]] = defaultdict(set)
        """Per scope, the recorded entries this execution has not reached yet."""
        self._pending_puts: dict[str, None] = {}
        self._pending_deletes: list[tuple[str, str]] = []
        self._pending_names: list[tuple[int, str]] = []
        self._pending_returns: list[QueueMessage] = []
        """Queue rows a race gives back with the deletion of its losers: written by the same
        commit as that deletion, whichever branch's commit it is."""
        self._meta_dirty = False
        self._committed: tuple[WorkflowState, Any, dict[str, Any] | None] = (self.state, None, None)
        """State, output and error as the database holds them."""
        self._taken: tuple[WorkflowState, Any, dict[str, Any] | None] | None = None
        """State, output and error as the database holds them once the batch taken last
        commits (one transaction at a time: at most one is under way); None while unknown
        (nothing recorded yet)."""

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load_outcome(cls, connection: apsw.Connection) -> History:
        """Only the state, output and error (no entries): what a status query needs."""
        history = cls()
        stored = read_workflow_outcome(connection)
        version = FORMAT_VERSION if stored.format_version is None else stored.format_version
        if version > FORMAT_VERSION:
            raise WorkflowFormatError(
                f"the workflow history has format version {version}; this pagekv reads up to "
                f"{FORMAT_VERSION}. Upgrade pagekv."
            )
        history.recorded = stored.state is not None
        if stored.state is not None:
            history.state = WorkflowState(stored.state)
            history.output = cbor2.loads(stored.output) if stored.output else None
            history.error = cbor2.loads(stored.error) if stored.error else None
        history._committed = (history.state, history.output, history.error)
        history._taken = history._committed if history.recorded else None
        return history

    @classmethod
    def load(cls, connection: apsw.Connection) -> History:
        history = cls.load_outcome(connection)
        history.names = read_workflow_names(connection)
        for row in read_history(connection):
            entry = _entry(row)
            history.entries[entry.location] = entry
            history.unvisited[scope_of(entry.location)].add(entry.location)
            history.next_seq = max(history.next_seq, entry.seq + 1)
        return history

    def restart(self) -> None:
        """A new execution from the top: every recorded entry is unvisited again."""
        self.unvisited.clear()
        for location in self.entries:
            self.unvisited[scope_of(location)].add(location)

    # -- changes ----------------------------------------------------------------------------

    def name_index(self, name: str) -> int:
        idx = self.names.get(name)
        if idx is None:
            idx = self.names[name] = len(self.names)
            self._pending_names.append((idx, name))
        return idx

    def new_entry(self, location: str, name: str, kind: Kind, data: Payload) -> Entry:
        """A fresh entry, not yet recorded (put it, or stage it with a transaction)."""
        entry = Entry(location, self.next_seq, name, kind, data)
        self.next_seq += 1
        return entry

    def put(self, entry: Entry) -> None:
        self.entries[entry.location] = entry
        self._pending_puts[entry.location] = None

    def within(self, low: str, high: str) -> list[Entry]:
        """The entries whose locations are in `[low, high)`."""
        return [e for loc, e in self.entries.items() if low <= loc < high]

    def undoable_in(self, low: str, high: str) -> list[Entry]:
        """The completed steps in `[low, high)` whose rollback handler has not run yet."""
        return [
            e
            for e in self.within(low, high)
            if isinstance(e.data, StepDone)
            and e.data.undoable
            and e.status is Status.COMPLETED
            and e.rollback_completed is None
        ]

    def delete_range(self, low: str, high: str) -> list[Entry]:
        gone = self.within(low, high)
        for entry in gone:
            self._forget(entry.location)
        self._pending_deletes.append((low, high))
        return gone

    def delete_from(self, seq: int) -> list[str]:
        """Delete every entry created at or after `seq`; their locations."""
        gone = [e.location for e in self.entries.values() if e.seq >= seq]
        for location in gone:
            self._forget(location)
            self._pending_deletes.append((location, location + "\x00"))
        return gone

    def _forget(self, location: str) -> None:
        del self.entries[location]
        self._pending_puts.pop(location, None)
        self.unvisited[scope_of(location)].discard(location)

    def set_outcome(
        self, state: WorkflowState, *, output: Any = None, error: dict[str, Any] | None = None
    ) -> None:
        self.state, self.output, self.error = state, output, error
        self._meta_dirty = True

    def set_state(self, state: WorkflowState) -> None:
        """A state that returns to what the database holds (or will, once the commit under
        way lands) is nothing to write: a workflow woken by a message it does not wait for
        goes back to sleep without a commit."""
        if state is not self.state:
            self.state = state
            self._meta_dirty = (self.state, self.output, self.error) != self._taken

    def visible_outcome(self) -> tuple[WorkflowState, Any, dict[str, Any] | None]:
        """State, output and error to show outside the run handler: the ones in memory (ahead of
        the database while the workflow runs), except that an outcome that ends the workflow is
        shown only once it is committed: a crash before then runs the workflow again."""
        current = (self.state, self.output, self.error)
        if self.state in FINAL_STATES and current != self._committed:
            return self._committed
        return current

    def give_back(self, rows: list[QueueMessage]) -> None:
        """Queue rows to put back with the pending changes."""
        self._pending_returns += rows

    def dirty(self) -> bool:
        return bool(
            self._pending_puts
            or self._pending_deletes
            or self._pending_names
            or self._pending_returns
            or self._meta_dirty
        )

    # -- writing ----------------------------------------------------------------------------

    def take_pending(self, staged: list[Entry]) -> PendingWrite:
        """The pending changes and `staged`, serialised now (on the event loop), and no longer
        pending: changes made while their commit runs (another join branch's) are pending for
        the next one, and the worker thread that writes touches nothing shared."""
        batch = PendingWrite(
            deletes=list(self._pending_deletes),
            puts=list(self._pending_puts),
            rows=[_row(self.entries[loc]) for loc in self._pending_puts if loc in self.entries]
            + [_row(entry) for entry in staged],
            names=list(self._pending_names),
            returns=list(self._pending_returns),
            outcome=(self.state, self.output, self.error) if self._meta_dirty else None,
            staged=list(staged),
        )
        self._pending_puts.clear()
        self._pending_deletes.clear()
        self._pending_names.clear()
        self._pending_returns.clear()
        self._meta_dirty = False
        if batch.outcome is not None:
            self._taken = batch.outcome
        return batch

    def committed(self, batch: PendingWrite) -> None:
        """The transaction that wrote `batch` has committed."""
        for entry in batch.staged:
            self.entries[entry.location] = entry
        if batch.outcome is not None:
            self._committed, self.recorded = batch.outcome, True

    def not_committed(self, batch: PendingWrite) -> None:
        """The transaction that was to write `batch` failed: its changes are pending again,
        before any made since (a write applies deletes first, then the entries present)."""
        self._pending_deletes[:0] = batch.deletes
        for location in batch.puts:
            self._pending_puts[location] = None
        self._pending_names[:0] = batch.names
        self._pending_returns[:0] = batch.returns
        if batch.outcome is not None:
            self._meta_dirty = True
            self._taken = self._committed if self.recorded else None


@dataclass(frozen=True)
class PendingWrite:
    """What one transaction writes of the history, taken from memory before it commits."""

    deletes: list[tuple[str, str]]
    puts: list[str]
    rows: list[HistoryRow]
    names: list[tuple[int, str]]
    returns: list[QueueMessage]
    outcome: tuple[WorkflowState, Any, dict[str, Any] | None] | None
    staged: list[Entry]

    def write(self, connection: apsw.Connection) -> None:
        """Write it inside the caller's transaction. Deletes go first, then puts: that order
        yields the in-memory history whatever order the changes were made in."""
        for low, high in self.deletes:
            delete_history(connection, low, high)
        if self.rows:
            put_history(connection, self.rows)
        if self.names:
            add_workflow_names(connection, self.names)
        if self.returns:
            queue_give_back(connection, self.returns)
        if self.outcome is not None:
            state, output, error = self.outcome
            encoded_error = cbor2.dumps(error) if error is not None else None
            put_workflow_outcome(
                connection,
                WorkflowOutcome(FORMAT_VERSION, state.value, cbor2.dumps(output), encoded_error),
            )


def _row(entry: Entry) -> HistoryRow:
    return HistoryRow(
        entry.location,
        entry.seq,
        entry.name,
        entry.kind.value,
        cbor2.dumps(encode(entry.data)),
        entry.status.value,
        entry.attempts,
        entry.error,
        entry.created,
        entry.last_attempt,
        entry.completed,
        entry.rollback_completed,
        entry.rollback_error,
    )


def _entry(row: HistoryRow) -> Entry:
    kind = Kind(row.kind)
    return Entry(
        row.location,
        row.seq,
        row.name,
        kind,
        decode(kind, cbor2.loads(row.data)),
        Status(row.status),
        row.attempts,
        row.error,
        row.created,
        row.last_attempt,
        row.completed,
        row.rollback_completed,
        row.rollback_error,
    )


def readable(location: str, names: dict[int, str]) -> str:
    """`3/~0000000002/5` as `retry/~2/charge`."""
    return "/".join(
        f"~{int(s[1:])}" if s.startswith("~") else names[int(s)] for s in location.split("/")
    )


def describe(connection: apsw.Connection) -> dict[str, Any] | None:
    """The workflow's state, outcome and history for inspectors; None if it never ran.

    Read-only and JSON-friendly (CBOR values decoded; locations spelled with names).
    """
    if not has_table(connection, "_pagekv_workflow"):
        return None
    history = History.load(connection)
    if not history.entries and not history.recorded:
        return None
    names = {idx: name for name, idx in history.names.items()}
    return {
        "state": history.state.value,
        "format_version": FORMAT_VERSION,
        "output": history.output,
        "error": history.error,
        "entries": [
            {
                "location": readable(e.location, names),
                "name": e.name,
                "kind": e.kind.value,
                "status": e.status.value,
                "attempts": e.attempts,
                "error": e.error,
                "created": e.created,
                "last_attempt": e.last_attempt,
                "completed": e.completed,
                "rollback_completed": e.rollback_completed,
                "rollback_error": e.rollback_error,
                "data": encode(e.data),
            }
            for e in sorted(history.entries.values(), key=lambda e: e.seq)
        ],
    }
