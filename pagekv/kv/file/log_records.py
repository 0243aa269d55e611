"""The bodies of the `file://` store's log records: what one write, range delete, takeover or
namespace creation says.

Hand-packed with `struct` rather than CBOR: encoding is on every durable write, and with
`cbor2.dumps` a one-entry write took 4 µs more (`benchmarks/HISTORY.md`, "The current `file://`
engine").
Writers encode straight from their arguments; only replays decode into `Record`s.
Integers are little-endian; `ns` is the namespace's row id in the base.

- WRITE: `op:u8 ns:u64 puts:u32 deletes:u32`, then per put `klen:u16 vlen:u32 key value`, then
  per delete `klen:u16 key`;
- RANGE: `op:u8 ns:u64 refund:u64 slen:u16 elen:u16 start end` (`elen = 0xFFFF`: no end);
- TAKEOVER: `op:u8 ns:u64 generation:u64`;
- CREATE: `op:u8 ns:u64 nlen:u16 name` (UTF-8): a new namespace, generation 0 and empty, with
  the row id `ns`, which the fold gives its row in the base.

`refund` is the exact number of bytes the range delete removed from the namespace's usage, so
replaying the record never needs the base.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final, assert_never

_WRITE: Final = struct.Struct("<BQII")
_PUT: Final = struct.Struct("<HI")
_KEY: Final = struct.Struct("<H")
_RANGE: Final = struct.Struct("<BQQHH")
_TAKEOVER: Final = struct.Struct("<BQQ")
_CREATE: Final = struct.Struct("<BQH")
_NO_END: Final = 0xFFFF
MAX_KEY_BYTES: Final = _NO_END - 1
"""The longest key a record can hold: lengths are u16, and `_NO_END` is taken."""
MAX_NAME_BYTES: Final = 0xFFFF
"""The longest namespace name (UTF-8) a record can hold."""


class Op(enum.IntEnum):
    WRITE = 0
    RANGE = 1
    TAKEOVER = 2
    CREATE = 3


@dataclass(frozen=True, slots=True)
class Write:
    ns: int
    puts: Collection[tuple[bytes, bytes]]
    deletes: Collection[bytes]


@dataclass(frozen=True, slots=True)
class Range:
    ns: int
    start: bytes
    end: bytes | None
    refund: int


@dataclass(frozen=True, slots=True)
class Takeover:
    ns: int
    generation: int


@dataclass(frozen=True, slots=True)
class Create:
    ns: int
    name: str


Record = Write | Range | Takeover | Create
_OPS: Final = {op.value: op for op in Op}


def encode_write(ns: int, puts: dict[bytes, bytes], deletes: Collection[bytes]) -> bytes:
    parts = [_WRITE.pack(Op.WRITE, ns, len(puts), len(deletes))]
    for key, value in puts.items():
        parts.append(_PUT.pack(len(key), len(value)))
        parts.append(key)
        parts.append(value)
    for key in deletes:
        parts.append(_KEY.pack(len(key)))
        parts.append(key)
    return b"".join(parts)


def encode_range(ns: int, start: bytes, end: bytes | None, refund: int) -> bytes:
    elen = _NO_END if end is None else len(end)
    return _RANGE.pack(Op.RANGE, ns, refund, len(start), elen) + start + (end or b"")


def encode_takeover(ns: int, generation: int) -> bytes:
    return _TAKEOVER.pack(Op.TAKEOVER, ns, generation)


def encode_create(ns: int, name: str) -> bytes:
    raw = name.encode()
    return _CREATE.pack(Op.CREATE, ns, len(raw)) + raw


def decode(body: bytes) -> Record:
    """The record a body encodes; raises ValueError on a body no encoder wrote."""
    op = _OPS.get(body[0])  # not `Op(...)`: that call alone was 15 % of replaying a log
    if op is None:
        raise ValueError(f"unknown log record op {body[0]}")
    match op:
        case Op.WRITE:
            _, ns, n_puts, n_deletes = _WRITE.unpack_from(body)
            at = _WRITE.size
            puts = []
            for _ in range(n_puts):
                klen, vlen = _PUT.unpack_from(body, at)
                at += _PUT.size
                puts.append((body[at : at + klen], body[at + klen : at + klen + vlen]))
                at += klen + vlen
            deletes = []
            for _ in range(n_deletes):
                (klen,) = _KEY.unpack_from(body, at)
                at += _KEY.size
                deletes.append(body[at : at + klen])
                at += klen
            record: Record = Write(ns, puts, deletes)
        case Op.RANGE:
            _, ns, refund, slen, elen = _RANGE.unpack_from(body)
            at = _RANGE.size + slen
            start = body[_RANGE.size : at]
            end = None if elen == _NO_END else body[at : at + elen]
            at += 0 if end is None else elen
            record = Range(ns, start, end, refund)
        case Op.TAKEOVER:
            _, ns, generation = _TAKEOVER.unpack_from(body)
            at = _TAKEOVER.size
            record = Takeover(ns, generation)
        case Op.CREATE:
            _, ns, nlen = _CREATE.unpack_from(body)
            at = _CREATE.size + nlen
            record = Create(ns, body[_CREATE.size : at].decode())
        case unreachable:
            assert_never(unreachable)
    if at != len(body):
        raise ValueError(f"log record of {len(body)} bytes has {len(body) - at} stray bytes")
    return record
