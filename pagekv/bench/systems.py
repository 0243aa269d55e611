"""What a workload runs on: pagekv over a KV store, and native SQLite matched in durability.

A comparison is only fair if both sides promise the same thing. `file://` makes every commit durable
(fsynced before it returns), so its baselines are native SQLite with `synchronous=FULL` in the two
journal modes people actually run; `memory://` promises nothing across a crash, so its baselines
are native SQLite that skips every sync (`journal_mode=MEMORY, synchronous=OFF`,
`locking_mode=EXCLUSIVE`, on a file) and a pure `:memory:` database. Native files live next to the
store when it is a directory, so both sides share a disk.

Warm against warm: where a workload reuses its database (the commit workloads), every system's
database is one already in use, pagekv's on a store that every sample writes to and native's with
its WAL grown to the size SQLite's auto-checkpoint keeps (`Subject.warm_up`). A native database
created for the sample instead makes its WAL file grow while it is timed, which measured 1.5x
slower one-row commits on ext4; `native WAL+FULL fresh` shows that figure as a row of its own.

`--baseline` adds any other native system of `NATIVE_SYSTEMS` to a run, e.g. `wal-normal`, the
configuration many applications run, or `memory-off`, which is the exclusive baseline with SQLite's
ordinary locking (file locks and a change-counter write at every commit).

Concurrent writers (`SystemSpec.writers`): N databases of one system written at once by N threads,
pagekv's as N namespaces (N actors) of the one store, native's as N files in one directory.

Every system runs with `temp_store=MEMORY` and 4 KiB pages, as pagekv pins them.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import secrets
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import apsw

from pagekv.kv import OPS, ActorKv, FaultyKv, FileStore, FlushCounts, KvStats, KvStore, open_kv
from pagekv.vfs import Database, open_database

PAGE_SIZE = 4096

PAGEKV_COUNTERS = (
    "commits",
    "commits_fast",
    "commits_staged",
    "pages_committed",
    "stage_batches",
    "compactions",
    "pages_compacted",
    "compaction_bytes_written",
    "compaction_round_trips",
    "cache_hits",
    "cache_misses",
)
"""The `Database.metrics()` counters a sample records (summed over reopens)."""


@dataclass(frozen=True)
class SystemSpec:
    """One side of a comparison. `pragmas` run one per `execute`, in order, and are verified."""

    name: str
    label: str
    kind: str
    """"pagekv" or "native"."""
    pragmas: tuple[tuple[str, str], ...] = ()
    in_memory: bool = False
    """A `:memory:` database: it cannot be closed and reopened, so cold workloads skip it."""
    fresh: bool = False
    """A new database for every sample even where the workload reuses a warm one: the figure a
    benchmark that creates its database gets (a native WAL file then grows while timed)."""
    writers: int = 0
    """N > 0: N databases written at once by N threads (0: one database, no thread)."""

    @property
    def can_reopen(self) -> bool:
        return not self.in_memory

    @property
    def wal(self) -> bool:
        return ("journal_mode", "wal") in self.pragmas

    def with_writers(self, n: int) -> SystemSpec:
        """This system as `n` concurrent writers, named and labelled for it."""
        return dataclasses.replace(
            self, name=f"{self.name}-x{n}", label=f"{self.label} x{n}", writers=n
        )

    def settings(self) -> str:
        if self.kind == "pagekv":
            where = "pages in the KV store"
            if self.writers:
                where = f"{self.writers} databases (namespaces) on one store, a thread each"
            return f"journal_mode=MEMORY, locking_mode=EXCLUSIVE (pinned), {where}"
        where = " on :memory:" if self.in_memory else " on a file"
        if self.fresh:
            where = " on a new file every sample"
        elif self.writers:
            where = f" on {self.writers} files in one directory, a thread each"
        return ", ".join(f"{k}={v.upper()}" for k, v in self.pragmas) + where


_COMMON = (("page_size", "4096"), ("temp_store", "memory"))

PAGEKV = SystemSpec("pagekv", "pagekv", "pagekv")
NATIVE_DELETE_FULL = SystemSpec(
    "native-delete-full",
    "native DELETE+FULL",
    "native",
    (*_COMMON, ("journal_mode", "delete"), ("synchronous", "full")),
)
NATIVE_WAL_FULL = SystemSpec(
    "native-wal-full",
    "native WAL+FULL",
    "native",
    (*_COMMON, ("journal_mode", "wal"), ("synchronous", "full")),
)
NATIVE_MEMORY_OFF_EXCLUSIVE = SystemSpec(
    "native-memory-off-exclusive",
    "native MEMORY/OFF/EXCL",
    "native",
    (
        *_COMMON,
        ("locking_mode", "exclusive"),
        ("journal_mode", "memory"),
        ("synchronous", "off"),
    ),
)
NATIVE_WAL_FULL_FRESH = dataclasses.replace(
    NATIVE_WAL_FULL, name="native-wal-full-fresh", label="native WAL+FULL fresh", fresh=True
)
NATIVE_WAL_NORMAL = SystemSpec(
    "native-wal-normal",
    "native WAL+NORMAL",
    "native",
    (*_COMMON, ("journal_mode", "wal"), ("synchronous", "normal")),
)
NATIVE_MEMORY_OFF = SystemSpec(
    "native-memory-off",
    "native MEMORY/OFF",
    "native",
    (*_COMMON, ("journal_mode", "memory"), ("synchronous", "off")),
)
NATIVE_IN_MEMORY = SystemSpec(
    "native-in-memory",
    "native :memory:",
    "native",
    (("temp_store", "memory"),),
    in_memory=True,
)
NATIVE_SYSTEMS = {
    spec.name.removeprefix("native-"): spec
    for spec in (
        NATIVE_DELETE_FULL,
        NATIVE_WAL_FULL,
        NATIVE_WAL_FULL_FRESH,
        NATIVE_WAL_NORMAL,
        NATIVE_MEMORY_OFF,
        NATIVE_MEMORY_OFF_EXCLUSIVE,
        NATIVE_IN_MEMORY,
    )
}
"""Every native system by the name `--baseline` takes (`wal-normal` is `native-wal-normal`)."""
ALL_SYSTEMS = (PAGEKV, *NATIVE_SYSTEMS.values())

_READBACK = {
    "synchronous": {"off": "0", "normal": "1", "full": "2", "extra": "3"},
    "temp_store": {"memory": "2"},
}
"""How `PRAGMA name` reports a value that was set by name."""


def baselines_for(url: str, extra: Iterable[str] = ()) -> tuple[SystemSpec, ...]:
    """The native systems matched in durability with the store at `url`, then those named in
    `extra` (keys of `NATIVE_SYSTEMS`) that are not among them already."""
    matched: tuple[SystemSpec, ...]
    if urlsplit(url).scheme == "memory":
        matched = (NATIVE_MEMORY_OFF_EXCLUSIVE, NATIVE_IN_MEMORY)
    else:
        matched = (NATIVE_DELETE_FULL, NATIVE_WAL_FULL, NATIVE_WAL_FULL_FRESH)
    return tuple(dict.fromkeys((*matched, *(NATIVE_SYSTEMS[name] for name in extra))))


def open_native(spec: SystemSpec, path: str) -> apsw.Connection:
    """A native connection with `spec`'s pragmas applied one statement at a time and verified.

    One pragma per `execute`, each result fetched: APSW runs a multi-statement string lazily, so a
    pragma after one that returns a row would silently never run.
    """
    connection = apsw.Connection(path)
    try:
        for name, value in spec.pragmas:
            connection.execute(f"PRAGMA {name} = {value}").fetchall()
        for name, value in spec.pragmas:
            got = connection.execute(f"PRAGMA {name}").fetchall()
            actual = str(got[0][0]).lower() if got else ""
            want = _READBACK.get(name, {}).get(value, value)
            if actual != want:
                raise RuntimeError(f"{spec.label}: PRAGMA {name} is {actual!r}, wanted {want!r}")
    except BaseException:
        connection.close()
        raise
    return connection


class Subject(abc.ABC):
    """One database under test. Workloads use `connection` (the same APSW API on both sides)."""

    spec: SystemSpec
    connection: apsw.Connection

    def execute(self, sql: str, bindings: tuple[object, ...] | None = None) -> apsw.Cursor:
        return self.connection.execute(sql, bindings)

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection (storage stays); `open` brings it back cold."""

    @abc.abstractmethod
    def open(self) -> None: ...

    def reopen(self) -> None:
        self.close()
        self.open()

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close and delete the storage."""

    def kv_reset(self) -> KvStats | None:
        """KV traffic since the last call (None: not a KV-backed system)."""
        return None

    def counters(self) -> Counter[str]:
        """Cumulative VFS counters (see `PAGEKV_COUNTERS`); empty for native systems."""
        return Counter()

    def compact(self) -> None:  # noqa: B027 - deliberately a no-op for native SQLite
        """Fold deltas into base pages (pagekv only): how write amplification with compaction
        and the steady-state layout of an old database are measured."""

    def warm_up(self) -> None:  # noqa: B027 - a no-op but for native WAL
        """Make the database one already in use before it is timed. Only a native WAL has
        anything to grow; pagekv's pages go to a store every sample writes to, whose log is
        preallocated."""

    def wal_bytes(self) -> int | None:
        """The size of the native WAL file (None: not a native WAL database)."""
        return None


class PagekvSubject(Subject):
    """A pagekv database on one fresh namespace.

    KV traffic is read from `Database.metrics()`, i.e. from the `CountingKv` the page store already
    wraps around the namespace, not from a second `CountingKv` of our own: measured, a second
    counting layer adds ~5 µs to every commit (~7 % of a one-row commit on `memory://`), which
    would be charged to pagekv. The figures are summed over reopens.
    """

    def __init__(self, ns: ActorKv, latency_ms: float) -> None:
        self.spec = PAGEKV
        self._ns = ns
        self._kv: ActorKv = FaultyKv(ns, latency_ms=latency_ms) if latency_ms else ns
        self._closed: Counter[str] = Counter()
        self._mark: Counter[str] = Counter()
        self.db: Database | None = None
        self.open()

    def open(self) -> None:
        self.db = open_database(self._kv)
        self.connection = self.db.connection

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self._closed.update(_flatten(self.db.metrics()))
            self.db = None

    def counters(self) -> Counter[str]:
        total = Counter(self._closed)
        if self.db is not None:
            total.update(_flatten(self.db.metrics()))
        return total

    def kv_reset(self) -> KvStats:
        now = self.counters()
        delta = now - self._mark
        self._mark = now
        return KvStats(
            calls=[delta[_RT + op] for op in OPS],
            bytes_written=delta["kv_bytes_written"],
            bytes_read=delta["kv_bytes_read"],
        )

    def compact(self) -> None:
        assert self.db is not None
        self.db.compact()

    def destroy(self) -> None:
        self.close()
        self._ns.drop(fence=self._ns.takeover())


_RT = "round_trips:"


def _flatten(metrics: dict[str, object]) -> Counter[str]:
    """The cumulative figures of `Database.metrics()` as one flat counter."""
    flat: Counter[str] = Counter()
    for key in (*PAGEKV_COUNTERS, "kv_bytes_written", "kv_bytes_read"):
        value = metrics.get(key, 0)
        flat[key] = value if isinstance(value, int) else 0
    round_trips = metrics.get("round_trips", {})
    if isinstance(round_trips, dict):
        for op, n in round_trips.items():
            flat[_RT + op] = int(n)
    return flat


WARM_UP_PAGES = 1100
"""Pages a warm-up writes in one transaction: more than SQLite's auto-checkpoint threshold
(1,000 pages), so the WAL file reaches the size it keeps from then on, with room for the few
pages a commit adds past the threshold before the checkpoint."""


class NativeSubject(Subject):
    """A native SQLite database file (or `:memory:`) with the spec's pragmas."""

    def __init__(self, spec: SystemSpec, path: Path | None) -> None:
        self.spec = spec
        self.path = path
        self._open = False
        self.open()

    def open(self) -> None:
        self.connection = open_native(
            self.spec, ":memory:" if self.path is None else str(self.path)
        )
        self._open = True

    def close(self) -> None:
        if self.spec.in_memory:
            raise RuntimeError(":memory: cannot be closed and reopened")
        if self._open:
            self.connection.close()
            self._open = False

    def warm_up(self) -> None:
        """Grow the WAL as use does, in one transaction instead of a thousand commits: write
        `WARM_UP_PAGES` pages (the checkpoint after the commit backfills them, and the next
        write starts the WAL over), then drop them and VACUUM, so the database keeps no free
        pages that later inserts would fill instead of growing the file."""
        if not self.spec.wal:
            return
        execute = self.connection.execute
        execute("CREATE TABLE warm_up(v BLOB)")
        execute("BEGIN")
        self.connection.executemany(
            "INSERT INTO warm_up VALUES (?)", ((bytes(4000),) for _ in range(WARM_UP_PAGES))
        )
        execute("COMMIT")
        execute("DROP TABLE warm_up")
        execute("VACUUM")

    def wal_bytes(self) -> int | None:
        if not self.spec.wal or self.path is None:
            return None
        try:
            return os.path.getsize(f"{self.path}-wal")
        except FileNotFoundError:
            return 0

    def destroy(self) -> None:
        if self._open:
            self.connection.close()
            self._open = False
        if self.path is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f"{self.path}{suffix}")


