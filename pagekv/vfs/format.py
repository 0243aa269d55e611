"""The on-KV format of one SQLite database (documented for people in `docs/FORMAT.md`).

All keys live under `PREFIX` in the actor's namespace; integers are big-endian so keys sort
numerically. Every stored page carries a CRC32C over `(txid, pgno, data)`, so a page read from the
wrong key, a wrong version or a torn value is detected rather than returned.

    PREFIX "H"                          head record (`Head.encode`)
    PREFIX "X" txid:u64 part:u32        index part: which pages each delta chunk of `txid` holds
    PREFIX "D" txid:u64 chunk:u32       delta chunk: the writer's generation, then framed pages
    PREFIX "B" pgno:u32                 base page: folded in by compaction, or written in place
    PREFIX "Y"                          preload hints: the pages to fetch at the next open

A commit's chunks and index parts are invisible until the head's `txid` reaches them; the head
move is the only visibility point.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import cbor2
from crc32c import crc32c

from pagekv.vfs.errors import StorageCorrupt

FORMAT_VERSION: Final = 3
PAGE_SIZE: Final = 4096
PREFIX: Final = b"\x01"
HEAD_KEY: Final = PREFIX + b"H"
_INDEX: Final = PREFIX + b"X"
_DELTA: Final = PREFIX + b"D"
_BASE: Final = PREFIX + b"B"
_VALUE_VERSION: Final = b"\x01"
_FRAME: Final = struct.Struct(">II")
_GENERATION: Final = struct.Struct(">Q")
FRAME_BYTES: Final = _FRAME.size + PAGE_SIZE
_BASE_VERSION: Final = 2
_BASE_HEADER: Final = struct.Struct(">BQQI")
"""value version (2), generation, txid, crc"""
_BASE_BYTES: Final = _BASE_HEADER.size + PAGE_SIZE
_BASE_HEADER_V1: Final = struct.Struct(">BQI")
"""value version (1), txid, crc: base pages written before format 3, with no generation"""
_BASE_BYTES_V1: Final = _BASE_HEADER_V1.size + PAGE_SIZE
_BASE_KEY: Final = struct.Struct(">2sI")
_INDEX_ENTRY: Final = struct.Struct(">II")
_HEAD: Final = struct.Struct(">BIQQQQI")
"""version, page_size, txid, size, compacted, base_pages, number of shrinks"""
_HEAD_VERSIONS: Final = (2, FORMAT_VERSION)
"""Heads of the same layout: version 3 only says that base pages may carry a generation."""
_SHRINK: Final = struct.Struct(">QII")
_PGNO: Final = struct.Struct(">I")
_TXID_U32: Final = struct.Struct(">QI")
"""txid and a page, chunk or part number: in keys and in the page CRC"""
_PACK_TXID_U32: Final = _TXID_U32.pack
_PACK_BASE_HEADER: Final = _BASE_HEADER.pack
_PACK_BASE_KEY: Final = _BASE_KEY.pack
_PACK_HEAD: Final = _HEAD.pack
"""Bound once: compiled, `_HEAD.pack(...)` looks the method up by name at every call, and a
commit packs several times."""
ZERO_PAGE: Final = bytes(PAGE_SIZE)
LOCK_BYTE_PAGE: Final = 0x40000000 // PAGE_SIZE + 1
"""SQLite's lock-byte page (the page holding offset 1 GiB); it is never written."""
MAX_TXID: Final = 2**64 - 1
COMPACT_SHRINKS: Final = 64
"""A head listing this many shrinks (16 bytes each) is compacted after its commit, whatever the
options say, so that the head stays a small value: it would otherwise grow with every shrinking
commit until it passed the value limit and the database died."""


def index_key(txid: int, part: int) -> bytes:
    return _INDEX + _TXID_U32.pack(txid, part)


def delta_key(txid: int, chunk: int) -> bytes:
    return _DELTA + _TXID_U32.pack(txid, chunk)


def base_key(pgno: int) -> bytes:
    return _PACK_BASE_KEY(_BASE, pgno)


