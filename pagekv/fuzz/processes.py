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

The store is a `file:` URL's, or a user's backend (`Backend`): a store factory each process calls
with the one location they share. The parent opens a factory's store only between child lives,
as a backend may let a single process at a time open a location.
"""

from __future__ import annotations

import os
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import apsw

from pagekv.fuzz.oracle import Oracle, digest, run_txn
from pagekv.fuzz.runner import Coverage, FuzzFailure
from pagekv.fuzz.steps import PROCESS_EVENTS, StepGenerator, Txn
from pagekv.kv import FileStore, KvError, KvStore, open_kv
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
    `done W` when its sequence is over. `disk` is `-`, or `AFTER:SEED`: fill the disk after the
    child's `AFTER`th commit (of any writer), at a point drawn from `SEED`; the first commit that
    fails then prints `fault W N WHERE typed|untyped ...` and ends the child. Any other error
    prints `error W ...` and ends it too. The store is `Backend.args`, the writers
    `ACTOR:SEED:START` arguments."""
    url, factory, location, count, max_blob, disk, *writers = argv
    if disk != "-" and "log_kib=" not in url:
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
    if disk != "-":  # here: only the main thread may set a handler
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
        self.after = int(disk.split(":")[0]) if disk != "-" else -1
        self.seed = int(disk.split(":")[1]) if disk != "-" else 0
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
                if not fill.filled:
                    raise
                cause = db.take_last_kv_error()
                typed = "typed" if isinstance(cause, KvError) else "untyped"
                _say(f"fault {w} {n} {fill.where} {typed} {cause!r} {e!r}")
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
    if "disk" in events and backend.factory is not None:
        raise ValueError("the disk event fills a file: store's files; a factory's store has none")
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
    fills = "disk" in events
    while time.monotonic() < deadline:
        live = [a for a in actors if a.done < len(a.txns)]
        if not live:
            break
        disk = "-"
        if fills and ("crash" not in events or rng.random() < 1 / 3):
            disk = f"{rng.randrange(4 * len(live))}:{rng.randrange(2**32)}"
        # A life that fills the disk ends by itself unless crashes are wanted too.
        kill_after = rng.uniform(0.0, 0.3) if disk == "-" or "crash" in events else 60.0
        life = _run_child(parent.backend, live, count, max_blob, disk, kill_after)
        if life.errors:
            raise FuzzFailure(live[0].done, f"a child's writer failed: {life.errors[0]}")
        if not life.faults:
            coverage.crashes += 1
        else:
            for fault in life.faults:
                if fault.split()[4] != "typed":
                    raise FuzzFailure(
                        live[0].done, f"the disk filled up with an untyped error: {fault}"
                    )
            coverage.faults[f"disk-{life.faults[0].split()[3]}"] += 1
            coverage.failed_commits += len(life.faults)
        coverage.compactions += sum(life.compactions.values())
        coverage.store_writes += life.flushes[0]
        coverage.store_flushes += life.flushes[1]
        try:
            with parent.opened() as store:
                for w, actor in enumerate(live):
                    _verify(store, actor, life.acked.get(w, actor.done - 1))
                    coverage.verifications += 1
        except FuzzFailure:
            raise
        except Exception as e:  # a store that fails to reopen, a database that fails to open
            raise FuzzFailure(
                live[0].done, f"checking the store after the child ended: {type(e).__name__}: {e}"
            ) from e
        coverage.commits = coverage.steps = committed_before + sum(a.done for a in actors)
    with parent.opened() as store:
        for actor in actors:
            store.namespace(actor.name).drop()


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


def _run_child(
    backend: Backend, actors: list[_Actor], count: int, max_blob: int, disk: str, kill_after: float
) -> _Life:
    """Start a child running one writer per actor from where each is, SIGKILL it after
    `kill_after` seconds (unless a full disk or the end of every sequence ended it first), and
    return what it reported (`child_main`)."""
    specs = [f"{a.name}:{a.seed}:{a.done}" for a in actors]
    command = [sys.executable, "-c", _CHILD, *backend.args(), str(count), str(max_blob), disk]
    command += specs
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    life = _Life(acked={}, compactions={}, faults=[], errors=[])
    try:
        if child.stdout.readline().strip() != "ready":
            raise FuzzFailure(actors[0].done, f"child failed to start (exit {child.wait()})")
        kill_at = time.monotonic() + kill_after
        while True:
            remaining = kill_at - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([child.stdout], [], [], remaining)
            if not ready:
                break
            line = child.stdout.readline()
            if not line or line.strip() == "done":
                break
            _parse(line, life)
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
