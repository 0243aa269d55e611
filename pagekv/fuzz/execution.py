"""Running fuzz steps against pagekv and the oracle, checking every promise after each disruption.

Checks, each a `FuzzFailure` when broken:
- after every reopen, `PRAGMA integrity_check` is ok and the content equals the oracle's state
  before or after the one unacknowledged transaction (never a mix); an acknowledged transaction is
  never lost;
- a taken-over instance dies on its next write, and no instance writes once superseded or dead;
- no KV request breaks a `KvLimits` bound;
- no storage error happens unless a fault was injected, and pagekv never accepts or rejects a
  statement differently from native SQLite;
- a commit refused by the storage quota changed nothing, left nothing of its own in the store
  (not even chunks of a transaction staged over several batches), and never kills the instance:
  the same connection goes on reading (and, where it fits, writing) without a reopen;
- a read-only snapshot whose namespace is dropped and written anew under it returns only rows
  of its own database, or expires.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, assert_never

import apsw

from pagekv.fuzz.oracle import Oracle, digest, run_txn
from pagekv.fuzz.steps import (
    Compact,
    Crash,
    InjectFault,
    Latency,
    Recreate,
    Reopen,
    Sql,
    Step,
    StepGenerator,
    Takeover,
    Txn,
)
from pagekv.kv import (
    READ_OPS,
    WRITE_OPS,
    ActorKv,
    CountingKv,
    FaultyKv,
    KvUnavailable,
    LimitError,
    StorageQuotaExceeded,
)
from pagekv.kv.limits import check_keys, check_write
from pagekv.kv.wrappers import KvWrapper
from pagekv.vfs import Database, SnapshotExpired, open_database
from pagekv.vfs.format import (
    DELTA_END,
    DELTA_PREFIX,
    HINTS_KEY,
    INDEX_END,
    INDEX_PREFIX,
    txid_bound,
)

T = TypeVar("T")
ALL_OPS = READ_OPS | WRITE_OPS
_STORAGE_ERRORS = (apsw.IOError, apsw.FullError)
_PROBE = Txn((Sql("CREATE TABLE fuzz_probe(x)"),))


class FuzzFailure(Exception):
    """A broken promise, found at step `index` (-1: at the final check)."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(f"step {index}: {message}" if index >= 0 else message)


@dataclass
class Coverage:
    """What a fuzz session exercised."""

    runs: int = 0
    steps: int = 0
    commits: int = 0
    failed_commits: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    crashes: int = 0
    reopens: int = 0
    compactions: int = 0
    latency_steps: int = 0
    verifications: int = 0
    bytes_written: int = 0
    quota_refusals: int = 0
    recreations: int = 0
    snapshots_expired: int = 0
    store_writes: int = 0
    """`--processes`: durable writes the children's stores made (`flush_counts()`), and"""
    store_flushes: int = 0
    """the flushes they took: fewer flushes than writes is group commit at work."""

    def add(self, other: Coverage) -> None:
        for name, value in vars(other).items():
            if isinstance(value, Counter):
                getattr(self, name).update(value)
            else:
                setattr(self, name, getattr(self, name) + value)


class _Guard(KvWrapper):
    """One instance's view of the store: checks limits and that it writes only while it may."""

    def __init__(self, inner: ActorKv, problems: list[str], name: str) -> None:
        super().__init__(inner)
        self.problems = problems
        self.name = name
        self.severed = False
        """Crashed: every call fails before it reaches the store."""
        self.superseded = False
        """Taken over or dead: any write that the store applies breaks single-writer safety."""
        self.closing = False
        """Closed on purpose before the next instance opens: its close may save preload hints
        (and nothing else)."""

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.severed:
            raise KvUnavailable(f"fuzz: {self.name} has crashed")
        try:
            if op == "write":
                check_write(self.limits, kwargs["put"], kwargs["delete"])
            elif op == "get":
                check_keys(self.limits, args[0])
        except LimitError as e:
            self.problems.append(f"{self.name}: the VFS sent a request over a limit: {e}")
        result = fn(*args, **kwargs)
        hints_only = op == "write" and not kwargs["delete"] and set(kwargs["put"]) == {HINTS_KEY}
        if op in WRITE_OPS and self.superseded and not (self.closing and hints_only):
            self.problems.append(f"{self.name} wrote ({op}) after it was superseded")
        return result


@dataclass
class _Instance:
    db: Database
    guard: _Guard
    faulty: FaultyKv

    @contextlib.contextmanager
    def quiet(self) -> Any:
        """Faults held back (still armed) while the fuzzer itself reads."""
        self.faulty.enabled = False
        try:
            yield
        finally:
            self.faulty.enabled = True