def txid_bound(kind_key: bytes, txid: int) -> bytes:
    """The first key of `txid` in the index or delta range (`kind_key` is either prefix)."""
    return kind_key + struct.pack(">Q", txid)


INDEX_PREFIX: Final = _INDEX
DELTA_PREFIX: Final = _DELTA
INDEX_END: Final = PREFIX + b"Y"
HINTS_KEY: Final = INDEX_END
"""Just past the index parts, so one range read at open brings head, index and hints, and a
reader from before the hints (whose range ends at `INDEX_END`) never sees them."""
HINTS_END: Final = PREFIX + b"Z"
DELTA_END: Final = PREFIX + b"E"
BASE_END: Final = PREFIX + b"C"
VALUE_HEADER_BYTES: Final = len(_VALUE_VERSION)
CHUNK_HEADER_BYTES: Final = len(_VALUE_VERSION) + _GENERATION.size


def parse_txid_key(key: bytes) -> tuple[int, int]:
    """`(txid, part or chunk)` of an index or delta key (their prefixes are one length)."""
    return _TXID_U32.unpack_from(key, len(PREFIX) + 1)


def parse_base_key(key: bytes) -> int:
    pgno: int = _PGNO.unpack_from(key, len(_BASE))[0]
    return pgno


_ZERO_PREFIX: Final = bytes(_TXID_U32.size)
_ZERO_PREFIX_CRC: Final = crc32c(_ZERO_PREFIX)
_PREFIX_CRC_TABLE: Final = [
    crc32c(_ZERO_PREFIX[:i] + bytes([b]) + _ZERO_PREFIX[i + 1 :]) ^ _ZERO_PREFIX_CRC
    for i in range(_TXID_U32.size)
    for b in range(256)
]
"""CRC32C is affine in its input: for inputs of one length, crc(a ^ b) = crc(a) ^ crc(b) ^
crc(zeros). So the CRC of a `txid:u64 ‖ pgno:u32` prefix is crc(12 zero bytes) XOR one entry per
byte of the prefix: entry `256 * i + b` is crc(zeros with `b` at `i`) ^ crc(zeros), computed by
the library at import."""


def _word_crc(word: int, position: int) -> int:
    """The table entries of the four bytes of a 32-bit `word` at prefix byte `position`. A zero
    byte's entry is 0, and most of a prefix is zeros (a txid's top half, a pgno's top bytes), so
    a zero word costs one test."""
    if not word:
        return 0
    table = _PREFIX_CRC_TABLE
    base = 256 * position
    return (
        table[base + (word >> 24)]
        ^ table[base + 256 + (word >> 16 & 255)]
        ^ table[base + 512 + (word >> 8 & 255)]
        ^ table[base + 768 + (word & 255)]
    )


def page_crc(txid: int, pgno: int, data: bytes) -> int:
    """CRC32C of `txid:u64 ‖ pgno:u32 ‖ data` (0 <= txid < 2**64, 0 <= pgno < 2**32, as every
    key and header holding them is packed), without building that string: the prefix's CRC comes
    from the tables, in 32-bit words (small ints: compiled, plain machine arithmetic), and the
    library continues it over `data`. That saves a 4 KiB copy and a pack call a page."""
    crc = _ZERO_PREFIX_CRC ^ _word_crc(txid >> 32, 0) ^ _word_crc(txid & 0xFFFFFFFF, 4)
    return crc32c(data, crc ^ _word_crc(pgno, 8))


@dataclass(frozen=True, slots=True)
class Shrink:
    """The file shrank to `pages` during commit `txid`, after its first `after_part` parts."""

    txid: int
    after_part: int
    pages: int


