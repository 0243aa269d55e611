"""Real crashes: a child process commits on a durable store and is killed with SIGKILL.

The parent and the child generate the same transactions from the seed. The child runs several
writers at once, each a thread committing its own sequence on its own actor, so their commits
share the store's flushes (group commit); each prints `ack W N ...` after its transaction N
commits. The parent kills the child at a random moment, reopens every actor itself and checks
each one's content is its oracle's state after its last acknowledged transaction, or after the
one it had in flight — then starts a new child from there. When the sequences are done, the next
run starts on fresh actors, until the time is up.

With the `disk` event on a `file:` store, one child life in three fills the disk instead: after a
few commits the child lowers `RLIMIT_FSIZE` (SIGXFSZ ignored) to a random point just past the
end of the log, or inside the base that the next fold writes (the child's log is then 64 KiB, so
it folds often), and goes on committing. Writes past the limit are cut short, then refused with
`EFBIG`, as on a full disk. The first commit that fails ends the child (`fault W N ...`); its
error must be a typed KV error, and the parent checks the store as after a kill: a commit
acknowledged over a short write would be missing.

Three more events act on a `file:` store from another process, as a user or another program might
(`_Disruption`), each in one life in as many as there are events:

- `future`: once the child has committed a few times, the parent writes a newer pagekv's log
  header (a valid one of format 9) under it, holding the log's lock as that pagekv would. The
  child's next commits must be refused with `FormatTooNew` (it ends at the first) and the log
  must not change by a byte; the parent then puts the header back and checks the store.
- `shm`: the parent deletes `kv.shm`, or moves a copy of it over it, and starts a second writer
  process, which maps a new one, beside the child. Both go on; the second writer's acknowledged
  writes are checked with the child's actors.
- `stop`: before the child starts, a writer process of four threads is SIGSTOPped at a moment it
  holds the flusher lock (and not the log's), and stays stopped until the store is checked. The
  child must commit beside it (flushing around it), and its acknowledged writes must be there.

The store is a `file:` URL's, or a user's backend (`Backend`): a store factory each process calls
with the one location they share. The parent opens a factory's store only between child lives,
as a backend may let a single process at a time open a location.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import apsw
from crc32c import crc32c

from pagekv.fuzz.execution import Coverage, FuzzFailure
from pagekv.fuzz.oracle import Oracle, digest, run_txn
from pagekv.fuzz.steps import FILE_ONLY_EVENTS, PROCESS_EVENTS, StepGenerator, Txn
from pagekv.kv import FileStore, FormatTooNew, KvError, KvStore, open_kv
from pagekv.kv.file.lock_holders import flock_holders
from pagekv.vfs import Database, open_database


def _transactions(seed: int, count: int, max_blob: int) -> list[Txn]:
    generator = StepGenerator(random.Random(seed), frozenset(), max_blob)
    return [s for s in generator.steps(count) if isinstance(s, Txn)]


_COMPACT_DELTAS = 8
"""The child compacts every few commits (the default is 256, more than a run commits), so that
kills land in compactions too."""


DEFAULT_WRITERS: Final = 4
"""Writers (actors, each on a thread of its own) per child: enough that they commit at once and
share flushes (group commit), which a lone writer never does; each is verified after each life."""
_FOLDING_LOG_KIB: Final = 64
"""The log of a child that fills the disk: small, so that its commits fold it into the base."""


def load_kv_factory(spec: str) -> Callable[..., Any]:
    """The factory `MODULE:CALLABLE` names (`pagekv.testing.load_factory`), `MODULE` looked up in
    the current directory too, as uvicorn does: `--kv-factory mykv:make` from the project's
    directory, in the parent and in each child. Raises `pagekv.testing.UsageError`."""
    # Here, not at the top: pagekv.testing imports pagekv.fuzz, which imports this module.
    from pagekv.testing.subject import load_factory

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_factory(spec)


@dataclass(frozen=True)
class Backend:
    """The durable store the parent and its children share, each process opening its own on it:
    a `file:` URL's, or one from a store factory (`MODULE:CALLABLE`) called with `location=`, the
    same directory in every process. Invariant: exactly one of `url` and `factory` is set, and
    `location` with `factory`."""

    url: str | None = None
    factory: str | None = None
    location: Path | None = None

    def open(self) -> KvStore:
        if self.factory is None:
            assert self.url is not None
            return open_kv(self.url)
        store: KvStore = load_kv_factory(self.factory)(location=self.location)
        return store

    def args(self) -> list[str]:
        """How a child is told (`from_args`)."""
        return [self.url or "-", self.factory or "-", str(self.location or "-")]

    @classmethod
    def from_args(cls, url: str, factory: str, location: str) -> Backend:
        if factory == "-":
            return cls(url=url)
        return cls(factory=factory, location=Path(location))


def child_main(argv: list[str]) -> None:
    """Entry point of the child: each writer, a thread on its own actor, commits its transactions
    `START..` and acknowledges each with the number of compactions it has finished and the
    store's `flush_counts()` so far (`ack W N COMPACTIONS WRITES FLUSHES`, `W` the writer's index);
    `done W` when its sequence is over. `disk` is `-`; or `AFTER:SEED`: fill the disk after the
    child's `AFTER`th commit (of any writer), at a point drawn from `SEED`; or `future`: a newer
    log format is coming. Then the first commit that fails prints `fault W N WHERE typed|untyped
    ...` (`WHERE` is `log` or `fold`, or `future`, where typed means `FormatTooNew`) and ends
    the child. Any other error prints `error W ...` and ends it too. The store is
    `Backend.args`, the writers `ACTOR:SEED:START` arguments."""
    url, factory, location, count, max_blob, disk, *writers = argv
    if disk not in ("-", "future") and "log_kib=" not in url:
        url += ("&" if "?" in url else "?") + f"log_kib={_FOLDING_LOG_KIB}"
    store = Backend.from_args(url, factory, location).open()
    lives = []
    for spec in writers:
        actor, seed, start = spec.rsplit(":", 2)
        db = open_database(
            store.namespace(actor),
            compact_deltas=_COMPACT_DELTAS,
            in_place_commits=int(seed) % 2
            == 0,  # half the actors: deltas, so kills hit compactions
        )
        lives.append((db, _transactions(int(seed), int(count), int(max_blob)), int(start)))
    fill = _Fill(store, disk)
    if fill.after >= 0:  # here: only the main thread may set a handler
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _say("ready")
    threads = [
        threading.Thread(target=_writer, args=(w, store, db, txns, start, fill), daemon=True)
        for w, (db, txns, start) in enumerate(lives)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _say("done")


def _say(line: str) -> None:
    """One line on stdout in one `write`, so the writers' lines never interleave on the pipe."""
    os.write(1, (line + "\n").encode())


