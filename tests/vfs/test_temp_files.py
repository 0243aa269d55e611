"""A read-only snapshot opened with `temp_bytes` sorts in temp files on disk within that budget
(#43 item 9); without it, and always for a writer, temp files stay in memory and no open of
one reaches the disk."""

from __future__ import annotations

import apsw
import pytest

from pagekv.kv import ActorKv, MemoryStore
from pagekv.vfs import open_database
from pagekv.vfs.page_vfs import TempFilesFull

ROWS = 40
SORT = "SELECT id FROM t ORDER BY b"


def filled() -> ActorKv:
    kv = MemoryStore().namespace("actor-1")
    with open_database(kv) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
        for i in range(ROWS):
            db.execute("INSERT INTO t VALUES (?, randomblob(1000000))", (i,))
        db.execute("SELECT id FROM t ORDER BY b").fetchall()
    return kv


def test_a_snapshot_with_temp_bytes_sorts_on_disk_within_them() -> None:
    kv = filled()
    with open_database(kv, read_only=True) as memory:
        expected = memory.execute(SORT).fetchall()
        assert memory.execute("PRAGMA temp_store").fetchall() == [(2,)]
    with open_database(kv, read_only=True, temp_bytes=2**30) as spilling:
        assert spilling.execute("PRAGMA temp_store").fetchall() == [(1,)]
        assert spilling.execute(SORT).fetchall() == expected
        assert spilling.temp_files_full is None
    with open_database(kv, read_only=True, temp_bytes=10 * 2**20) as capped:
        with pytest.raises(apsw.FullError):
            capped.execute(SORT).fetchall()
        full = capped.temp_files_full
        assert isinstance(full, TempFilesFull) and full.allowed == 10 * 2**20
        assert capped.execute("SELECT count(*) FROM t").fetchall() == [(ROWS,)]


def test_a_writer_keeps_its_temp_files_in_memory() -> None:
    kv = MemoryStore().namespace("actor-1")
    with pytest.raises(ValueError, match=r"temp_bytes \(1048576\) is for a read-only snapshot"):
        open_database(kv, temp_bytes=2**20)
    with pytest.raises(ValueError, match="at least 1"):
        open_database(kv, read_only=True, temp_bytes=0)
