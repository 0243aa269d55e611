"""The APSW VFS: SQLite's 4 KiB pages stored in an actor's KV namespace."""

from pagekv.vfs.database import Database, open_database
from pagekv.vfs.errors import DatabaseDead, SnapshotExpired, StorageCorrupt, caused_by_interrupt
from pagekv.vfs.format import FORMAT_VERSION, PAGE_SIZE
from pagekv.vfs.options import Options
from pagekv.vfs.page_store import PageStore

__all__ = [
    "FORMAT_VERSION",
    "PAGE_SIZE",
    "Database",
    "DatabaseDead",
    "Options",
    "PageStore",
    "SnapshotExpired",
    "StorageCorrupt",
    "caused_by_interrupt",
    "open_database",
]