class _Fill:
    """When and where a child fills the disk: after its `after`th commit, by any writer."""

    def __init__(self, store: KvStore, disk: str) -> None:
        self.store = store
        fills = disk not in ("-", "future")
        self.after = int(disk.split(":")[0]) if fills else -1
        self.seed = int(disk.split(":")[1]) if fills else 0
        self.future = disk == "future"
        """A newer pagekv's log header may come: a commit it refuses ends the child."""
        self.filled = False
        self.where = ""
        self.commits = 0
        self.lock = threading.Lock()

    def before_commit(self) -> None:
        with self.lock:
            if self.filled or self.after < 0 or self.commits < self.after:
                return  # `>=`, not `==`: several writers may commit between two looks
            if not isinstance(self.store, FileStore):
                return
            self.where, limit = _fill_point(self.store, random.Random(self.seed))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            self.filled = True

    def committed(self) -> None:
        with self.lock:
            self.commits += 1


def _writer(w: int, store: KvStore, db: Database, txns: list[Txn], start: int, fill: _Fill) -> None:
    """One writer of a child: commit `txns[start:]` on `db`, acknowledging each (`child_main`)."""
    counts = getattr(store, "flush_counts", None)
    try:
        for n in range(start, len(txns)):
            fill.before_commit()
            try:
                run_txn(db.connection, txns[n])
            except apsw.Error as e:
                if not fill.filled and not fill.future:
                    raise
                cause = db.take_last_kv_error()
                if fill.future:
                    typed = "typed" if isinstance(cause, FormatTooNew) else "untyped"
                    where = "future"
                else:
                    typed = "typed" if isinstance(cause, KvError) else "untyped"
                    where = fill.where
                _say(f"fault {w} {n} {where} {typed} {cause!r} {e!r}".replace("\n", " "))
                os._exit(0)  # the child ends at its first failed commit, whoever made it
            fill.committed()
            flushed = counts() if counts is not None else None
            writes, flushes = (flushed.writes, flushed.flushes) if flushed else (0, 0)
            _say(f"ack {w} {n} {db.metrics()['compactions']} {writes} {flushes}")
        _say(f"done {w}")
    except BaseException as e:
        _say(f"error {w} {e!r}".replace("\n", " "))
        os._exit(3)


