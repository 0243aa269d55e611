"""The APSW VFS: the one file SQLite may open, the main database (`page_file.py`), and, for a
read-only snapshot given a budget, SQLite's own temp files.

One VFS object is registered per open database under a unique name, and it serves exactly one
file, the main database, to exactly one connection. Journals never reach it (the connection is
pinned to `journal_mode=MEMORY`). Temp files (sorts, temporary tables) stay in memory
(`temp_store=MEMORY`) unless the database is a snapshot opened with `temp_bytes`: its temp files
are the operating system's (SQLite's default VFS, in its temp directory, deleted at close),
together at most `temp_bytes` (`TempFilesFull` past it), so that a read-only query sorting more
than memory should hold spills to disk instead. Any other open is refused.
"""

from __future__ import annotations

import uuid

import apsw

from pagekv.vfs.page_file import MAIN_FILE, PageFile
from pagekv.vfs.page_store import PageStore


class TempFilesFull(apsw.FullError):
    """A read-only snapshot's temp files would pass their budget (`allowed` bytes)."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        super().__init__(f"pagekv: the query's temp files would pass {allowed} bytes")


class _TempBudget:
    """The bytes a snapshot's temp files hold together (each one's size while it is open)."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.used = 0
        self.refused: TempFilesFull | None = None
        """Set once a write was refused: SQLite reports only `SQLITE_FULL`."""

    def resize(self, before: int, after: int) -> None:
        if after > before and self.used + after - before > self.allowed:
            self.refused = TempFilesFull(self.allowed)
            raise self.refused
        self.used += after - before


class _TempFile(apsw.VFSFile):
    """One of SQLite's temp files, on the default VFS, whose growth the budget allows first."""

    def __init__(
        self, name: str | apsw.URIFilename | None, flags: list[int], budget: _TempBudget
    ) -> None:
        super().__init__("", name, flags)  # None: an anonymous temp file
        self.budget = budget
        self.size = 0

    def xWrite(self, data: bytes, offset: int) -> None:
        end = offset + len(data)
        if end > self.size:
            self.budget.resize(self.size, end)
            self.size = end
        super().xWrite(data, offset)

    def xTruncate(self, newsize: int) -> None:
        super().xTruncate(newsize)
        if newsize < self.size:
            self.budget.resize(self.size, newsize)
            self.size = newsize

    def xClose(self) -> None:
        self.budget.resize(self.size, 0)
        self.size = 0
        super().xClose()


class PageVfs(apsw.VFS):
    """Serves one database file; registered under a unique name for that database's lifetime.
    With `temp_bytes`, SQLite's temp files too, on disk, within that budget."""

    def __init__(self, store: PageStore, temp_bytes: int | None = None) -> None:
        self.vfs_name = f"pagekv-{uuid.uuid4().hex}"
        self.file = PageFile(store)
        self.opened = False
        self.temp_budget = None if temp_bytes is None else _TempBudget(temp_bytes)
        super().__init__(self.vfs_name, base="")

    def xOpen(  # type: ignore[override]  # APSW takes any object with VFSFile's methods
        self, name: str | apsw.URIFilename | None, flags: list[int]
    ) -> PageFile | apsw.VFSFile:
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        if filename is None and self.temp_budget is not None:
            return _TempFile(name, flags, self.temp_budget)
        if filename != MAIN_FILE or not flags[0] & apsw.SQLITE_OPEN_MAIN_DB:
            raise apsw.CantOpenError(
                f"pagekv: cannot open {filename!r}: a pagekv database is one file in the KV store; "
                "journals and temp files stay in memory, and ATTACH / VACUUM INTO are not supported"
            )
        if self.opened:
            raise apsw.CantOpenError(
                "pagekv: the database is already open: its one SQLite connection is "
                "Database.connection (a second one, or ATTACH of the same file, would not see its "
                "commits); open a read-only Database for a snapshot"
            )
        self.opened = True
        flags[1] = flags[0]
        return self.file

    def xAccess(self, pathname: str, flags: int) -> bool:
        return pathname == MAIN_FILE

    def xDelete(self, filename: str, syncdir: bool) -> None:
        if filename == MAIN_FILE:
            raise apsw.IOError("pagekv: the main database file cannot be deleted through SQLite")

    def xFullPathname(self, name: str) -> str:
        return name
