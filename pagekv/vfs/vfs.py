"""The APSW VFS: the one file SQLite may open, the main database (`file.py`).

One VFS object is registered per open database under a unique name, and it serves exactly one
file, the main database, to exactly one connection. Journals and temp files never reach it: the
connection is pinned to `journal_mode=MEMORY` and `temp_store=MEMORY`, and any other open is
refused.
"""

from __future__ import annotations

import uuid

import apsw

from pagekv.vfs.file import MAIN_FILE, PageFile
from pagekv.vfs.pages import PageStore


class PageVfs(apsw.VFS):
    """Serves one database file; registered under a unique name for that database's lifetime."""

    def __init__(self, store: PageStore) -> None:
        self.vfs_name = f"pagekv-{uuid.uuid4().hex}"
        self.file = PageFile(store)
        self.opened = False
        super().__init__(self.vfs_name, base="")

    def xOpen(  # type: ignore[override]  # APSW takes any object with VFSFile's methods
        self, name: str | apsw.URIFilename | None, flags: list[int]
    ) -> PageFile:
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
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