class WriterGroup(Subject):
    """The databases of concurrent writers, one per thread: traffic and counters are their
    sums. A workload body reaches each through `members` (there is no one `connection`)."""

    def __init__(self, spec: SystemSpec, members: Sequence[Subject]) -> None:
        self.spec = spec
        self.members = list(members)

    def _each(self, method: str) -> None:
        for member in self.members:
            getattr(member, method)()

    def close(self) -> None:
        self._each("close")

    def open(self) -> None:
        self._each("open")

    def destroy(self) -> None:
        self._each("destroy")

    def compact(self) -> None:
        self._each("compact")

    def warm_up(self) -> None:
        self._each("warm_up")

    def kv_reset(self) -> KvStats | None:
        stats = [s for s in (m.kv_reset() for m in self.members) if s is not None]
        if not stats:
            return None
        return KvStats(
            calls=[sum(column) for column in zip(*(s.calls for s in stats), strict=True)],
            bytes_written=sum(s.bytes_written for s in stats),
            bytes_read=sum(s.bytes_read for s in stats),
        )

    def counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for member in self.members:
            total.update(member.counters())
        return total

    def wal_bytes(self) -> int | None:
        sizes = [m.wal_bytes() for m in self.members]
        return None if None in sizes else sum(s for s in sizes if s is not None)


