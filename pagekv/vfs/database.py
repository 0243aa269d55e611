"""`open_database`: an APSW connection whose pages live in an actor's KV namespace."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Final

import apsw

from pagekv.kv import ACTOR_KV_METHODS, ActorKv, KvIndeterminate
from pagekv.vfs.options import Options, check_options
from pagekv.vfs.page_file import MAIN_FILE, PINNED_PRAGMAS
from pagekv.vfs.page_store import PageStore
from pagekv.vfs.page_vfs import PageVfs, TempFilesFull

SPILL_CACHE_KIB: Final = 16384
"""The page cache of a snapshot that sorts on disk, which is also the size of each sorted run
SQLite writes: merging the runs holds a buffer of a row for each, so runs of 16 MiB keep both
the runs (300 of 1 MiB rows: 160 MiB at SQLite's default 2 MiB runs, 38 MiB at 16 MiB) and the
cache small (benchmarks/RESULTS.md, inspector)."""


class Database:
    """One open database. Use it from one thread at a time (as any SQLite connection)."""

    def __init__(self, store: PageStore, vfs: PageVfs, connection: apsw.Connection) -> None:
        self._store = store
        self._vfs = vfs
        self.connection = connection
        self._closed = False

    @property
    def generation(self) -> int:
        return self._store.generation

    @property
    def is_dead(self) -> bool:
        return self._store.health.dead is not None

    @property
    def read_only(self) -> bool:
        return self._store.read_only

    @property
    def commits(self) -> int:
        """Commits made durable since the open: a caller that sees it grow knows it wrote."""
        return self._store.counters.commits

    @property
    def outcome_unknown(self) -> bool:
        """Dead after a write whose outcome is unknown (`KvIndeterminate`): it may or may not
        have been applied, which only a reopen tells."""
        return isinstance(self._store.health.dead, KvIndeterminate)

    def execute(self, sql: str, bindings: Any = None) -> apsw.Cursor:
        """Run SQL; on a dead database fail like the VFS does, without reaching SQLite."""
        if self._store.health.dead is not None:
            raise apsw.IOError(
                f"pagekv: {self._store.health.dead_error()}"
            ) from self._store.health.dead
        return self.connection.execute(sql, bindings)

    @property
    def temp_files_full(self) -> TempFilesFull | None:
        """Why a statement failed with `SQLITE_FULL` if its temp files would have passed their
        budget (`temp_bytes`); None while none has."""
        budget = self._vfs.temp_budget
        return None if budget is None else budget.refused

    def take_last_kv_error(self) -> BaseException | None:
        """The original exception behind the last storage failure (cleared by reading it)."""
        return self._store.take_last_error()

    def metrics(self) -> dict[str, object]:
        return self._store.metrics()

    def compact(self) -> int:
        """Fold all deltas into base pages now; returns the number of pages written."""
        if self._closed:
            raise apsw.ConnectionClosedError("pagekv: the database is closed; reopen it to compact")
        return self._store.compact()

    def close(self) -> None:
        """Close the connection (a pending transaction is rolled back, never committed) and save
        the preload hints if they changed. After it nothing writes to the namespace; closing
        again does nothing."""
        self._closed = True
        try:
            self.connection.close(True)
            self._store.save_hints()
        finally:
            self._vfs.unregister()

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_database(
    kv: ActorKv,
    *,
    read_only: bool = False,
    temp_bytes: int | None = None,
    **options: Any,
) -> Database:
    """Take over `kv` (unless `read_only`), recover, preload page 1 and the hinted pages, and
    open SQLite on it.

    `kv` may be any object with the `ActorKv` methods. A read-only database is a consistent
    snapshot that never writes and never takes over; it is meant for inspection beside a writer.
    `options` are the fields of `Options` (cache size, staging and compaction thresholds).

    `temp_bytes` (read-only only): SQLite sorts and builds temporary tables in temp files on
    disk, together at most that many bytes (past it the statement fails with `SQLITE_FULL` and
    `Database.temp_files_full` says why), in runs of `SPILL_CACHE_KIB`: what a query sorts is
    bounded by the disk, not memory. Without it they stay in memory, as a writer's must.
    """
    missing = [name for name in ACTOR_KV_METHODS if not hasattr(kv, name)]
    if missing:
        raise TypeError(
            f"open_database needs an object with the ActorKv methods; "
            f"{type(kv).__name__} lacks {', '.join(missing)}"
        )
    check_options(options)
    if temp_bytes is not None and (not read_only or temp_bytes < 1):
        raise ValueError(
            f"temp_bytes ({temp_bytes}) is for a read-only snapshot, and at least 1: a writer's "
            "temp files stay in memory"
        )
    store = PageStore(kv, read_only=read_only, options=Options(**options))
    vfs = PageVfs(store, temp_bytes)
    flags = (
        apsw.SQLITE_OPEN_READONLY
        if read_only
        else (apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    )
    try:
        connection = apsw.Connection(MAIN_FILE, flags=flags, vfs=vfs.vfs_name)
        for name, value in PINNED_PRAGMAS.items():
            connection.execute(f"PRAGMA {name} = {value}")
        # Durability is the KV write at SQLITE_FCNTL_SYNC, which SQLite sends at every commit
        # whatever this setting; OFF only spares the xSync callback that would follow it.
        connection.execute("PRAGMA synchronous = OFF")
        if temp_bytes is not None:
            connection.execute("PRAGMA temp_store = FILE")
            connection.execute(f"PRAGMA cache_size = -{SPILL_CACHE_KIB}")
        vfs.file.configuring = False
    except BaseException:
        vfs.unregister()
        raise
    return Database(store, vfs, connection)
