"""Stored-page integrity: CRCs are checked, missing pages are errors, newer formats are refused."""

from __future__ import annotations

import apsw
import cbor2
import pytest

from pagekv.kv import ActorKv, MemoryStore
from pagekv.vfs import StorageCorrupt, open_database
from pagekv.vfs.format import BASE_END, DELTA_END, DELTA_PREFIX, HEAD_KEY, PREFIX, Head
from pagekv.vfs.pages import PageStore

BASE_PREFIX = PREFIX + b"B"


def _database(compacted: bool) -> ActorKv:
    kv = MemoryStore().namespace("t")
    with open_database(kv, auto_compact=False) as db:
        db.execute("CREATE TABLE t(v BLOB)")
        db.execute("INSERT INTO t VALUES (randomblob(20000))")
        if compacted:
            db.compact()
    return kv


def _stored(kv: ActorKv, compacted: bool) -> list[tuple[bytes, bytes]]:
    start, end = (BASE_PREFIX, BASE_END) if compacted else (DELTA_PREFIX, DELTA_END)
    rows = kv.list(start=start, end=end)
    assert rows, "the database must have stored pages of this kind"
    return rows


@pytest.mark.parametrize("compacted", [False, True], ids=["delta", "base"])
def test_a_flipped_byte_in_a_stored_page_is_detected(compacted: bool) -> None:
    kv = _database(compacted)
    key, value = _stored(kv, compacted)[-1]
    damaged = bytearray(value)
    damaged[-100] ^= 0x01
    kv.put({key: bytes(damaged)})
    with (
        pytest.raises((apsw.CorruptError, StorageCorrupt), match="CRC mismatch"),
        open_database(kv) as db,
    ):
        db.execute("SELECT length(v) FROM t").fetchall()


@pytest.mark.parametrize("compacted", [False, True], ids=["delta", "base"])
def test_a_missing_page_below_eof_is_an_error_not_zeros(compacted: bool) -> None:
    kv = _database(compacted)
    key, _ = _stored(kv, compacted)[-1]
    kv.delete([key])
    with pytest.raises(StorageCorrupt, match="is missing"):
        store = PageStore(kv)
        store.read(store.size, 0)


def test_a_newer_format_is_refused_with_a_clear_error() -> None:
    kv = _database(compacted=False)
    head = cbor2.loads(kv.get([HEAD_KEY])[0])
    head["v"] = 99
    kv.put({HEAD_KEY: cbor2.dumps(head)})
    with pytest.raises(StorageCorrupt, match="format version 99 is newer"):
        open_database(kv)


def test_head_record_round_trips() -> None:
    head = Head(txid=7, size=3 * 4096 + 5, compacted=3, base_pages=2)
    assert Head.decode(head.encode()) == head
    assert head.pages == 4