def _fill_point(store: FileStore, rng: random.Random) -> tuple[str, int]:
    """Where the disk fills up: just past the log's end (`log`), or inside the base, past
    anything the log will write (`fold`); and the file size limit that puts it there."""
    base = os.path.getsize(store.path / "kv.sqlite3")
    past_log = store.log_bytes + 8192
    if base > past_log and rng.random() < 0.5:
        return "fold", rng.randrange(past_log, base)
    return "log", store.log_used + rng.randrange(1, 16384)


def fuzz_processes(
    backend: Backend | str,
    seed: int,
    seconds: float,
    max_blob: int = 2**20,
    count: int = 400,
    events: frozenset[str] = frozenset(PROCESS_EVENTS),
    writers: int = DEFAULT_WRITERS,
) -> Coverage:
    """Kill committing children at random moments for `seconds`, or fill the disk under them
    (`events`); raise `FuzzFailure` on a loss. `backend` is a `Backend` or a store URL.

    A run commits `writers` generated sequences of transactions, each on a fresh actor of its
    own, across as many child lives as it takes: every child runs one thread per actor not done
    yet, so the writers commit at the same time and share the store's flushes (group commit).
    After each life every actor is checked against its own oracle. Runs follow each other until
    the time is up, so a faster store gets more crashes, not an early end.
    """
    if isinstance(backend, str):
        backend = Backend(url=backend)
    if backend.url is not None and backend.url.startswith("memory:"):
        raise ValueError("--processes needs a durable store shared between processes (file://)")
    if not events or not events <= set(PROCESS_EVENTS):
        raise ValueError(f"events must be some of {PROCESS_EVENTS}, got {sorted(events)}")
    file_only = sorted(events & set(FILE_ONLY_EVENTS))
    if file_only and backend.factory is not None:
        raise ValueError(f"events {file_only} act on a file: store's files; a factory's has none")
    if writers < 1:
        raise ValueError(f"writers must be at least 1, got {writers}")
    rng = random.Random(seed)
    coverage = Coverage(runs=0)
    deadline = time.monotonic() + seconds
    parent = _ParentStore(backend)
    try:
        while time.monotonic() < deadline:
            run_seed = rng.randrange(2**32)
            coverage.runs += 1
            _run(parent, run_seed, max_blob, count, rng, deadline, coverage, events, writers)
    finally:
        parent.close()
    return coverage


class _ParentStore:
    """The parent's store, for its looks between child lives. A `file:` URL's stays open across
    lives, as its processes share it (opening it takes 17-28 ms on a fuzzed store, 2-3% of a
    life); a factory's is opened for each look and closed before the next child starts."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.held = backend.open() if backend.factory is None else None

    @contextmanager
    def opened(self) -> Iterator[KvStore]:
        if self.held is not None:
            yield self.held
            return
        store = self.backend.open()
        try:
            yield store
        finally:
            store.close()

    def close(self) -> None:
        if self.held is not None:
            self.held.close()


@dataclass
class _Actor:
    """One writer's sequence in a run: its actor, transactions, oracle and progress."""

    name: str
    seed: int
    txns: list[Txn]
    oracle: Oracle = field(default_factory=Oracle)
    done: int = 0
    """Transactions known committed: the next child life starts this actor here."""


@dataclass
class _Life:
    """What one child life reported."""

    acked: dict[int, int]
    """The last acknowledged index per writer (absent: none this life)."""
    compactions: dict[int, int]
    faults: list[str]
    errors: list[str]
    flushes: tuple[int, int] = (0, 0)
    """The store's writes and flushes in the child, as of its latest acknowledgement."""
    killed: bool = False
    """Whether the parent ended the life with SIGKILL (not the child itself, nor its end)."""