@dataclass(slots=True, init=False)
class Head:
    """The commit pointer and what readers need to find pages.

    Invariants: `compacted <= txid`; deltas with `compacted < t <= txid` are live; base pages
    `1..base_pages` hold every page as of `compacted`; `shrinks` lists the truncations of live
    deltas in commit order (each hides older versions of the pages above it).

    Treated as immutable (a commit makes a new one). One is made per commit, so `__init__` is
    written out, as `WriteBatch`'s is, and frozen would need `object.__setattr__` in it.
    """

    txid: int
    size: int
    compacted: int
    base_pages: int
    shrinks: tuple[Shrink, ...]

    def __init__(
        self,
        txid: int = 0,
        size: int = 0,
        compacted: int = 0,
        base_pages: int = 0,
        shrinks: tuple[Shrink, ...] = (),
    ) -> None:
        self.txid = txid
        self.size = size
        self.compacted = compacted
        self.base_pages = base_pages
        self.shrinks = shrinks

    @property
    def pages(self) -> int:
        return -(-self.size // PAGE_SIZE)

    def encode(self) -> bytes:
        head = _PACK_HEAD(
            FORMAT_VERSION,
            PAGE_SIZE,
            self.txid,
            self.size,
            self.compacted,
            self.base_pages,
            len(self.shrinks),
        )
        if not self.shrinks:
            return head
        return head + b"".join([_SHRINK.pack(s.txid, s.after_part, s.pages) for s in self.shrinks])

    @classmethod
    def decode(cls, raw: bytes) -> Head:
        """Read a head of this version, of version 2 (the same layout) or of version 1 (CBOR,
        told apart by its first byte)."""
        version = raw[0] if raw else None
        if version is not None and 0xA0 <= version <= 0xBF:  # a CBOR map: version 1
            return cls._decode_v1(raw)
        if version is not None and version > FORMAT_VERSION:
            raise _newer(version)
        if version not in _HEAD_VERSIONS or len(raw) < _HEAD.size:
            raise StorageCorrupt(f"unreadable head record ({len(raw)} bytes, version {version})")
        _, page_size, txid, size, compacted, base_pages, n_shrinks = _HEAD.unpack_from(raw)
        if len(raw) != _HEAD.size + n_shrinks * _SHRINK.size:
            raise StorageCorrupt(f"head record of {len(raw)} bytes for {n_shrinks} shrinks")
        _check_page_size(page_size)
        shrinks = tuple(Shrink(*s) for s in _SHRINK.iter_unpack(raw[_HEAD.size :]))
        return cls(txid, size, compacted, base_pages, shrinks)

    @classmethod
    def _decode_v1(cls, raw: bytes) -> Head:
        try:
            d = cbor2.loads(raw)
            version = d["v"]
        except (cbor2.CBORDecodeError, KeyError, TypeError) as e:
            raise StorageCorrupt(f"unreadable head record: {e}") from e
        if version != 1:
            raise _newer(version) if version > 1 else StorageCorrupt(f"head version {version}")
        _check_page_size(d["page_size"])
        return cls(
            txid=d["txid"],
            size=d["size"],
            compacted=d["compacted"],
            base_pages=d["base_pages"],
            shrinks=tuple(Shrink(*s) for s in d["shrinks"]),
        )


def _newer(version: int) -> StorageCorrupt:
    return StorageCorrupt(
        f"database format version {version} is newer than this pagekv reads "
        f"({FORMAT_VERSION}); upgrade pagekv"
    )


def _check_page_size(page_size: int) -> None:
    if page_size != PAGE_SIZE:
        raise StorageCorrupt(f"stored page size {page_size} is not {PAGE_SIZE}")


@dataclass(slots=True, init=False)
class Chunk:
    """A decoded delta chunk: the generation that wrote it and its pages. One is made per chunk
    read, so `__init__` is written out, as `WriteBatch`'s is."""

    generation: int
    pages: dict[int, bytes]

    def __init__(self, generation: int, pages: dict[int, bytes]) -> None:
        self.generation = generation
        self.pages = pages


def encode_chunk(generation: int, txid: int, pages: list[tuple[int, bytes]]) -> bytes:
    out = [_VALUE_VERSION, _GENERATION.pack(generation)]
    for pgno, data in pages:
        out.append(_FRAME.pack(pgno, page_crc(txid, pgno, data)))
        out.append(data)
    return b"".join(out)


def decode_chunk(txid: int, raw: bytes) -> Chunk:
    start = 1 + _GENERATION.size
    if raw[:1] != _VALUE_VERSION or len(raw) < start or (len(raw) - start) % FRAME_BYTES:
        raise StorageCorrupt(f"malformed delta chunk of txid {txid} ({len(raw)} bytes)")
    (generation,) = _GENERATION.unpack_from(raw, 1)
    pages: dict[int, bytes] = {}
    for off in range(start, len(raw), FRAME_BYTES):
        pgno, crc = _FRAME.unpack_from(raw, off)
        data = raw[off + _FRAME.size : off + FRAME_BYTES]
        if page_crc(txid, pgno, data) != crc:
            raise StorageCorrupt(f"CRC mismatch in page {pgno} of txid {txid}")
        pages[pgno] = data
    return Chunk(generation, pages)


def encode_base(generation: int, txid: int, pgno: int, data: bytes) -> bytes:
    return _PACK_BASE_HEADER(_BASE_VERSION, generation, txid, page_crc(txid, pgno, data)) + data


def decode_base(pgno: int, raw: bytes) -> tuple[int, int, bytes]:
    """Return `(generation that wrote it, txid the version came from, page data)`; a page from
    before format 3 reports generation 0."""
    if len(raw) == _BASE_BYTES and raw[0] == _BASE_VERSION:
        _, generation, txid, crc = _BASE_HEADER.unpack_from(raw)
    elif len(raw) == _BASE_BYTES_V1 and raw[0] == _VALUE_VERSION[0]:
        generation = 0
        _, txid, crc = _BASE_HEADER_V1.unpack_from(raw)
    else:
        raise StorageCorrupt(f"malformed base page {pgno} ({len(raw)} bytes)")
    data = raw[len(raw) - PAGE_SIZE :]
    if page_crc(txid, pgno, data) != crc:
        raise StorageCorrupt(f"CRC mismatch in base page {pgno}")
    return generation, txid, data


def restamp(key: bytes, value: bytes, generation: int) -> bytes:
    """`value` (stored at `key`) as a writer of `generation` would have written it: the
    generation of a delta chunk or of a base page of format 3 replaced, any other value as it
    is. For a copy of a namespace into another store, whose writer has a generation of its
    own: a reader refuses a value of a generation later than its own. No CRC covers it."""
    if key.startswith(_DELTA):
        stamped = len(value) >= CHUNK_HEADER_BYTES and value[:1] == _VALUE_VERSION
    else:
        stamped = key.startswith(_BASE) and len(value) == _BASE_BYTES and value[0] == _BASE_VERSION
    if not stamped:
        return value
    return value[:1] + _GENERATION.pack(generation) + value[CHUNK_HEADER_BYTES:]


def encode_index(entries: list[tuple[int, int]]) -> bytes:
    return _VALUE_VERSION + b"".join([_INDEX_ENTRY.pack(p, c) for p, c in entries])


def decode_index(raw: bytes) -> list[tuple[int, int]]:
    if raw[:1] != _VALUE_VERSION or (len(raw) - 1) % _INDEX_ENTRY.size:
        raise StorageCorrupt(f"malformed index part ({len(raw)} bytes)")
    return list(_INDEX_ENTRY.iter_unpack(raw[1:]))


DELTA_KEY_BYTES: Final = len(delta_key(0, 0))
INDEX_KEY_BYTES: Final = len(index_key(0, 0))
INDEX_ENTRY_BYTES: Final = _INDEX_ENTRY.size


def encode_hints(pages: tuple[int, ...]) -> bytes:
    return _VALUE_VERSION + b"".join([_PGNO.pack(p) for p in pages])


def decode_hints(raw: bytes) -> tuple[int, ...]:
    if raw[:1] != _VALUE_VERSION or (len(raw) - 1) % _PGNO.size:
        raise StorageCorrupt(f"malformed preload hints ({len(raw)} bytes)")
    return tuple(p for (p,) in _PGNO.iter_unpack(raw[1:]))