class Workspace:
    """The store under test, a scratch directory for native files, and fresh names for both.

    Native files go next to the store when it is a directory (the same disk), else in a temporary
    directory. Everything created here is deleted by `close`, including the namespaces.
    """

    def __init__(self, url: str, latency_ms: float, scratch: Path | None = None) -> None:
        self.url = url
        self.latency_ms = latency_ms
        self.store: KvStore = open_kv(url)
        self.run_id = secrets.token_hex(4)
        parent = self.store.path if isinstance(self.store, FileStore) else scratch
        self.scratch = Path(tempfile.mkdtemp(prefix=f"bench-native-{self.run_id}-", dir=parent))
        self._count = 0

    def subject(self, spec: SystemSpec, tag: str) -> Subject:
        """A new database of `spec` (for concurrent writers, a group of them)."""
        if spec.writers:
            single = dataclasses.replace(spec, writers=0)
            members: list[Subject] = []
            try:
                for _ in range(spec.writers):
                    members.append(self.subject(single, tag))
            except BaseException:
                WriterGroup(spec, members).destroy()
                raise
            return WriterGroup(spec, members)
        self._count += 1
        name = f"{tag}-{self._count}"
        if spec.kind == "pagekv":
            ns = self.store.namespace(f"bench/{self.run_id}/{name}")
            return PagekvSubject(ns, self.latency_ms)
        path = None if spec.in_memory else self.scratch / f"{spec.name}-{name}.db"
        return NativeSubject(spec, path)

    @property
    def durable(self) -> bool:
        """Whether samples write to disk and sync (pagekv on a durable store, and its baselines):
        measured, a sample right after 64 writers' takes 2-8x as long while the kernel writes
        their pages back, so each such sample starts after `os.sync()`."""
        return urlsplit(self.url).scheme != "memory"

    def flush_counts(self) -> FlushCounts | None:
        """The store's durable writes and flushes so far (None: it keeps no such count)."""
        counts = getattr(self.store, "flush_counts", None)
        return counts() if counts is not None else None

    def filesystem(self) -> str:
        """The mount type under the scratch directory (e.g. ext4, tmpfs), best effort."""
        best, kind = "", "unknown"
        target = str(self.scratch.resolve())
        with contextlib.suppress(OSError):
            for line in Path("/proc/mounts").read_text().splitlines():
                fields = line.split()
                if len(fields) > 2 and target.startswith(fields[1]) and len(fields[1]) > len(best):
                    best, kind = fields[1], fields[2]
        return kind

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.store.close()