def _run(
    parent: _ParentStore,
    seed: int,
    max_blob: int,
    count: int,
    rng: random.Random,
    deadline: float,
    coverage: Coverage,
    events: frozenset[str],
    writers: int,
) -> None:
    stamp = time.time_ns()
    actors = []
    for w in range(writers):
        actor_seed = seed if w == 0 else random.Random(f"{seed}:{w}").randrange(2**32)
        name = f"pagekv-fuzz-processes/{seed}/{stamp}" + (f"/w{w}" if writers > 1 else "")
        actors.append(_Actor(name, actor_seed, _transactions(actor_seed, count, max_blob)))
    committed_before = coverage.commits
    kinds = [e for e in PROCESS_EVENTS if e in events]
    upcoming: list[str] = []  # each kind once per round, in a shuffled order: all of them fire
    while time.monotonic() < deadline:
        live = [a for a in actors if a.done < len(a.txns)]
        if not live:
            break
        if not upcoming:
            upcoming = rng.sample(kinds, len(kinds))
        kind = upcoming.pop()
        disk, disruption = "-", None
        # A life that fills the disk ends by itself unless crashes are wanted too.
        kill_after = rng.uniform(0.0, 0.3)
        if kind == "disk":
            disk = f"{rng.randrange(4 * len(live))}:{rng.randrange(2**32)}"
            kill_after = kill_after if "crash" in events else 60.0
        elif kind != "crash":
            disruption = _disruption(kind, parent, f"pagekv-fuzz-processes/{seed}/{stamp}", rng)
            disk = "future" if kind == "future" else "-"
            kill_after = disruption.kill_after
        try:
            life = _run_child(parent.backend, live, count, max_blob, disk, kill_after, disruption)
            if disruption is not None:
                disruption.finish(life)
            _tally(life, disruption, live[0].done, coverage)
            try:
                with parent.opened() as store:
                    for w, actor in enumerate(live):
                        _verify(store, actor, life.acked.get(w, actor.done - 1))
                        coverage.verifications += 1
                    if disruption is not None:
                        disruption.verify(store)
            except FuzzFailure:
                raise
            except Exception as e:  # a store that fails to reopen, a database that fails to open
                raise FuzzFailure(
                    live[0].done,
                    f"checking the store after the child ended: {type(e).__name__}: {e}",
                ) from e
        finally:
            if disruption is not None:
                disruption.close()
        coverage.commits = coverage.steps = committed_before + sum(a.done for a in actors)
    with parent.opened() as store:
        for actor in actors:
            store.namespace(actor.name).drop()


def _tally(life: _Life, disruption: _Disruption | None, at: int, coverage: Coverage) -> None:
    """Count what a child life did; raise `FuzzFailure` for what it must not have done."""
    if life.errors:
        raise FuzzFailure(at, f"a child's writer failed: {life.errors[0]}")
    if disruption is not None and disruption.fired:
        coverage.faults[disruption.name] += 1
    if not life.faults:
        coverage.crashes += 1
    else:
        for fault in life.faults:
            if fault.split()[4] != "typed":
                where = fault.split()[3]
                what = "a newer log format" if where == "future" else "the disk filled up"
                raise FuzzFailure(at, f"{what}, and an untyped error: {fault}")
        if disruption is None:
            coverage.faults[f"disk-{life.faults[0].split()[3]}"] += 1
        coverage.failed_commits += len(life.faults)
    coverage.compactions += sum(life.compactions.values())
    coverage.store_writes += life.flushes[0]
    coverage.store_flushes += life.flushes[1]


def _verify(store: KvStore, actor: _Actor, acked: int) -> None:
    """After a child life: `actor`'s content must be its oracle's state after transaction
    `acked` (the last acknowledged), or after the one in flight; advance `actor.done`."""
    for n in range(actor.done, acked + 1):
        actor.oracle.apply(actor.txns[n])
    actor.done = acked + 1
    if actor.done < len(actor.txns):
        actor.oracle.pending = actor.txns[actor.done]
    with open_database(store.namespace(actor.name)) as db:
        check = db.execute("PRAGMA integrity_check").fetchall()
        if check != [("ok",)]:
            raise FuzzFailure(
                actor.done, f"{actor.name}: integrity_check after SIGKILL: {check[:5]}"
            )
        got = digest(db.connection)
    old, new = actor.oracle.states()
    if got == new:
        actor.oracle.resolve(committed=True)
        actor.done += 1
    elif got == old:
        actor.oracle.resolve(committed=False)
    else:
        raise FuzzFailure(
            actor.done,
            f"{actor.name}: after the child ended (killed, disk full): content neither "
            "acknowledged nor next",
        )


