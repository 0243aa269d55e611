"""The benchmark workloads: one definition each, shared by `pagekv bench` and the pytest suite.

A workload is four small functions on a `Subject` (the same APSW connection API for pagekv and
for native SQLite): `setup` builds its schema and data (untimed), `inputs` makes the data one
sample consumes (untimed, from a seed that depends only on the workload and the repetition, so
every system of a repetition gets the same bytes), and `body` is the timed part, returning how many
operations it did. `prepare` says what happens to the database before each sample: a fresh one,
the same one (warm: in use before the first sample), the same one reopened cold, or closed so that
the body's own open is timed. The commit workloads are warm, as a database in use is; the one-shot
ones (a blob or a 10,000-row insert into a new table, an index creation) get a fresh database.

`writers` makes the concurrent workload: its body runs N threads at once, each committing on a
database of its own (`WriterGroup`), and its rows are each system at every writer count.

Data is pseudorandom (`random.Random(seed).randbytes`): patterned data compresses and flatters.
"""

from __future__ import annotations

import enum
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pagekv.bench.systems import Subject, WriterGroup

KiB = 1024
MiB = 1024 * KiB
ROW_BYTES = 100
"""Payload of a small row."""
PAGE_ROW_BYTES = 4000
"""Payload of a row that fills one 4 KiB leaf page on its own (so N rows ≈ N pages)."""


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. `full()` is the size the targets are set for; `quick()` shrinks
    the slow ones so a whole run on `memory://` fits in about a minute on a 2-core machine."""

    commits_1: int = 2000
    commits_100: int = 100
    rows_per_commit: int = 100
    hot_updates: int = 100
    insert_rows: int = 10_000
    cold_read_pages: int = 100
    cold_table_pages: int = 1024
    scan_mib: int = 50
    oltp_rows: int = 10_000
    oltp_ops: int = 2000
    index_rows: int = 10_000
    wake_small_mib: int = 1
    wake_big_mib: int = 100
    build_txn_rows: int = 2560
    """Rows per transaction when filling the big tables (10 MiB per commit)."""
    writer_commits: int = 200
    """One-row commits per writer of the concurrent workload (64 writers: 12,800 a sample)."""

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            commits_1=300,
            commits_100=30,
            oltp_ops=500,
            scan_mib=8,
            wake_big_mib=16,
            writer_commits=40,
        )

    def for_latency(self, latency_ms: float) -> Sizes:
        """Fewer commits when every round trip sleeps: 1,000 commits at 20 ms would take 20 s a
        sample without telling anything that 50 don't."""
        if not latency_ms:
            return self
        return replace(
            self,
            commits_1=min(self.commits_1, 50),
            commits_100=min(self.commits_100, 20),
            oltp_ops=min(self.oltp_ops, 200),
            writer_commits=min(self.writer_commits, 20),
        )


class Prepare(enum.Enum):
    """What the runner does to a system's database before each sample (never timed)."""

    FRESH = "fresh"
    """A new, empty database per sample, `setup` run on it."""
    REUSE = "reuse"
    """One database per system, built once by `setup`, used as it is."""
    WARM = "warm"
    """As REUSE, in use before it is built (`Subject.warm_up`: a native WAL at its full size).
    A system marked `fresh` gets a new database per sample instead."""
    COLD = "cold"
    """As REUSE, but closed and reopened before each sample: the body starts with cold caches."""
    CLOSED = "closed"
    """As REUSE, but closed before each sample: the body opens it (the open is what is timed)."""


@dataclass(frozen=True)
class Workload:
    name: str
    describe: Callable[[Sizes], str]
    unit: str
    """What one operation is (per-op figures divide by the body's return value)."""
    setup: Callable[[Subject, Sizes], None]
    inputs: Callable[[Sizes, random.Random], Any]
    body: Callable[[Subject, Any], int]
    prepare: Prepare = Prepare.FRESH
    payload_bytes: Callable[[Sizes], int] | None = None
    """Bytes of user data one operation moves, for a MiB/s figure."""
    large_only: bool = False
    """Left out of the default selection unless `--large`."""
    writers: tuple[int, ...] = ()
    """The writer counts of a concurrent workload (empty: one database, no threads); it runs
    only when selected by name or by `--writers`."""

    @property
    def needs_reopen(self) -> bool:
        return self.prepare in (Prepare.COLD, Prepare.CLOSED)


# -- building blocks --------------------------------------------------------------------------


def _no_inputs(sizes: Sizes, rng: random.Random) -> None:
    return None


def _table(subject: Subject, sizes: Sizes) -> None:
    subject.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")


