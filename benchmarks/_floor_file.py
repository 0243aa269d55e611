"""Two minimal APSW file classes that bound what any Python VFS can reach on one-row commits.

`commit_floor.py` compiles this module with mypyc when it can (pagekv's own hot path is compiled,
so the floor must be too) and drives SQLite through it beside native SQLite and pagekv.

- `NoopFile`: the commit moves the dirty pages into a dict. What APSW's callbacks into Python cost
  on their own, with nothing stored.
- `EssentialFile`: the commit does only what a fenced, checksummed, one-round-trip commit cannot
  skip: frame each dirty page with its CRC32C over `(txid, pgno, data)`, build the three entries
  (delta chunk, index part, head), check them against the KV limits and the fence, and put them in
  a dict standing in for the store. No page index, cache, metrics, staging or compaction. With
  `overwrite`, every commit reuses the same two keys, so the store's memory is recycled instead of
  growing (a bound on what compaction could win back).
"""

from __future__ import annotations

import struct
from typing import Final

from crc32c import crc32c

PAGE: Final = 4096
FCNTL_SYNC: Final = 21
FCNTL_COMMIT_PHASETWO: Final = 22
IOCAP_POWERSAFE_OVERWRITE: Final = 0x1000
_FRAME: Final = struct.Struct(">II")
_TXID_U32: Final = struct.Struct(">QI")
_GENERATION: Final = struct.Struct(">Q")
_HEAD: Final = struct.Struct(">BIQQQQI")
_MAX_KEY: Final = 2048
_MAX_VALUE: Final = 128 * 1024
_MAX_ENTRIES: Final = 128
_MAX_BATCH: Final = 976 * 1024


class NoopFile:
    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}
        self.dirty: dict[int, bytes] = {}
        self.size = 0

    def xRead(self, amount: int, offset: int) -> bytes:
        pgno = offset // PAGE + 1
        page = self.dirty.get(pgno)
        if page is None:
            page = self.pages.get(pgno)
        if page is None:
            return b""
        start = offset % PAGE
        return page if amount == PAGE and not start else page[start : start + amount]

    def xWrite(self, data: bytes, offset: int) -> None:
        self.dirty[offset // PAGE + 1] = data
        self.size = max(self.size, offset + len(data))

    def xTruncate(self, size: int) -> None:
        self.size = size

    def xSync(self, flags: int) -> None:
        pass

    def xFileSize(self) -> int:
        return self.size

    def xLock(self, level: int) -> None:
        pass

    def xUnlock(self, level: int) -> None:
        pass

    def xCheckReservedLock(self) -> bool:
        return False

    def commit(self) -> None:
        self.pages.update(self.dirty)
        self.dirty = {}

    def xFileControl(self, op: int, ptr: int) -> bool:
        if op == FCNTL_SYNC:
            self.commit()
            return True
        return op == FCNTL_COMMIT_PHASETWO

    def xSectorSize(self) -> int:
        return PAGE

    def xDeviceCharacteristics(self) -> int:
        return IOCAP_POWERSAFE_OVERWRITE

    def xClose(self) -> None:
        pass


class EssentialFile(NoopFile):
    def __init__(self, overwrite: bool) -> None:
        super().__init__()
        self.overwrite = overwrite
        self.store: dict[bytes, bytes] = {}
        self.txid = 0
        self.generation = 1
        self.store_generation = 1

    def commit(self) -> None:
        txid = self.txid + 1
        chunk = [b"\x01", _GENERATION.pack(self.generation)]
        index = [b"\x01"]
        for pgno, data in sorted(self.dirty.items()):
            crc = crc32c(data, crc32c(_TXID_U32.pack(txid, pgno)))
            chunk.append(_FRAME.pack(pgno, crc))
            chunk.append(data)
            index.append(_FRAME.pack(pgno, 0))
        key_txid = 0 if self.overwrite else txid
        puts = {
            b"\x01D" + _TXID_U32.pack(key_txid, 0): b"".join(chunk),
            b"\x01X" + _TXID_U32.pack(key_txid, 0): b"".join(index),
            b"\x01H": _HEAD.pack(2, PAGE, txid, self.size, 0, 0, 0),
        }
        payload = 0
        for key, value in puts.items():
            if len(key) > _MAX_KEY or len(value) > _MAX_VALUE:
                raise ValueError("entry over a limit")
            payload += len(key) + len(value)
        if len(puts) > _MAX_ENTRIES or payload > _MAX_BATCH:
            raise ValueError("batch over a limit")
        if self.generation != self.store_generation:
            raise ValueError("fenced")
        self.store.update(puts)
        super().commit()
        self.txid = txid