class Runner:
    """Runs one sequence of steps on a fresh namespace from `kv_factory`.

    One class over ~20 methods: every step's check compares the same three things, the
    current instance, the oracle and the store under it, and every disruption (reopen, crash,
    takeover, recreation) replaces the instance and verifies it against the oracle, counting in
    the same `coverage` and failing at the same step index; split, each part would take all of
    them. Invariant: after every disruption the current instance holds exactly the oracle's
    state, before or after its one unacknowledged transaction (`_verify`). Single-threaded:
    every field is touched only by the thread running the steps.
    """

    def __init__(self, kv_factory: Callable[[], ActorKv], **db_options: Any) -> None:
        self.kv = CountingKv(kv_factory())
        self.db_options = db_options
        self.oracle = Oracle()
        self.coverage = Coverage(runs=1)
        self.problems: list[str] = []
        self._instances = 0
        self._index = -1
        self.current = self._open()

    def _open(self) -> _Instance:
        self._instances += 1
        guard = _Guard(self.kv, self.problems, f"instance {self._instances}")
        faulty = FaultyKv(guard)
        faulty.enabled = False
        db = open_database(faulty, **self.db_options)
        faulty.enabled = True
        return _Instance(db, guard, faulty)

    def fail(self, message: str) -> FuzzFailure:
        return FuzzFailure(self._index, message)

    def run(self, steps: list[Step]) -> Coverage:
        """Run every step, then check a final reopen; always releases the instance."""
        try:
            for step in steps:
                self.step(step)
            self.finish()
        finally:
            self.close()
        return self.coverage

    def close(self) -> None:
        """Release the current instance."""
        self._close(self.current)

    def step(self, step: Step) -> None:
        """Run one step and check what it must not break."""
        self._index += 1
        with self._unexpected_errors():
            self._reopen_if_dead()
            instance = self.current
            fired = len(instance.faulty.fired)
            self._step(step)
            for fault in instance.faulty.fired[fired:]:
                self.coverage.faults[fault.kind.value] += 1
        self._check_problems()
        self.coverage.steps += 1

    def finish(self) -> None:
        """The final check: reopen fresh and compare with the oracle."""
        self._index = -1
        with self._unexpected_errors():
            self._reopen_if_dead()
            self._reopen(crash=False)
        self._check_problems()
        self.coverage.bytes_written = self.kv.stats.bytes_written

    @contextlib.contextmanager
    def _unexpected_errors(self) -> Iterator[None]:
        """Any error the checks did not anticipate (corruption, a failed open) is a finding."""
        try:
            yield
        except FuzzFailure:
            raise
        except Exception as e:
            raise self.fail(f"unexpected {type(e).__name__}: {e}") from e

    def _reopen_if_dead(self) -> None:
        """An instance can die after acknowledging a commit (a fault in the flush or compaction
        SQLite runs after its commit point); that is allowed only if a fault was injected."""
        instance = self.current
        if instance.db.is_dead:
            if not instance.faulty.fired:
                error = instance.db.take_last_kv_error()
                raise self.fail(f"instance died with no fault injected: {error!r}") from error
            self._reopen(crash=False)

    def _check_problems(self) -> None:
        if self.problems:
            raise self.fail("; ".join(self.problems))

    def _step(self, step: Step) -> None:
        match step:
            case Txn():
                self._txn(step)
            case InjectFault(kind, after):
                self.current.faulty.arm(kind, after=after, ops=ALL_OPS)
            case Latency(ms):
                self.current.faulty.latency_s = ms / 1000
                self.coverage.latency_steps += 1
            case Crash():
                self.coverage.crashes += 1
                self._reopen(crash=True)
            case Reopen():
                self._reopen(crash=False)
            case Takeover():
                self._takeover()
            case Compact():
                self._compact()
            case Recreate():
                self._recreate(step)
            case _:
                assert_never(step)

    def _txn(self, txn: Txn) -> None:
        instance = self.current
        fired = len(instance.faulty.fired)
        try:
            run_txn(instance.db.connection, txn)
        except _STORAGE_ERRORS as e:
            if len(instance.faulty.fired) == fired:
                if self._refused(instance):
                    return
                raise self.fail(f"storage error with no fault injected: {e!r}") from e
            self.coverage.failed_commits += 1
            self.oracle.pending = txn
            self._reopen(crash=False)
            return
        except apsw.Error as e:
            if self._oracle_rejects(txn):
                return
            raise self.fail(f"pagekv rejected what native SQLite accepts: {e!r}") from e
        try:
            self.oracle.apply(txn)
        except apsw.Error as e:
            raise self.fail(f"pagekv accepted what native SQLite rejects: {e!r}") from e
        self.coverage.commits += 1

    def _refused(self, instance: _Instance) -> bool:
        """Check a transaction the storage quota refused; False if the quota was not the cause.

        Nothing of it may be visible or stored, and the connection must go on working: the
        instance never dies of it, even when some of its batches had been written (staged)."""
        if not isinstance(instance.db.take_last_kv_error(), StorageQuotaExceeded):
            return False
        self.coverage.quota_refusals += 1
        if instance.db.is_dead:
            raise self.fail("a transaction refused by the quota killed the database")
        left = self._staged_left(instance)
        if left:
            raise self.fail(f"a transaction refused by the quota left {left[0]!r} in the store")
        with instance.quiet():
            try:
                got = digest(instance.db.connection)
            except apsw.Error as e:
                raise self.fail(f"a read after a commit refused by the quota failed: {e!r}") from e
        if got != self.oracle.states()[0]:
            raise self.fail("a commit refused by the quota left changes on its connection")
        return True

    def _staged_left(self, instance: _Instance) -> list[bytes]:
        """The first chunk key and index part key (if any) of a txid above `instance`'s head:
        only a transaction in progress, never a refused one, may hold such keys."""
        head = instance.db.metrics()["head_txid"]
        assert isinstance(head, int)
        left: list[bytes] = []
        for prefix, end in ((DELTA_PREFIX, DELTA_END), (INDEX_PREFIX, INDEX_END)):
            rows = self.kv.list(start=txid_bound(prefix, head + 1), end=end, limit=1)
            left.extend(key for key, _ in rows)
        return left

    def _recreate(self, step: Recreate) -> None:
        """Drop the namespace under a read-only snapshot in mid-scan and write a new database."""
        old = self.current
        head_txid = old.db.metrics()["head_txid"]
        assert isinstance(head_txid, int)
        old.guard.superseded = old.guard.closing = True
        self._close(old)
        query, rows = self._largest_table()
        snap = open_database(self.kv, read_only=True, cache_pages=step.cache_pages)
        try:
            cursor = snap.execute(query)
            seen = [next(cursor) for _ in range(min(2, len(rows)))]
            self.kv.drop()
            self.oracle = Oracle()
            self.current = self._open()
            for txn in StepGenerator.recreation(step, head_txid + step.extra):
                self._txn(txn)  # under a quota, some may be refused
            try:
                for row in cursor:
                    seen.append(row)
            except apsw.IOError as e:
                if not isinstance(snap.take_last_kv_error(), SnapshotExpired):
                    raise
                self.coverage.snapshots_expired += 1
                if seen != rows[: len(seen)]:
                    raise self.fail("a snapshot read rows of a newer database") from e
            else:
                if seen != rows:
                    raise self.fail("a snapshot read rows of a newer database")
        finally:
            snap.close()
        self.coverage.recreations += 1
        self._verify(self.current)

    def _largest_table(self) -> tuple[str, list[Any]]:
        """A query over the oracle's table with the most rows (the schema if it has none) and
        the oracle's answer to it."""
        connection = self.oracle.connection
        query = (
            "SELECT type, name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        )
        best = (query, connection.execute(query).fetchall())
        for (name,) in connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'"):
            query = f'SELECT * FROM "{name}" ORDER BY rowid'
            rows = connection.execute(query).fetchall()
            if len(rows) > len(best[1]):
                best = (query, rows)
        return best

    def _oracle_rejects(self, txn: Txn) -> bool:
        connection = self.oracle.connection
        connection.execute("SAVEPOINT probe")
        try:
            for statement in txn.statements:
                connection.execute(statement.sql, statement.bindings()).fetchall()
        except apsw.Error:
            return True
        finally:
            connection.execute("ROLLBACK TO probe")
            connection.execute("RELEASE probe")
        return False

    def _compact(self) -> None:
        instance = self.current
        fired = len(instance.faulty.fired)
        try:
            instance.db.compact()
            self.coverage.compactions += 1
        except StorageQuotaExceeded:
            if instance.db.is_dead:  # compaction adds base pages before it deletes chunks
                raise self.fail("a compaction refused by the quota killed the database") from None
            self.coverage.quota_refusals += 1
        except Exception as e:
            if len(instance.faulty.fired) == fired:
                raise self.fail(f"compaction failed with no fault injected: {e!r}") from e
            self._reopen(crash=False)

    def _takeover(self) -> None:
        old = self.current
        self.current = self._open()
        old.guard.superseded = True
        old.faulty.enabled = False
        self.coverage.takeovers += 1
        try:
            run_txn(old.db.connection, _PROBE)
        except _STORAGE_ERRORS:
            if not old.db.is_dead:
                raise self.fail("a taken-over instance failed a write but did not die") from None
        else:
            raise self.fail("a taken-over instance committed after the takeover")
        self._close(old)
        self._verify(self.current)

    def _reopen(self, *, crash: bool) -> None:
        old = self.current
        if crash:
            old.guard.severed = True
        old.guard.superseded = True
        old.guard.closing = not crash
        self._close(old)
        self.current = self._open()
        self.coverage.reopens += 1
        self._verify(self.current)

    def _close(self, instance: _Instance) -> None:
        """Close an instance; a crashed or dead one may fail to, which is expected."""
        instance.faulty.enabled = False
        try:
            instance.db.close()
        except apsw.Error:
            if not (instance.guard.severed or instance.db.is_dead):
                raise

    def _verify(self, instance: _Instance) -> None:
        with instance.quiet():
            db = instance.db
            check = db.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                raise self.fail(f"integrity_check: {check[:5]}")
            got = digest(db.connection)
        old, new = self.oracle.states()
        if got == new:
            self.oracle.resolve(committed=True)
        elif got == old:
            self.oracle.resolve(committed=False)
        else:
            pending = "" if new is None else " or after the unacknowledged transaction"
            raise self.fail(f"content differs from the oracle's state before{pending}")
        self.coverage.verifications += 1