def _fill_pages(subject: Subject, rows: int, rng: random.Random, per_txn: int) -> None:
    """Append `rows` rows of `PAGE_ROW_BYTES` (one leaf page each) to `t(id, v)`."""
    for start in range(0, rows, per_txn):
        stop = min(rows, start + per_txn)
        subject.execute("BEGIN")
        subject.connection.executemany(
            "INSERT INTO t(id, v) VALUES (?, ?)",
            ((i, rng.randbytes(PAGE_ROW_BYTES)) for i in range(start, stop)),
        )
        subject.execute("COMMIT")


def _page_table(rows_of: Callable[[Sizes], int]) -> Callable[[Subject, Sizes], None]:
    """Setup of a table `t(id, v)` of one-page rows."""

    def setup(subject: Subject, sizes: Sizes) -> None:
        rows = rows_of(sizes)
        _table(subject, sizes)
        _fill_pages(subject, rows, random.Random(f"pages:{rows}"), sizes.build_txn_rows)

    return setup


def _small_rows(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(ROW_BYTES) for _ in range(n)]


# -- one-row commits, 100-row commits, hot row ------------------------------------------------


def _commit_1_body(subject: Subject, values: list[bytes]) -> int:
    execute = subject.connection.execute
    for value in values:
        execute("INSERT INTO t(v) VALUES (?)", (value,))
    return len(values)


def _commit_100_inputs(sizes: Sizes, rng: random.Random) -> list[list[tuple[bytes]]]:
    return [
        [(v,) for v in _small_rows(rng, sizes.rows_per_commit)] for _ in range(sizes.commits_100)
    ]


def _commit_100_body(subject: Subject, commits: list[list[tuple[bytes]]]) -> int:
    connection = subject.connection
    for rows in commits:
        connection.execute("BEGIN")
        connection.executemany("INSERT INTO t(v) VALUES (?)", rows)
        connection.execute("COMMIT")
    return len(commits)


def _hot_setup(subject: Subject, sizes: Sizes) -> None:
    subject.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, v BLOB)")
    subject.execute("INSERT INTO t VALUES (1, 0, ?)", (bytes(ROW_BYTES),))


def _hot_body(subject: Subject, values: list[bytes]) -> int:
    execute = subject.connection.execute
    for value in values:
        execute("UPDATE t SET n = n + 1, v = ? WHERE id = 1", (value,))
    return len(values)


# -- concurrent writers -----------------------------------------------------------------------


def _writers_body(subject: Subject, values: list[list[bytes]]) -> int:
    """Every writer's one-row commits, all writers at once: the threads start together at a
    barrier, and the body returns when the last one is done."""
    assert isinstance(subject, WriterGroup)
    members = subject.members
    start = threading.Barrier(len(members))
    failures: list[BaseException] = []

    def write(member: Subject, rows: list[bytes]) -> None:
        try:
            start.wait()
            _commit_1_body(member, rows)
        except BaseException as e:
            failures.append(e)
            start.abort()

    threads = [
        threading.Thread(target=write, args=(m, rows), name=f"writer-{i}")
        for i, (m, rows) in enumerate(zip(members, values, strict=False))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return sum(len(rows) for rows in values[: len(members)])


DEFAULT_WRITERS = (1, 64)


def writers_workload(counts: Sequence[int] = DEFAULT_WRITERS) -> Workload:
    """The concurrent workload at these writer counts (1 is always among them: the reference
    every other count's aggregate rate is divided by)."""
    writers = tuple(sorted({1, *counts}))

    def inputs(sizes: Sizes, rng: random.Random) -> list[list[bytes]]:
        """Rows for the most writers; a group of N takes the first N lists."""
        return [_small_rows(rng, sizes.writer_commits) for _ in range(writers[-1])]

    return Workload(
        name="writers",
        describe=lambda s: (
            f"N threads at once, {s.writer_commits:,} one-row commits each on a database of its "
            f"own (N = {', '.join(map(str, writers))})"
        ),
        unit="commit",
        setup=_table,
        inputs=inputs,
        body=_writers_body,
        prepare=Prepare.WARM,
        writers=writers,
    )


# -- big inserts ------------------------------------------------------------------------------


def _blob_workload(mib: int, *, large_only: bool = False) -> Workload:
    def body(subject: Subject, blob: bytes) -> int:
        subject.connection.execute("INSERT INTO t(v) VALUES (?)", (blob,))
        return 1

    return Workload(
        name=f"blob-{mib}m",
        describe=lambda s: f"{mib} MiB single-blob insert (one autocommit INSERT)",
        unit="insert",
        setup=_table,
        inputs=lambda s, rng: rng.randbytes(mib * MiB),
        body=body,
        payload_bytes=lambda s: mib * MiB,
        large_only=large_only,
    )


def _insert_rows_body(subject: Subject, rows: list[tuple[int, bytes]]) -> int:
    connection = subject.connection
    connection.execute("BEGIN")
    connection.executemany("INSERT INTO t(id, v) VALUES (?, ?)", rows)
    connection.execute("COMMIT")
    return 1


# -- cold reads -------------------------------------------------------------------------------


def _cold_read_inputs(sizes: Sizes, rng: random.Random) -> tuple[int, int]:
    """Where the range starts (paired: the same place on every system) and how many rows."""
    pages = sizes.cold_read_pages
    return rng.randrange(0, sizes.cold_table_pages - pages), pages


def _cold_read_body(subject: Subject, where: tuple[int, int]) -> int:
    start, pages = where
    (count, total), *_ = subject.connection.execute(
        "SELECT count(*), sum(length(v)) FROM t WHERE id >= ? AND id < ?", (start, start + pages)
    ).fetchall()
    if count != pages or total != pages * PAGE_ROW_BYTES:
        raise AssertionError(f"cold read found {count} rows, expected {pages}")
    return 1


def _scan_body(subject: Subject, rows: int) -> int:
    (count, total), *_ = subject.connection.execute(
        "SELECT count(*), sum(length(v)) FROM t"
    ).fetchall()
    if count != rows or total != rows * PAGE_ROW_BYTES:
        raise AssertionError(f"scan found {count} rows / {total} bytes, expected {rows} rows")
    return 1


# -- mixed OLTP and index creation ------------------------------------------------------------


def _kv_table(rows: Callable[[Sizes], int]) -> Callable[[Subject, Sizes], None]:
    def setup(subject: Subject, sizes: Sizes) -> None:
        n = rows(sizes)
        rng = random.Random(f"kv-table:{n}")
        subject.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v BLOB)")
        subject.execute("BEGIN")
        subject.connection.executemany(
            "INSERT INTO t VALUES (?, ?, ?)",
            ((i, rng.randrange(1 << 62), rng.randbytes(ROW_BYTES)) for i in range(n)),
        )
        subject.execute("COMMIT")

    return setup


