"""`read_snapshot`: the inspector's reads of a live actor reopen a snapshot that the writer
overtook (a page it had not read yet rewritten in place or compacted away), a bounded number of
times, and report every other failure as it is."""

from __future__ import annotations

import apsw
import pytest

from pagekv.actor.inspect_reads import SNAPSHOT_ATTEMPTS, ActorRecord, read_snapshot
from pagekv.kv import MemoryStore
from pagekv.vfs import Database, SnapshotExpired, open_database

ROWS = 1200  # a page per 3 KB row: past the 4 MiB a snapshot reads whole at its open


@pytest.fixture
def writer() -> tuple[MemoryStore, ActorRecord, Database]:
    store = MemoryStore()
    record = ActorRecord("ledger", "k", 0.0)
    db = open_database(store.namespace(record.actor_id))
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    with db.connection:
        for i in range(ROWS):
            db.execute("INSERT INTO t VALUES (?, randomblob(3000))", (i,))
    db.compact()  # fully compacted: the next small commits are in place
    return store, record, db


def _reader(db: Database, overtaken: int) -> tuple[list[int], object]:
    """A read of the last row, preceded in its first `overtaken` calls by the writer rewriting
    that row in place."""
    calls: list[int] = []

    def read(snap: Database) -> int:
        calls.append(len(calls) + 1)
        if len(calls) <= overtaken:
            db.execute("UPDATE t SET v = ? WHERE id = ?", (bytes([len(calls)]) * 10, ROWS - 1))
        return snap.execute("SELECT length(v) FROM t WHERE id = ?", (ROWS - 1,)).fetchall()[0][0]

    return calls, read


def test_an_overtaken_snapshot_is_reopened(
    writer: tuple[MemoryStore, ActorRecord, Database],
) -> None:
    store, record, db = writer
    calls, read = _reader(db, overtaken=SNAPSHOT_ATTEMPTS - 1)
    in_place = db.metrics()["commits_in_place"]
    assert read_snapshot(store, record, read) == 10
    assert calls == list(range(1, SNAPSHOT_ATTEMPTS + 1))
    assert db.metrics()["commits_in_place"] == in_place + SNAPSHOT_ATTEMPTS - 1
    db.close()


def test_a_snapshot_overtaken_every_time_gives_up(
    writer: tuple[MemoryStore, ActorRecord, Database],
) -> None:
    store, record, db = writer
    calls, read = _reader(db, overtaken=SNAPSHOT_ATTEMPTS)
    with pytest.raises(SnapshotExpired, match="rewritten or compacted since this snapshot"):
        read_snapshot(store, record, read)
    assert len(calls) == SNAPSHOT_ATTEMPTS
    db.close()


def test_other_errors_are_not_retried(writer: tuple[MemoryStore, ActorRecord, Database]) -> None:
    store, record, db = writer
    calls: list[int] = []

    def bad(snap: Database) -> object:
        calls.append(1)
        return snap.execute("SELECT * FROM missing").fetchall()

    with pytest.raises(apsw.SQLError, match="no such table"):
        read_snapshot(store, record, bad)
    assert calls == [1]
    db.close()