_CHILD = "import sys; from pagekv.fuzz.processes import child_main; child_main(sys.argv[1:])"
"""The child's program. Not `-m pagekv.fuzz.processes`: the package imports this module first,
and running it again as `__main__` made Python warn on every child's start."""
_LIVENESS_S: Final = 30.0
"""How long a life waits for a commit that must come (`_Disruption.needs_commits`), or for a
side writer to start: far beyond any healthy pace, so only a stuck store runs into it."""


class _Disruption:
    """What another process does to a `file:` store during one child life: `begin` before
    the child starts; `during` once the child has acknowledged `after` commits (None: never),
    after which the child runs `runs_for` more seconds (or ends by itself); `finish` after it
    ended; `verify` with the actors' check; `close` whatever happened. `needs_commits`: the
    child must commit while it lasts, or the store is stuck. `fired` says whether it acted."""

    name = ""
    after: int | None = None
    runs_for = _LIVENESS_S
    kill_after = _LIVENESS_S
    needs_commits = False

    def __init__(self, backend: Backend, directory: Path, side_name: str) -> None:
        self.backend = backend
        self.directory = directory
        self.side_name = side_name
        self.side: _SideWriter | None = None
        self.fired = False

    def begin(self) -> None:
        """Before the child starts."""

    def during(self) -> None:
        """Once the child has acknowledged `after` commits."""

    def finish(self, life: _Life) -> None:
        """After the child ended, before the store is checked."""

    def verify(self, store: KvStore) -> None:
        """The side writer's acknowledged writes are there; its namespaces go."""
        if self.side is not None:
            self.side.kill()
            self.side.check(store)
            self.side.drop(store)

    def close(self) -> None:
        if self.side is not None:
            self.side.kill()


class _FutureHeader(_Disruption):
    """A newer pagekv upgrades the log under the child: its header, of format 9, goes into the
    slot that does not hold the newest one, with a larger `hseq`, under the log's lock. The
    child must refuse it (`FormatTooNew`), and not one byte of the log may change after it."""

    name = "future-header"

    def __init__(self, backend: Backend, directory: Path, side_name: str, rng: random.Random):
        super().__init__(backend, directory, side_name)
        self.after = rng.randrange(1, 6)
        self.slot = -1
        self.original = b""
        self.image = b""

    def during(self) -> None:
        log = self.directory / "kv.log"
        with _log_locked(log) as fd:
            raw = os.pread(fd, 2 * _SLOT, 0)
            hseqs = [struct.unpack_from("<Q", raw, at + 8)[0] for at in (0, _SLOT)]
            newest = 0 if hseqs[0] > hseqs[1] else 1
            self.slot = 1 - newest
            self.original = raw[self.slot * _SLOT : (self.slot + 1) * _SLOT]
            header = bytearray(raw[newest * _SLOT : newest * _SLOT + _HEADER_CRC_AT + 4])
            header[:8] = b"pkvlog9\0"
            header[8:16] = struct.pack("<Q", hseqs[newest] + 1)
            crc = crc32c(bytes(header[:_HEADER_CRC_AT]))
            header[_HEADER_CRC_AT:] = struct.pack("<I", crc)
            os.pwrite(fd, header, self.slot * _SLOT)
            self.image = log.read_bytes()
        self.fired = True

    def finish(self, life: _Life) -> None:
        if not self.fired:
            if life.killed:
                raise FuzzFailure(-1, f"the child made no {self.after} commits in a life")
            return
        log = self.directory / "kv.log"
        if log.read_bytes() != self.image:
            raise FuzzFailure(-1, "the log changed after a newer pagekv's header was written")
        if life.killed:
            raise FuzzFailure(
                -1, f"the child went on for {self.runs_for:g} s past a newer log format"
            )
        with _log_locked(log) as fd:
            os.pwrite(fd, self.original, self.slot * _SLOT)