OltpOp = tuple[bool, int, bytes | None]


def _oltp_inputs(sizes: Sizes, rng: random.Random) -> list[OltpOp]:
    ops: list[OltpOp] = []
    for _ in range(sizes.oltp_ops):
        key = rng.randrange(sizes.oltp_rows)
        if rng.random() < 0.8:
            ops.append((True, key, None))
        else:
            ops.append((False, key, rng.randbytes(ROW_BYTES)))
    return ops


def _oltp_body(subject: Subject, ops: Sequence[OltpOp]) -> int:
    execute = subject.connection.execute
    for is_read, key, value in ops:
        if is_read:
            execute("SELECT k, v FROM t WHERE id = ?", (key,)).fetchall()
        else:
            execute("UPDATE t SET k = k + 1, v = ? WHERE id = ?", (value, key))
    return len(ops)


def _index_body(subject: Subject, _: None) -> int:
    subject.connection.execute("CREATE INDEX t_k ON t(k)")
    return 1


# -- wake -------------------------------------------------------------------------------------


def _wake_body(subject: Subject, _: None) -> int:
    subject.open()
    found = subject.connection.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    if found != [(1,)]:
        raise AssertionError(f"woke to schema {found!r}")
    return 1


HOT_ROWS = 8


def _wake_rows(mib: int) -> int:
    return mib * MiB // PAGE_ROW_BYTES


def _wake_setup(mib_of: Callable[[Sizes], int]) -> Callable[[Subject, Sizes], None]:
    def setup(subject: Subject, sizes: Sizes) -> None:
        _table(subject, sizes)
        rows = _wake_rows(mib_of(sizes))
        _fill_pages(subject, rows, random.Random(f"wake:{rows}"), sizes.build_txn_rows)

    return setup


def _hot_rows(sizes: Sizes, rng: random.Random) -> list[int]:
    """The same rows at every wake, as an actor's own rows would be (not drawn from `rng`)."""
    return random.Random("hot rows").sample(range(_wake_rows(sizes.wake_big_mib)), HOT_ROWS)


def _wake_lookup_body(subject: Subject, ids: list[int]) -> int:
    subject.open()
    for i in ids:
        found = subject.connection.execute("SELECT length(v) FROM t WHERE id = ?", (i,)).fetchall()
        if found != [(PAGE_ROW_BYTES,)]:
            raise AssertionError(f"row {i}: {found!r}")
    return 1


def _wake_workload(name: str, mib_of: Callable[[Sizes], int], which: str) -> Workload:
    return Workload(
        name=name,
        describe=lambda s: (
            f"open (wake) of an existing {mib_of(s)} MiB database ({which}), then read the schema"
        ),
        unit="open",
        setup=_wake_setup(mib_of),
        inputs=_no_inputs,
        body=_wake_body,
        prepare=Prepare.CLOSED,
    )


