"""Stored-page integrity: CRCs are checked, missing pages are errors, newer formats are refused."""

from __future__ import annotations

import struct
from collections.abc import Callable

import apsw
import cbor2
import pytest
from crc32c import crc32c
from hypothesis import example, given
from hypothesis import strategies as st

from pagekv.kv import ActorKv, MemoryStore
from pagekv.vfs import StorageCorrupt, open_database
from pagekv.vfs.format import (
    BASE_END,
    DELTA_END,
    DELTA_PREFIX,
    FORMAT_VERSION,
    HEAD_KEY,
    HINTS_KEY,
    INDEX_END,
    PREFIX,
    Head,
    Shrink,
    decode_base,
    decode_hints,
    encode_base,
    encode_hints,
    page_crc,
)
from pagekv.vfs.page_store import PageStore

BASE_PREFIX = PREFIX + b"B"


def _database(compacted: bool) -> ActorKv:
    kv = MemoryStore().namespace("t")
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
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


def _as_version_1(head: Head) -> bytes:
    """`head` as format version 1 stored it: a CBOR map."""
    return cbor2.dumps(
        {
            "v": 1,
            "page_size": 4096,
            "txid": head.txid,
            "size": head.size,
            "compacted": head.compacted,
            "base_pages": head.base_pages,
            "shrinks": [[s.txid, s.after_part, s.pages] for s in head.shrinks],
        }
    )


def _head(kv: ActorKv) -> bytes:
    raw = kv.get([HEAD_KEY])[0]
    assert raw is not None
    return raw


def _struct_version_99(raw: bytes) -> bytes:
    return bytes([99]) + raw[1:]


def _cbor_version_99(raw: bytes) -> bytes:
    d = cbor2.loads(_as_version_1(Head.decode(raw)))
    d["v"] = 99
    return cbor2.dumps(d)


@pytest.mark.parametrize("newer", [_struct_version_99, _cbor_version_99])
def test_a_newer_format_is_refused_with_a_clear_error(newer: Callable[[bytes], bytes]) -> None:
    kv = _database(compacted=False)
    kv.put({HEAD_KEY: newer(_head(kv))})
    with pytest.raises(StorageCorrupt, match="format version 99 is newer"):
        open_database(kv)


def test_a_version_1_database_opens_and_its_next_commit_writes_the_current_format() -> None:
    """Format 1 stored the head as CBOR; a reader of format 2 reads it, shrinks included."""
    kv = MemoryStore().namespace("t")
    with open_database(kv, auto_compact=False, in_place_commits=False) as db:
        db.execute("CREATE TABLE t(v BLOB)")
        db.execute("INSERT INTO t VALUES (randomblob(100000)), (randomblob(10))")
        db.execute("DELETE FROM t WHERE length(v) > 10")
        db.execute("VACUUM")  # shrinks the file: the head lists a shrink
        expected = db.execute("SELECT v FROM t").fetchall()
    head = Head.decode(_head(kv))
    assert head.shrinks, "the database must exercise the shrink list"
    kv.put({HEAD_KEY: _as_version_1(head)})
    with open_database(kv) as db:
        assert db.execute("SELECT v FROM t").fetchall() == expected
        assert db.execute("PRAGMA integrity_check").get == "ok"
        assert _head(kv)[0] == 0xA7, "opening alone must not rewrite the head"
        db.execute("INSERT INTO t VALUES (x'01')")
    assert _head(kv)[0] == FORMAT_VERSION
    assert Head.decode(_head(kv)).shrinks == head.shrinks
    with open_database(kv) as db:
        assert db.execute("SELECT v FROM t").fetchall() == [*expected, (b"\x01",)]


@pytest.mark.parametrize(
    "raw", [b"", b"\x00" * 49, bytes([FORMAT_VERSION]) + bytes(10), b"\xa7garbage"]
)
def test_an_unreadable_head_is_corrupt(raw: bytes) -> None:
    with pytest.raises(StorageCorrupt):
        Head.decode(raw)


@given(
    txid=st.integers(0, 2**64 - 1),
    pgno=st.integers(0, 2**32 - 1),
    data=st.binary(max_size=64) | st.binary(min_size=4096, max_size=4096),
)
@example(txid=0, pgno=0, data=b"")
@example(txid=2**64 - 1, pgno=2**32 - 1, data=bytes(4096))
@example(txid=2**32, pgno=1, data=b"\xff" * 4096)
def test_the_page_crc_is_crc32c_of_txid_pgno_and_page(txid: int, pgno: int, data: bytes) -> None:
    """The format's definition (docs/FORMAT.md), against the table-driven prefix CRC."""
    assert page_crc(txid, pgno, data) == crc32c(struct.pack(">QI", txid, pgno) + data)


def test_a_base_page_value_is_its_header_and_the_page() -> None:
    page = bytes(range(256)) * 16
    value = encode_base(9, 7, 3, page)
    crc = crc32c(struct.pack(">QI", 7, 3) + page)
    assert value == struct.pack(">BQQI", 2, 9, 7, crc) + page
    assert decode_base(3, value) == (9, 7, page)
    assert decode_base(3, struct.pack(">BQI", 1, 7, crc) + page) == (0, 7, page)  # format 2
    for bad in (value[:-1], b"\x03" + value[1:], struct.pack(">BQI", 2, 7, crc) + page):
        with pytest.raises(StorageCorrupt, match="malformed base page 3"):
            decode_base(3, bad)


def test_a_version_2_head_is_read() -> None:
    """Format 3 changed only base pages; a head written by format 2 has the same layout."""
    head = Head(txid=7, size=3 * 4096 + 5, compacted=3, base_pages=2)
    assert Head.decode(b"\x02" + head.encode()[1:]) == head


def test_head_record_round_trips() -> None:
    shrinks = (Shrink(5, 0, 3), Shrink(6, 2, 1))
    for head in (
        Head(txid=7, size=3 * 4096 + 5, compacted=3, base_pages=2),
        Head(txid=2**64 - 1, size=2**40, compacted=4, base_pages=9, shrinks=shrinks),
    ):
        assert Head.decode(head.encode()) == head
    assert Head(size=3 * 4096 + 5).pages == 4


def test_preload_hints_round_trip_and_sit_past_the_index() -> None:
    """Past `INDEX_END`, so a pagekv from before the hints, whose open reads the head and the
    index up to it, never sees them."""
    pages = (2, 4096, 2**32 - 1)
    assert decode_hints(encode_hints(pages)) == pages
    assert decode_hints(encode_hints(())) == ()
    assert HINTS_KEY >= INDEX_END


@pytest.mark.parametrize("raw", [b"", b"\x01\x00\x00\x01", b"\x02\x00\x00\x00\x01"])
def test_malformed_preload_hints_are_corrupt(raw: bytes) -> None:
    with pytest.raises(StorageCorrupt, match="preload hints"):
        decode_hints(raw)