class _ShmMoved(_Disruption):
    """`kv.shm` is deleted, or a copy of it moved over it (no look at its contents can tell),
    while the child uses it; then a side writer opens the store, and maps a new one."""

    def __init__(self, backend: Backend, directory: Path, side_name: str, rng: random.Random):
        super().__init__(backend, directory, side_name)
        self.after = rng.randrange(1, 6)
        self.replace = rng.random() < 0.5
        self.name = "shm-replaced" if self.replace else "shm-deleted"
        self.runs_for = rng.uniform(0.2, 0.6)

    def during(self) -> None:
        shm = self.directory / "kv.shm"
        if self.replace:
            copy = shm.with_name("kv.shm.fuzz-copy")
            shutil.copy(shm, copy)
            os.replace(copy, shm)
        else:
            shm.unlink()
        self.side = _SideWriter(self.backend, self.side_name, 1)
        self.fired = True

    def finish(self, life: _Life) -> None:
        if not self.fired and life.killed:
            raise FuzzFailure(-1, f"the child made no {self.after} commits in a life")


class _StoppedFlusher(_Disruption):
    """A side writer of four threads (so that it flushes for a group, under the flusher lock)
    is SIGSTOPped at a moment it holds the flusher lock and not the log's, before the child
    starts, and stays stopped until its own check. The child must commit beside it."""

    name = "stopped-flusher"
    needs_commits = True

    def __init__(self, backend: Backend, directory: Path, side_name: str, rng: random.Random):
        super().__init__(backend, directory, side_name)
        self.kill_after = rng.uniform(0.2, 0.6)

    def begin(self) -> None:
        side = self.side = _SideWriter(self.backend, self.side_name, 4)
        pid = side.process.pid
        shm, log = self.directory / "kv.shm", self.directory / "kv.log"
        deadline = time.monotonic() + _LIVENESS_S
        while time.monotonic() < deadline:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.001)  # for the signal to land
            if pid in flock_holders(shm) and pid not in flock_holders(log):
                self.fired = True
                return
            os.kill(pid, signal.SIGCONT)
            time.sleep(random.uniform(0, 0.002))
        raise FuzzFailure(-1, "a side writer never held the flusher lock in 30 s")

    def finish(self, life: _Life) -> None:
        if not life.acked:
            raise FuzzFailure(
                -1,
                f"no commit in {_LIVENESS_S:g} s beside a writer stopped holding the flusher lock",
            )


def _disruption(kind: str, parent: _ParentStore, run_name: str, rng: random.Random) -> _Disruption:
    """The disruption of a life of `kind` (`future`, `shm`, `stop`) on the parent's store."""
    store = parent.held
    assert isinstance(store, FileStore), "these events are for file: stores"
    side_name = f"{run_name}/{kind}-{rng.randrange(2**32)}"
    kinds: dict[str, type[_FutureHeader] | type[_ShmMoved] | type[_StoppedFlusher]] = {
        "future": _FutureHeader,
        "shm": _ShmMoved,
        "stop": _StoppedFlusher,
    }
    return kinds[kind](parent.backend, store.path, side_name, rng)


_SLOT: Final = 512
_HEADER_CRC_AT: Final = 65
"""The log's header slots (`docs/FORMAT.md`): two of 512 bytes; in format 3, the CRC of a
header's first 65 bytes follows them."""