# -- the registry -----------------------------------------------------------------------------


def _scan_rows(sizes: Sizes) -> int:
    return sizes.scan_mib * MiB // PAGE_ROW_BYTES


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="commit-1",
            describe=lambda s: f"one-row commits ({s.commits_1:,} autocommit INSERTs of 100 B)",
            unit="commit",
            setup=_table,
            inputs=lambda s, rng: _small_rows(rng, s.commits_1),
            body=_commit_1_body,
            prepare=Prepare.WARM,
        ),
        Workload(
            name="commit-100",
            describe=lambda s: (
                f"100-row commits ({s.commits_100:,} transactions of "
                f"{s.rows_per_commit} x 100 B INSERTs)"
            ),
            unit="commit",
            setup=_table,
            inputs=_commit_100_inputs,
            body=_commit_100_body,
            prepare=Prepare.WARM,
        ),
        Workload(
            name="hot-update",
            describe=lambda s: f"hot-row update x {s.hot_updates} (one row, one commit each)",
            unit="commit",
            setup=_hot_setup,
            inputs=lambda s, rng: _small_rows(rng, s.hot_updates),
            body=_hot_body,
            prepare=Prepare.WARM,
        ),
        _blob_workload(1),
        _blob_workload(10),
        _blob_workload(50, large_only=True),
        Workload(
            name="insert-10k",
            describe=lambda s: f"{s.insert_rows:,}-row insert in one transaction (100 B rows)",
            unit="txn",
            setup=_table,
            inputs=lambda s, rng: [(i, v) for i, v in enumerate(_small_rows(rng, s.insert_rows))],
            body=_insert_rows_body,
            payload_bytes=lambda s: s.insert_rows * ROW_BYTES,
        ),
        Workload(
            name="cold-read-100",
            describe=lambda s: (
                f"cold read of {s.cold_read_pages} pages after reopen "
                f"(one-page rows of a compacted {s.cold_table_pages * 4 // 1024} MiB table)"
            ),
            unit="read",
            setup=_page_table(lambda s: s.cold_table_pages),
            inputs=_cold_read_inputs,
            body=_cold_read_body,
            prepare=Prepare.COLD,
            payload_bytes=lambda s: s.cold_read_pages * PAGE_ROW_BYTES,
        ),
        Workload(
            name="cold-scan",
            describe=lambda s: f"cold full scan of a {s.scan_mib} MiB table after reopen",
            unit="scan",
            setup=_page_table(_scan_rows),
            inputs=lambda s, rng: _scan_rows(s),
            body=_scan_body,
            prepare=Prepare.COLD,
            payload_bytes=lambda s: _scan_rows(s) * PAGE_ROW_BYTES,
        ),
        Workload(
            name="oltp",
            describe=lambda s: (
                f"mixed OLTP, 80 % point reads / 20 % one-row update commits "
                f"({s.oltp_ops:,} ops on {s.oltp_rows:,} rows)"
            ),
            unit="op",
            setup=_kv_table(lambda s: s.oltp_rows),
            inputs=_oltp_inputs,
            body=_oltp_body,
            prepare=Prepare.WARM,
        ),
        Workload(
            name="create-index",
            describe=lambda s: f"CREATE INDEX on {s.index_rows:,} rows (random 62-bit keys)",
            unit="index",
            setup=_kv_table(lambda s: s.index_rows),
            inputs=_no_inputs,
            body=_index_body,
        ),
        _wake_workload("wake-small", lambda s: s.wake_small_mib, "small"),
        _wake_workload("wake-big", lambda s: s.wake_big_mib, "big"),
        Workload(
            name="wake-lookup",
            describe=lambda s: (
                f"open (wake) of the {s.wake_big_mib} MiB database, then read the same "
                f"{HOT_ROWS} rows by key as at the last wake"
            ),
            unit="wake",
            setup=_wake_setup(lambda s: s.wake_big_mib),
            inputs=_hot_rows,
            body=_wake_lookup_body,
            prepare=Prepare.CLOSED,
        ),
        writers_workload(),
    )
}


def build(workload: Workload, subject: Subject, sizes: Sizes) -> None:
    """Run `workload.setup`, then compact: every sample starts from the layout of a long-lived
    database (base pages, no live deltas), and a compaction pass after the body then folds only
    what the body wrote. On native SQLite `compact` does nothing. A group of writers builds
    each of its databases."""
    for one in subject.members if isinstance(subject, WriterGroup) else (subject,):
        workload.setup(one, sizes)
        one.compact()


def default_selection(*, large: bool) -> list[str]:
    return [name for name, w in WORKLOADS.items() if (large or not w.large_only) and not w.writers]
