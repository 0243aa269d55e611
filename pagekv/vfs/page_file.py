"""The main database file's callbacks: SQLite's reads, writes and commits on a `PageStore`.

Every callback is short: translate, delegate, and turn our errors into SQLite's. The commit point
is `SQLITE_FCNTL_SYNC` (sent once per commit, even with `synchronous=OFF`); `xSync` commits too,
in case anything is still pending.

Compiled: SQLite calls these several times per commit and once per page read, and APSW reaches
them as plain method calls (`PageFile` needs no base class), so a compiled method saves an
interpreted frame on every one of them.
"""

from __future__ import annotations

from typing import Final

import apsw
from mypy_extensions import mypyc_attr

from pagekv.kv import KvError, StorageQuotaExceeded
from pagekv.vfs.errors import DatabaseDead, SnapshotExpired, StorageCorrupt
from pagekv.vfs.format import PAGE_SIZE
from pagekv.vfs.page_store import PageStore

MAIN_FILE: Final = "pagekv.db"
PINNED_PRAGMAS: Final = {
    "page_size": "4096",
    "journal_mode": "memory",
    "locking_mode": "exclusive",
    "temp_store": "memory",
}
_PRAGMA_SPELLINGS: Final = {"temp_store": {"2": "memory"}}
_FCNTL_SYNC: Final = apsw.SQLITE_FCNTL_SYNC
_FCNTL_COMMIT_PHASETWO: Final = apsw.SQLITE_FCNTL_COMMIT_PHASETWO
_FCNTL_PRAGMA: Final = apsw.SQLITE_FCNTL_PRAGMA
DEVICE_CHARACTERISTICS: Final = apsw.SQLITE_IOCAP_POWERSAFE_OVERWRITE
"""True of a KV-backed file (a crash never damages bytes outside a write: a commit lands whole or
not at all), and it makes SQLite treat the sector as 512 bytes instead of `xSectorSize`'s 4 KiB:
without it, every transaction's in-memory journal header is zeroed and copied at 4 KiB, about 7k of
a one-row commit's 77k instructions (benchmarks/HISTORY.md, "SQLite's journal header")."""


def _sqlite_error(store: PageStore, e: Exception) -> Exception:
    """The APSW exception SQLite should see for one of ours (APSW's own pass through).

    `isinstance`, not `match`: the build does not install apsw, and mypyc fails on a class
    pattern naming a class it cannot resolve."""
    if isinstance(e, apsw.Error):
        return e
    if isinstance(e, StorageQuotaExceeded):
        return apsw.FullError(f"pagekv: {e}")
    if isinstance(e, StorageCorrupt):
        store.health.last_error = e
        return apsw.CorruptError(f"pagekv: {e}")
    if isinstance(e, SnapshotExpired):
        store.health.last_error = e
        return apsw.IOError(f"pagekv: {e}")
    if isinstance(e, PermissionError):
        return apsw.ReadOnlyError(f"pagekv: {e}")
    if isinstance(e, KvError | DatabaseDead):
        if store.health.last_error is None:
            store.health.last_error = e
        return apsw.IOError(f"pagekv: {e}")
    return e


@mypyc_attr(allow_interpreted_subclasses=True)
class PageFile:
    """The main database file. SQLite calls it on one thread at a time. Tests subclass it to
    observe the calls."""

    def __init__(self, store: PageStore) -> None:
        self.store = store
        self.configuring = True

    def xRead(self, amount: int, offset: int) -> bytes:
        try:
            return self.store.read(amount, offset)
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xWrite(self, data: bytes, offset: int) -> None:
        try:
            self.store.write(data, offset)
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xTruncate(self, newsize: int) -> None:
        try:
            self.store.truncate(newsize)
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xSync(self, flags: int) -> None:
        try:
            self.store.sync()
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xFileSize(self) -> int:
        try:
            self.store.health.check_alive()
            return self.store.size
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xLock(self, level: int) -> None:
        try:
            self.store.health.check_alive()
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def xUnlock(self, level: int) -> None:
        pass

    def xCheckReservedLock(self) -> bool:
        return False

    def xFileControl(self, op: int, ptr: int) -> bool:
        try:
            if op == _FCNTL_SYNC:
                self.store.sync()
                return True
            if op == _FCNTL_COMMIT_PHASETWO:
                self.store.finish_commit()
                return True
            if op == _FCNTL_PRAGMA:
                return self._pragma(apsw.VFSFcntlPragma(ptr))
            return False
        except Exception as e:
            raise _sqlite_error(self.store, e) from e

    def _pragma(self, pragma: apsw.VFSFcntlPragma) -> bool:
        pinned = PINNED_PRAGMAS.get(pragma.name.lower())
        if pinned is None or pragma.value is None or self.configuring:
            return False
        value = pragma.value.strip().strip("'\"").lower()
        value = _PRAGMA_SPELLINGS.get(pragma.name.lower(), {}).get(value, value)
        if value != pinned:
            raise apsw.SQLError(
                f"pagekv pins PRAGMA {pragma.name.lower()} = {pinned.upper()}: the database lives "
                f"in a KV store, so {pragma.name} = {pragma.value} is not supported"
            )
        return False

    def xSectorSize(self) -> int:
        return PAGE_SIZE

    def xDeviceCharacteristics(self) -> int:
        return DEVICE_CHARACTERISTICS

    def xClose(self) -> None:
        pass