@contextmanager
def _log_locked(log: Path) -> Iterator[int]:
    """A descriptor of `log`, under the log's exclusive `flock`, as a pagekv writing it holds."""
    fd = os.open(log, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


_SIDE = "import sys; from pagekv.fuzz.processes import side_main; side_main(sys.argv[1:])"


def side_main(argv: list[str]) -> None:
    """Entry point of a side writer: `THREADS` threads, each putting keys `%08d` counting up
    into namespace `NAME/T` of the store, and printing `ack T I` after each; `ready` once the
    store and its namespaces are open. Runs until it is killed; an error prints `error T ...`
    and ends it. The store is `Backend.args`, then `NAME THREADS`."""
    url, factory, location, name, threads = argv
    store = Backend.from_args(url, factory, location).open()
    namespaces = [store.namespace(f"{name}/{t}") for t in range(int(threads))]

    def write(t: int) -> None:
        try:
            for i in itertools.count():
                namespaces[t].put({b"%08d" % i: b"side"})
                _say(f"ack {t} {i}")
        except BaseException as e:
            _say(f"error {t} {e!r}".replace("\n", " "))
            os._exit(3)

    _say("ready")
    for t in range(len(namespaces)):
        threading.Thread(target=write, args=(t,), daemon=True).start()
    threading.Event().wait()


class _SideWriter:
    """A side writer process (`side_main`) and the lines it printed, read by a thread."""

    def __init__(self, backend: Backend, name: str, threads: int) -> None:
        self.name = name
        self.threads = threads
        command = [sys.executable, "-c", _SIDE, *backend.args(), name, str(threads)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        assert self.process.stdout is not None
        first = self.process.stdout.readline().strip()
        if first != "ready":
            self.process.kill()
            code = self.process.wait()
            raise FuzzFailure(-1, f"a side writer failed to start (said {first!r}, exit {code})")
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self._reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.append(line.strip())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join()

    def check(self, store: KvStore) -> None:
        """Each thread's namespace holds the keys it acknowledged, and at most one more."""
        errors = [line for line in self.lines if line.startswith("error")]
        if errors:
            raise FuzzFailure(-1, f"a side writer failed: {errors[0]}")
        acked = dict.fromkeys(range(self.threads), -1)
        for line in self.lines:
            _, thread, index = line.split()
            acked[int(thread)] = int(index)
        for t, last in acked.items():
            keys = [k for k, _ in store.namespace(f"{self.name}/{t}").list()]
            if keys != [b"%08d" % i for i in range(len(keys))] or not (
                last + 1 <= len(keys) <= last + 2
            ):
                raise FuzzFailure(
                    -1,
                    f"side writer {self.name}/{t} acknowledged {last + 1} writes, and "
                    f"{len(keys)} are there (first {keys[:1]}, last {keys[-1:]})",
                )

    def drop(self, store: KvStore) -> None:
        for t in range(self.threads):
            store.namespace(f"{self.name}/{t}").drop()


def _run_child(
    backend: Backend,
    actors: list[_Actor],
    count: int,
    max_blob: int,
    disk: str,
    kill_after: float,
    disruption: _Disruption | None = None,
) -> _Life:
    """Start a child running one writer per actor from where each is, SIGKILL it after
    `kill_after` seconds (unless a full disk or the end of every sequence ended it first), and
    return what it reported (`child_main`). A `disruption` begins before the child starts and
    acts once the child has acknowledged `disruption.after` commits; the child then runs for
    `disruption.runs_for` more seconds."""
    if disruption is not None:
        disruption.begin()
    specs = [f"{a.name}:{a.seed}:{a.done}" for a in actors]
    command = [sys.executable, "-c", _CHILD, *backend.args(), str(count), str(max_blob), disk]
    command += specs
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    life = _Life(acked={}, compactions={}, faults=[], errors=[])
    acks = 0
    try:
        first = child.stdout.readline().strip()
        if first != "ready":
            child.kill()
            code = child.wait()
            raise FuzzFailure(
                actors[0].done, f"child failed to start (said {first!r}, exit {code})"
            )
        kill_at = time.monotonic() + kill_after
        waited = False
        while True:
            remaining = kill_at - time.monotonic()
            if remaining <= 0:
                if disruption is not None and disruption.needs_commits and not acks and not waited:
                    waited = True  # no commit yet: give the child every chance to make one
                    kill_at = time.monotonic() + _LIVENESS_S
                    continue
                life.killed = True
                break
            ready, _, _ = select.select([child.stdout], [], [], remaining)
            if not ready:
                continue
            line = child.stdout.readline()
            if not line or line.strip() == "done":
                break
            _parse(line, life)
            if not line.startswith("ack "):
                continue
            acks += 1
            if waited:
                kill_at, waited = time.monotonic() + kill_after, False
            if disruption is not None and acks == disruption.after:
                disruption.during()
                kill_at = time.monotonic() + disruption.runs_for
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout:
            _parse(line, life)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return life


def _parse(line: str, life: _Life) -> None:
    """Take one line of the child's (`child_main`) into `life`."""
    word = line.split(" ", 1)[0]
    if word == "ack":
        _, w, n, compactions, writes, flushes = line.split()
        life.acked[int(w)] = int(n)
        life.compactions[int(w)] = int(compactions)
        life.flushes = max(life.flushes, (int(writes), int(flushes)))
    elif word == "fault":
        life.faults.append(line.strip())
    elif word == "error":
        life.errors.append(line.strip())
