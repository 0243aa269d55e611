"""Durability and cross-process fencing of the `file://` backend, with real processes.

The children are this very file run as a script (`python test_file_durability.py writer ...`), so
the batch recipe the writer uses and the one the checker replays are the same function.

1. `test_sigkill_leaves_a_prefix_of_acknowledged_batches`: a child writes deterministic, numbered
   batches (puts of fresh keys, an overwrite of a shared key, deletes of keys of an older batch) and
   prints `ack N` after each `write` returns; the parent SIGKILLs it at seeded random moments and
   checks after each kill that the store holds exactly the replay of batches `0..k`, where `k` is
   the last acknowledged batch or the one in flight — never a partial batch — and that
   `used_bytes()` is exact. (SIGKILL ends the process, not the machine: the page cache survives,
   so this proves atomicity and acknowledgement order, not that the fsync reached the disk.)
2. `test_sigkill_of_concurrent_writer_threads_in_several_processes`: three children share one
   folding log, each with several threads writing their own namespaces (creating new ones as
   they go) and one writing a shared namespace with fenced writes and takeovers; with slowed
   flushes the writers group their commits. All are SIGKILLed at random moments; after each
   kill every acknowledged op is there and nothing beyond one op in flight per thread, usage is
   exact, ids stable, generations never reissued; the children's `flush_counts()` show that
   flushes were shared, and their `go` lines that kills landed with writes in flight. Its
   `power-loss` variants also cut the log back to what a power loss at the kill may have left
   (the children journal every write and flush of it): only there would an acknowledgement that
   no flush covered show up as a lost write.
3. `test_two_processes_racing_takeovers`: two children start together and loop takeover + fenced
   writes on one namespace; the parent checks the generations, the acknowledged and rejected writes
   against what is stored, and, with the system-wide monotonic clock, that no write was accepted
   after a newer takeover had finished or rejected before any newer takeover had begun.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest

from pagekv.kv import FenceMismatch, FileStore, KvLimits, KvUnavailable, open_kv

REPO_ROOT = Path(__file__).resolve().parents[2]
ACTOR = "durable-actor"
HEAD = b"head"
KILLS = 10
# The default log, which these tests never fill, and one so small that the processes fold it into
# the base every few writes, so kills and races also land inside folds.
LOG_SIZES = ["", "?log_kib=8"]
LOG_IDS = ["default-log", "folding-log"]


# --- the batch recipe shared by the writer child and the checker ------------------------------


def _count(seed: int, n: int) -> int:
    """Number of fresh keys batch `n` puts (the first draw of its generator)."""
    return random.Random(f"{seed}:{n}").randint(5, 20)


def batch(seed: int, n: int) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Batch `n`: 5-20 fresh keys, an overwrite of `head`, and deletes of keys of batch `n-3`."""
    rng = random.Random(f"{seed}:{n}")
    count = rng.randint(5, 20)
    puts: dict[bytes, bytes] = {}
    for j in range(count):
        big = rng.random() < 0.1
        size = rng.randint(4096, 40_000) if big else rng.randint(0, 4096)
        puts[b"b%06d-%02d" % (n, j)] = rng.randbytes(size)
    puts[HEAD] = b"%d:" % n + rng.randbytes(rng.randint(0, 3000))
    deletes = []
    if n >= 3:
        deletes = [b"b%06d-%02d" % (n - 3, j) for j in range(_count(seed, n - 3)) if j % 4 == 1]
    return puts, deletes


def apply_batch(model: dict[bytes, bytes], seed: int, n: int) -> None:
    puts, deletes = batch(seed, n)
    for key in deletes:
        model.pop(key, None)
    model.update(puts)


def _stream(*args: str) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def _integrity_ok(directory: Path) -> None:
    db = apsw.Connection(str(directory / "kv.sqlite3"))
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()


# --- 0. the durability settings are really applied --------------------------------------------


def test_file_store_base_runs_truncate_and_synchronous_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement the store's connection runs is traced: both pragmas must actually run.

    (This SQLite build defaults to synchronous=FULL, so reading the setting back would not catch a
    pragma that never ran; builds whose default is NORMAL would silently lose durability.)
    """
    executed: list[str] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        executed.append(" ".join(sql.split()).rstrip(";").upper())
        return True

    def hook(connection: apsw.Connection) -> None:
        connection.exec_trace = trace

    monkeypatch.setattr(apsw, "connection_hooks", [*apsw.connection_hooks, hook])
    store = open_kv(f"file://{tmp_path / 'store'}")
    try:
        assert "PRAGMA JOURNAL_MODE=TRUNCATE" in executed
        assert "PRAGMA SYNCHRONOUS=FULL" in executed
    finally:
        store.close()
    db = apsw.Connection(str(tmp_path / "store" / "kv.sqlite3"))
    try:
        assert db.execute("PRAGMA journal_mode").get == "delete"  # rollback mode, the default
    finally:
        db.close()


def _folded_epochs(directory: Path) -> int:
    db = apsw.Connection(str(directory / "kv.sqlite3"))
    try:
        return db.execute("SELECT epoch FROM log_state").get
    finally:
        db.close()


# --- 1. SIGKILL durability ---------------------------------------------------------------------


def _writer(url: str, seed: int, start: int, actor: str = ACTOR) -> None:
    store = open_kv(url)
    ns = store.namespace(actor)
    fence = ns.generation()
    n = start
    while True:
        puts, deletes = batch(seed, n)
        ns.write(put=puts, delete=deletes, fence=fence)
        print(f"ack {n}", flush=True)
        n += 1


def _read_acks(child: subprocess.Popen[str], want: int) -> list[int]:
    """The first `want` batch numbers a writer acknowledged (it keeps writing meanwhile)."""
    assert child.stdout is not None
    acked: list[int] = []
    while len(acked) < want:
        line = child.stdout.readline()
        if not line:
            raise AssertionError(f"writer exited {child.wait()} early: {_stderr(child)}")
        acked.append(int(line.split()[1]))
    return acked


def _killed_acks(child: subprocess.Popen[str]) -> list[int]:
    """The acknowledgements a SIGKILLed writer printed after those already read.

    Read through the same buffered stream as `_read_acks`: `communicate()` would read the pipe
    underneath it and miss lines the stream had already buffered.
    """
    assert child.stdout is not None
    rest = child.stdout.read()
    assert child.wait(timeout=30) == -signal.SIGKILL, _stderr(child)
    return [int(line.split()[1]) for line in rest.splitlines()]


def _stderr(child: subprocess.Popen[str]) -> str:
    assert child.stderr is not None
    return child.stderr.read()


def _stored_head(items: list[tuple[bytes, bytes]]) -> int:
    """The number of the last batch applied, read from its overwrite of `head` (-1: none)."""
    value = dict(items).get(HEAD)
    return -1 if value is None else int(value.split(b":", 1)[0])


@pytest.mark.parametrize("query", LOG_SIZES, ids=LOG_IDS)
def test_sigkill_leaves_a_prefix_of_acknowledged_batches(tmp_path: Path, query: str) -> None:
    seed = 20240611
    rng = random.Random(seed)
    directory = tmp_path / "store"
    url = f"file://{directory}{query}"
    store = open_kv(url)
    store.namespace(ACTOR).takeover()  # the writer fences every batch with generation 1
    store.close()

    model: dict[bytes, bytes] = {}
    applied = -1  # the last batch in the store
    kills = 0
    in_flight_seen = 0
    for _round in range(KILLS):
        target = rng.randint(10, 80)
        child = _stream("writer", url, str(seed), str(applied + 1))
        acked = _read_acks(child, target)
        time.sleep(rng.uniform(0, 0.003))  # land the kill at a random point of a later write
        child.send_signal(signal.SIGKILL)
        acked += _killed_acks(child)
        kills += 1
        # Acks are consecutive from where this round started, so each round made real progress.
        assert acked == list(range(applied + 1, applied + 1 + len(acked)))
        assert len(acked) >= target
        last_ack = acked[-1]

        store = open_kv(url)
        ns = store.namespace(ACTOR)
        items = ns.list()
        k = _stored_head(items)
        # Every acknowledged batch is there; at most the one batch in flight beyond it.
        assert k in (last_ack, last_ack + 1), (k, last_ack)
        in_flight_seen += k == last_ack + 1
        for n in range(applied + 1, k + 1):
            apply_batch(model, seed, n)
        # The store is exactly the replay of batches 0..k: no partial batch, nothing reordered.
        assert dict(items) == model
        assert [key for key, _ in items] == sorted(model)
        assert ns.used_bytes() == sum(len(key) + len(v) for key, v in model.items())
        assert ns.generation() == 1
        store.close()
        _integrity_ok(directory)
        applied = k

    assert kills == KILLS
    assert applied >= KILLS * 10
    # The store is still writable after the crashes: one more batch from here.
    store = open_kv(url)
    ns = store.namespace(ACTOR)
    puts, deletes = batch(seed, applied + 1)
    ns.write(put=puts, delete=deletes, fence=1)
    apply_batch(model, seed, applied + 1)
    assert dict(ns.list()) == model
    assert ns.used_bytes() == sum(len(key) + len(v) for key, v in model.items())
    store.close()
    folds = _folded_epochs(directory)
    assert folds >= (KILLS if query else 0), folds  # the small log folded between the kills
    print(f"kills={kills} batches={applied + 2} in-flight batches found committed={in_flight_seen}")
    print(f"log epochs folded into the base: {folds}")


def test_sigkill_of_several_writers_sharing_one_folding_log(tmp_path: Path) -> None:
    """Three processes append to one log (each to its own namespace), fold it every few writes
    and catch up with each other's records; all are killed at random moments, several times.
    Each namespace must then hold exactly a prefix of its own batches, ending at its last
    acknowledged batch or the one in flight."""
    rng = random.Random(20261130)
    directory = tmp_path / "store"
    url = f"file://{directory}?log_kib=8"
    writers = {f"writer-{k}": 1000 + k for k in range(3)}  # namespace -> batch seed
    store = open_kv(url)
    for actor in writers:
        store.namespace(actor).takeover()
    store.close()
    applied = dict.fromkeys(writers, -1)
    models: dict[str, dict[bytes, bytes]] = {actor: {} for actor in writers}
    for _round in range(4):
        children = {
            actor: _stream("writer", url, str(seed), str(applied[actor] + 1), actor)
            for actor, seed in writers.items()
        }
        acked = {actor: _read_acks(child, rng.randint(5, 25)) for actor, child in children.items()}
        for child in children.values():
            time.sleep(rng.uniform(0, 0.002))
            child.send_signal(signal.SIGKILL)
        for actor, child in children.items():
            acked[actor] += _killed_acks(child)
        store = open_kv(url)
        for actor, seed in writers.items():
            ns = store.namespace(actor)
            items = ns.list()
            last_ack = acked[actor][-1]
            assert acked[actor] == list(range(applied[actor] + 1, last_ack + 1))
            k = _stored_head(items)
            assert k in (last_ack, last_ack + 1), (actor, k, last_ack)
            for n in range(applied[actor] + 1, k + 1):
                apply_batch(models[actor], seed, n)
            assert dict(items) == models[actor], actor
            assert ns.used_bytes() == sum(len(a) + len(b) for a, b in items)
            assert ns.generation() == 1
            applied[actor] = k
        store.close()
        _integrity_ok(directory)
    folds = _folded_epochs(directory)
    assert folds >= 20, folds  # the writers folded each other's records many times
    print(f"batches per writer: {applied}; log epochs folded: {folds}")


# --- 2. two processes racing takeovers ----------------------------------------------------------

RACE_ACTOR = "contended-actor"


def _key_gen(key: bytes) -> int:
    """The fence generation encoded in a racer's key `p{proc}-g{gen}-i{i}`."""
    return int(key.split(b"-")[1][1:])


def _racer(url: str, proc: int, iterations: int, writes: int, barrier: str) -> None:
    store = open_kv(url)
    ns = store.namespace(RACE_ACTOR)
    Path(barrier, f"ready-{proc}").touch()
    deadline = time.monotonic() + 20
    while not Path(barrier, "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no start signal")
        time.sleep(0.0005)

    rng = random.Random(proc)

    def out(**record: object) -> None:
        print(json.dumps(record), flush=True)
        # Leave the write lock free for a moment so the other racer's busy wait can win it;
        # without this one process tends to run many iterations back to back.
        time.sleep(rng.uniform(0, 0.001))

    for _ in range(iterations):
        t0 = time.monotonic_ns()
        gen = ns.takeover()
        t1 = time.monotonic_ns()
        # What the new owner sees of older generations right after its takeover: from now on no
        # write fenced with an older generation may land, so this must never grow.
        older = sum(_key_gen(key) < gen for key, _ in ns.list())
        out(op="takeover", proc=proc, gen=gen, t0=t0, t1=t1, older=older)
        for i in range(writes):
            key = f"p{proc}-g{gen}-i{i}"
            value = f"{proc}:{gen}:{i}".encode()
            t0 = time.monotonic_ns()
            try:
                ns.write(put={key.encode(): value}, fence=gen)
            except FenceMismatch as e:
                out(op="reject", key=key, gen=gen, current=e.current, t0=t0, t1=time.monotonic_ns())
            else:
                out(op="ack", key=key, gen=gen, t0=t0, t1=time.monotonic_ns())


@pytest.mark.parametrize("query", LOG_SIZES, ids=LOG_IDS)
def test_two_processes_racing_takeovers(tmp_path: Path, query: str) -> None:
    directory = tmp_path / "store"
    url = f"file://{directory}{query}"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    open_kv(url).close()
    iterations, writes = 40, 6
    children = [
        _stream("racer", url, str(p), str(iterations), str(writes), str(barrier)) for p in (0, 1)
    ]
    deadline = time.monotonic() + 20
    while not all((barrier / f"ready-{p}").exists() for p in (0, 1)):
        assert time.monotonic() < deadline, "racers never got ready"
        assert all(c.poll() is None for c in children), [c.communicate() for c in children]
        time.sleep(0.001)
    (barrier / "go").touch()
    records: list[dict[str, Any]] = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        records += [json.loads(line) for line in out.splitlines()]

    takeovers = [r for r in records if r["op"] == "takeover"]
    acks = [r for r in records if r["op"] == "ack"]
    rejects = [r for r in records if r["op"] == "reject"]
    assert len(takeovers) == 2 * iterations
    assert len(acks) + len(rejects) == 2 * iterations * writes
    # Each takeover was an atomic increment: generations 1..T, each handed out exactly once.
    gens = sorted(int(r["gen"]) for r in takeovers)
    assert gens == list(range(1, len(takeovers) + 1))
    assert rejects, "the race never happened: no write was fenced out"
    assert {r["proc"] for r in takeovers} == {0, 1}

    started = {int(r["gen"]): int(r["t0"]) for r in takeovers}
    finished = {int(r["gen"]): int(r["t1"]) for r in takeovers}
    last = len(takeovers)
    for r in acks:
        gen, t0 = int(r["gen"]), int(r["t0"])
        # Accepted under fence `gen`: no newer takeover may have finished before the write began.
        newer_done = min((finished[g] for g in range(gen + 1, last + 1)), default=None)
        assert newer_done is None or t0 < newer_done, r
    for r in rejects:
        gen, current, t1 = int(r["gen"]), int(r["current"]), int(r["t1"])
        # Rejected: the generation it saw is newer and that takeover began before the write ended.
        assert gen < current <= last, r
        assert started[current] < t1, r

    # Once a fence is rejected it stays rejected: per (process, generation) the acks are a prefix.
    by_gen: dict[int, list[tuple[int, bool]]] = {}
    for r in [*acks, *rejects]:
        i = int(str(r["key"]).rsplit("-i", 1)[1])
        by_gen.setdefault(int(r["gen"]), []).append((i, r["op"] == "ack"))
    for outcomes in by_gen.values():
        flags = [ok for _, ok in sorted(outcomes)]
        assert flags == sorted(flags, reverse=True), outcomes

    store = open_kv(url)
    ns = store.namespace(RACE_ACTOR)
    assert ns.generation() == len(takeovers)
    stored = dict(ns.list())
    expected: dict[bytes, bytes] = {}
    for r in acks:
        proc, gen, i = str(r["key"])[1:].split("-")
        expected[str(r["key"]).encode()] = f"{proc}:{gen[1:]}:{i[1:]}".encode()
    # Every acknowledged write is present with its value; no rejected write is.
    assert stored == expected
    assert not {str(r["key"]).encode() for r in rejects} & stored.keys()
    # No stale write landed after a takeover: each new owner saw, right after its takeover, every
    # older-generation key that is stored now.
    for r in takeovers:
        assert sum(_key_gen(key) < r["gen"] for key in stored) == r["older"], r
    assert ns.used_bytes() == sum(len(k) + len(v) for k, v in stored.items())
    store.close()
    _integrity_ok(directory)
    folds = _folded_epochs(directory)
    assert folds >= (10 if query else 0), folds
    print(f"takeovers={len(takeovers)} acks={len(acks)} rejects={len(rejects)} folds={folds}")


# --- 3. SIGKILL of several processes, each with several writing threads -------------------------

SHARED = "shared-actor"
CREATE_EVERY = 3
"""Op `n` of an own-namespace thread with `n % CREATE_EVERY == 1` first creates namespace
`ACTOR/cN` and puts its marker there, so namespaces are created all through the run."""


def thread_batch(actor: str, n: int) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Batch `n` of an own-namespace thread: 1-4 fresh keys (mostly small, so many writes fit
    between flushes), an overwrite of `head`, and deletes of keys of batch `n-2`."""
    rng = random.Random(f"{actor}:{n}")
    count = rng.randint(1, 4)
    puts: dict[bytes, bytes] = {}
    for j in range(count):
        size = rng.randint(5000, 12000) if rng.random() < 0.05 else rng.randint(0, 1500)
        puts[b"b%06d-%d" % (n, j)] = rng.randbytes(size)
    puts[HEAD] = b"%d:" % n + rng.randbytes(rng.randint(0, 300))
    deletes = []
    if n >= 2:
        older = random.Random(f"{actor}:{n - 2}").randint(1, 4)  # the first draw: its count
        deletes = [b"b%06d-%d" % (n - 2, j) for j in range(older) if j % 2 == 1]
    return puts, deletes


def _marker(name: str) -> bytes:
    """What a created namespace holds under `n`: its name, and a size that varies."""
    return name.encode() * random.Random(name).randint(1, 40)


def _shared_value(key: str) -> bytes:
    return key.encode() * random.Random(key).randint(1, 30)


def _emit(line: str) -> None:
    """One line on stdout in one `write` (atomic on a pipe): threads never interleave."""
    os.write(1, (line + "\n").encode())


def _own_thread(store: FileStore, actor: str, start: int) -> None:
    """Write batches `start..` to namespace `actor` (created here if new), each op announced
    (`go`) before it starts and acknowledged (`ack ACTOR N CREATED-ID`) after it returned."""
    ns = store.namespace(actor)
    _emit(f"id {actor} {ns._id}")
    n = start
    while True:
        _emit(f"go {actor} {n}")
        created = "-"
        if n % CREATE_EVERY == 1:
            name = f"{actor}/c{n}"
            new = store.namespace(name)
            new.put({b"n": _marker(name)})
            created = str(new._id)
        puts, deletes = thread_batch(actor, n)
        ns.write(put=puts, delete=deletes, fence=0)
        _emit(f"ack {actor} {n} {created}")
        n += 1


def _shared_thread(store: FileStore, name: str) -> None:
    """Take over the shared namespace, write fenced keys until fenced out, take over again."""
    ns = store.namespace(SHARED)
    rng = random.Random(name)
    i = 0
    while True:
        _emit(f"go {name} take")
        gen = ns.takeover()
        _emit(f"take {name} {gen}")
        while True:
            key = f"{name}-g{gen}-i{i}"
            _emit(f"go {name} {key}")
            try:
                ns.write(put={key.encode(): _shared_value(key)}, fence=gen)
            except FenceMismatch:
                _emit(f"rej {name} {key}")
                time.sleep(rng.uniform(0, 0.003))  # let the new owner's writes through
                break
            _emit(f"sack {name} {key}")
            i += 1


def _threads_child(directory: str, spec_json: str) -> None:
    """A child of `test_sigkill_of_concurrent_writer_threads_in_several_processes`: its threads
    write until killed,
    and one reports the store's `flush_counts()` every 20 ms (`flush WRITES FLUSHES FOLDS`)."""
    spec = json.loads(spec_json)
    if spec.get("journal"):
        _journal_log_io(Path(directory) / "kv.log", Path(spec["journal"]), spec["flush_delay_ms"])
    store = FileStore(
        directory,
        log_bytes=spec["log_kib"] * 1024,
        flush_delay_ms=0 if spec.get("journal") else spec["flush_delay_ms"],  # journaled: inside
    )

    def run(target: Any, *args: object) -> None:
        try:
            target(*args)
        except BaseException as e:
            _emit(f"error {args[-1]} {e!r}")
            os._exit(3)

    threads = [
        threading.Thread(target=run, args=(_own_thread, store, a, s), daemon=True)
        for a, s in spec["own"].items()
    ]
    threads += [
        threading.Thread(target=run, args=(_shared_thread, store, name), daemon=True)
        for name in spec["shared"]
    ]
    for thread in threads:
        thread.start()
    while True:
        counts = store.flush_counts()
        _emit(f"flush {counts.writes} {counts.flushes} {counts.folds}")
        time.sleep(0.02)


# A power loss keeps what reached the disk, not what a SIGKILL keeps (the page cache). To see
# what a power loss at the kill would have kept of `kv.log`, the children journal every write and
# flush of it to one file shared by all of them (`O_APPEND`: one total order). A buffered write
# is on the disk once a flush that began after it returned has ended; an `O_DSYNC` write once it
# returned. The parent rebuilds `kv.log` from the image it had before the life and the journal,
# keeping those writes and, as a power loss may, a random few of the others (possibly torn),
# then checks the store as after a kill. (The base is SQLite's, and stays as the kill left it:
# with `synchronous=FULL` its own journal makes either outcome the same.)

_JOURNAL = struct.Struct("<cQQI")
"""kind | id | offset | length, then `length` bytes of data for a write's start: `W` buffered
write started, `w` ended (`length`: bytes written), `D`/`d` the same for a direct `O_DSYNC`
write, `S`/`s` a flush started/ended."""


def _journal_log_io(log: Path, journal: Path, flush_ms: float) -> None:
    """Patch `os.pwrite`, `os.pwritev` and `os.fdatasync` so that those on `log` are journaled
    (the store's `log.py` calls them through `os`, compiled or not). A flush takes `flush_ms`
    more between its start and its end, as on a slow disk (`flush_delay_ms` sleeps after the
    flush has ended, when nothing is at risk any more)."""
    st = os.stat(log)
    key = (st.st_dev, st.st_ino)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    ids = itertools.count(os.getpid() << 32)
    pwrite, pwritev, fdatasync = os.pwrite, os.pwritev, os.fdatasync

    def on_log(target: int) -> bool:
        st = os.fstat(target)
        return (st.st_dev, st.st_ino) == key

    def note(kind: bytes, i: int, offset: int = 0, length: int = 0, data: bytes = b"") -> None:
        os.write(fd, _JOURNAL.pack(kind, i, offset, length) + data)

    def journaled_pwrite(target: int, data: Any, offset: int) -> int:
        if not on_log(target):
            return pwrite(target, data, offset)
        i, raw = next(ids), bytes(data)
        note(b"W", i, offset, len(raw), raw)
        written = pwrite(target, data, offset)
        note(b"w", i, offset, written)
        return written

    def journaled_pwritev(target: int, buffers: Any, offset: int) -> int:
        if not on_log(target):
            return pwritev(target, buffers, offset)
        i, raw = next(ids), b"".join(bytes(b) for b in buffers)
        note(b"D", i, offset, len(raw), raw)
        written = pwritev(target, buffers, offset)
        note(b"d", i, offset, written)
        return written

    def journaled_fdatasync(target: int) -> None:
        if not on_log(target):
            return fdatasync(target)
        i = next(ids)
        note(b"S", i)
        time.sleep(flush_ms / 1000)
        fdatasync(target)
        note(b"s", i)
        return None

    os.pwrite, os.pwritev = journaled_pwrite, journaled_pwritev  # type: ignore[assignment]
    os.fdatasync = journaled_fdatasync  # type: ignore[assignment]


@dataclass
class _PowerLoss:
    """What the power losses of a test did to the log's writes."""

    lost: int = 0
    kept: int = 0
    """Not durable, but kept, as a power loss may (possibly torn)."""
    direct: int = 0
    """`O_DSYNC` writes (a writer alone) and buffered ones, which wait for a flush."""
    buffered: int = 0


def _power_loss_image(
    baseline: bytes, journal: bytes, rng: random.Random, keep: float, counts: _PowerLoss
) -> bytes:
    """What a power loss at the end of `journal` may leave of a log that was `baseline` (on
    disk) before it: every write the journal shows durable, and each other one with
    probability `keep` (one that had not returned, torn at a random sector); with `keep` above
    0 the run's first such write is kept, so that a run keeps one surely (the seed alone does
    not fix which writes a loaded machine leaves unflushed)."""
    starts: list[tuple[int, bytes, int, bytes]] = []  # (id, kind, offset, data) in write order
    ended: dict[int, tuple[int, int]] = {}  # id -> (journal index, bytes written)
    last_flush_start = -1  # the journal index of the latest flush start whose end is there
    flush_starts: dict[int, int] = {}
    at = index = 0
    while at < len(journal):
        kind, i, offset, length = _JOURNAL.unpack_from(journal, at)
        at += _JOURNAL.size
        if kind in (b"W", b"D"):
            starts.append((i, kind, offset, journal[at : at + length]))
            at += length
        elif kind in (b"w", b"d"):
            ended[i] = (index, length)
        elif kind == b"S":
            flush_starts[i] = index
        elif kind == b"s":
            last_flush_start = max(last_flush_start, flush_starts[i])
        index += 1
    assert at == len(journal), "a torn journal entry: the journal itself is not atomic"
    image = bytearray(baseline)
    for i, kind, offset, data in starts:
        end = ended.get(i)
        counts.direct += kind == b"D"
        counts.buffered += kind == b"W"
        if end is not None and (kind == b"D" or end[0] < last_flush_start):
            durable = data[: end[1]]
        elif keep > 0 and (counts.kept == 0 or rng.random() < keep):
            counts.kept += 1
            durable = data[: end[1]] if end is not None else data[: rng.randrange(len(data) + 1)]
            if end is None:  # torn: whole sectors of it
                durable = durable[: len(durable) // 512 * 512]
        else:
            counts.lost += 1
            continue
        if offset > len(image):
            image.extend(bytes(offset - len(image)))
        image[offset : offset + len(durable)] = durable
    return bytes(image)


class _Child:
    """A running child and the lines it has printed so far (read by a thread of ours)."""

    def __init__(self, *args: str) -> None:
        self.process = _stream(*args)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def acks(self) -> int:
        return sum(line.startswith(("ack ", "sack ")) for line in self.lines)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def collect(self) -> list[str]:
        """Every line it printed, once it was killed and the pipe drained."""
        self._reader.join(30)
        assert self.process.wait(timeout=30) == -signal.SIGKILL, _stderr(self.process)
        errors = [line for line in self.lines if line.startswith("error ")]
        assert not errors, (errors, _stderr(self.process))
        return self.lines


@dataclass
class _Own:
    """The parent's model of one own-namespace thread's namespace."""

    start: int = 0  # the next life starts at this op
    model: dict[bytes, bytes] = field(default_factory=dict)
    created: dict[str, bytes] = field(default_factory=dict)  # acknowledged `ACTOR/cN`


@dataclass
class _Shared:
    """The parent's model of the shared namespace, over every life."""

    model: dict[bytes, bytes] = field(default_factory=dict)
    generation: int = 0
    gens: set[int] = field(default_factory=set)  # every acknowledged takeover's generation
    rejected: set[bytes] = field(default_factory=set)


def _check_own(
    store: FileStore, actor: str, own: _Own, lines: list[str], names: set[str], optional: set[str]
) -> tuple[int, bool, bool]:
    """Check namespace `actor` after a kill against what its thread acknowledged; return its new
    start, whether an op was in flight at the kill, and whether that op was found committed.
    Names the op in flight may have created go to `optional`."""
    acks = [line.split() for line in lines if line.startswith(f"ack {actor} ")]
    goes = [int(line.split()[2]) for line in lines if line.startswith(f"go {actor} ")]
    acked = [int(a[2]) for a in acks]
    # Acknowledged in order from where the life started: each op returned once.
    assert acked == list(range(own.start, own.start + len(acked))), (actor, acked)
    last_ack = own.start - 1 + len(acked)
    in_flight = bool(goes) and goes[-1] == last_ack + 1
    if actor not in names:  # killed before its creation was durable: nothing was acknowledged
        assert not acked and not any(line.startswith(f"id {actor} ") for line in lines), actor
        return own.start, in_flight, False
    ns = store.namespace(actor)
    items = ns.list()
    k = _stored_head(items)
    # Every acknowledged op is there; beyond it only the one in flight.
    assert k == last_ack or (k == last_ack + 1 and in_flight), (actor, k, last_ack, goes[-1:])
    for n in range(own.start, k + 1):
        puts, deletes = thread_batch(actor, n)
        for key in deletes:
            own.model.pop(key, None)
        own.model.update(puts)
        if n % CREATE_EVERY == 1:
            own.created[f"{actor}/c{n}"] = _marker(f"{actor}/c{n}")
    assert dict(items) == own.model, actor
    assert ns.used_bytes() == sum(len(key) + len(v) for key, v in own.model.items()), actor
    assert ns.generation() == 0
    for name, marker in own.created.items():  # created before the batch that acknowledged it
        assert name in names, (name, "created and acknowledged, then lost")
        created = store.namespace(name)
        assert created.list() == [(b"n", marker)], name
        assert created.used_bytes() == 1 + len(marker)
    if (k + 1) % CREATE_EVERY == 1:
        name = f"{actor}/c{k + 1}"
        optional.add(name)
        if name in names:  # the op in flight got as far as creating it
            assert in_flight, name
            assert store.namespace(name).list() in ([], [(b"n", _marker(name))]), name
    return k + 1, in_flight, k == last_ack + 1


def _check_shared(
    store: FileStore, shared: _Shared, lines: list[str], threads: list[str], names: set[str]
) -> int:
    """Check the shared namespace after a kill; return how many of its threads had an op in
    flight."""
    acked: dict[bytes, bytes] = {}
    in_flight_keys: set[bytes] = set()
    takes_acked, takes_in_flight, in_flight = [], 0, 0
    for name in threads:
        last_go: str | None = None
        for line in lines:
            word, *rest = line.split()
            if len(rest) < 2 or rest[0] != name:
                continue
            if word == "go":
                last_go = rest[1]
            elif word == "take":
                takes_acked.append(int(rest[1]))
                last_go = None
            elif word == "sack":
                acked[rest[1].encode()] = _shared_value(rest[1])
                last_go = None
            elif word == "rej":
                shared.rejected.add(rest[1].encode())
                last_go = None
        if last_go is not None:
            in_flight += 1
            if last_go == "take":
                takes_in_flight += 1
            else:
                in_flight_keys.add(last_go.encode())
    if SHARED not in names:
        assert not acked and not takes_acked
        return in_flight
    ns = store.namespace(SHARED)
    stored = dict(ns.list())
    # Generations are handed out once each, across lives: none acknowledged was lost and reissued.
    assert not shared.gens & set(takes_acked) and len(set(takes_acked)) == len(takes_acked)
    shared.gens.update(takes_acked)
    generation = ns.generation()
    assert max(takes_acked, default=0) <= generation, (takes_acked, generation)
    assert generation <= shared.generation + len(takes_acked) + takes_in_flight
    assert all(g > shared.generation for g in takes_acked)
    shared.generation = generation
    for key, value in acked.items():
        assert stored.get(key) == value, (key, "acknowledged, then lost")
    assert not shared.rejected & stored.keys(), "a fenced-out write was applied"
    extra = stored.keys() - shared.model.keys() - acked.keys()
    assert extra <= in_flight_keys, ("unacknowledged writes beyond those in flight", extra)
    assert set(shared.model) <= set(stored), "a write found after an earlier kill vanished"
    assert all(stored[key] == _shared_value(key.decode()) for key in stored)
    shared.model = stored
    assert ns.used_bytes() == sum(len(k) + len(v) for k, v in stored.items())
    return in_flight


@pytest.mark.parametrize(
    ("power_loss", "own_threads"),
    [(False, 4), (True, 4), (True, 1)],
    ids=["sigkill", "power-loss", "power-loss-fewer-threads"],
)
def test_sigkill_of_concurrent_writer_threads_in_several_processes(
    tmp_path: Path, power_loss: bool, own_threads: int
) -> None:
    """Three processes share one folding log, each running four threads that write their own
    namespaces (creating namespaces as they go) and one that takes over and writes the shared
    namespace with fenced writes; with flushes slowed down, writers pile up and share flushes
    (group commit). All are SIGKILLed at random moments, several times. After each kill every
    acknowledged op must be there, each namespace hold exactly a prefix of its thread's ops
    (ending at the last acknowledged one or the one in flight), usage be exact, ids stable,
    generations never reissued and no fenced-out write applied.

    `power-loss`: after each kill the log is cut back to what a power loss at that moment may
    have left (`_power_loss_image`), so an acknowledgement that no flush covered shows up as a
    lost write, which a SIGKILL alone (the page cache survives it) never shows. With one own
    thread per process writers are often alone, so `O_DSYNC` writes and grouped ones mix."""
    rng = random.Random(20261202 + power_loss)
    directory = tmp_path / "store"
    # Power losses: a larger log, so that most kills land between folds (a fold flushes all).
    log_kib, flush_delay_ms = (64, 3) if power_loss else (16, 2)
    procs, lives = 3, 6
    owns = {f"p{p}-t{t}": _Own() for p in range(procs) for t in range(own_threads)}
    shared = _Shared()
    ids: dict[str, int] = {}
    grouped_lives = in_flight_lives = landed = total_in_flight = 0
    power = _PowerLoss()
    FileStore(directory).close()  # the log exists before the children journal its writes
    for life in range(lives):
        journal = tmp_path / f"journal-{life}"
        baseline = (directory / "kv.log").read_bytes()
        shared_threads = {p: [f"p{p}-s-l{life}"] for p in range(procs)}
        children = []
        for p in range(procs):
            spec = {
                "own": {a: o.start for a, o in owns.items() if a.startswith(f"p{p}-")},
                "shared": shared_threads[p],
                "log_kib": log_kib,
                "flush_delay_ms": flush_delay_ms,
                "journal": str(journal) if power_loss else "",
            }
            children.append(_Child("threads", str(directory), json.dumps(spec)))
        target = rng.randint(5, 40)
        deadline = time.monotonic() + 20
        while not all(child.acks() >= target for child in children):
            assert time.monotonic() < deadline, [c.lines[-3:] for c in children]
            for child in children:
                assert child.process.poll() is None, (child.lines[-3:], _stderr(child.process))
            time.sleep(0.005)
        lines: list[str] = []
        flushes: list[tuple[int, int]] = []
        time.sleep(rng.uniform(0, 0.004))
        for child in children:
            if not power_loss:  # each at its own random moment; a power loss hits all at once
                time.sleep(rng.uniform(0, 0.004))
            child.kill()
        for child in children:
            out = child.collect()
            lines += out
            counts = [line.split() for line in out if line.startswith("flush ")]
            if counts:
                flushes.append((int(counts[-1][1]), int(counts[-1][2])))
        # Group commit really happened: some child made fewer flushes than writes.
        grouped_lives += any(f < w for w, f in flushes)
        if power_loss:
            keep = 0.5 if life % 2 else 0.0  # both outcomes in every run: a loss and a keep
            image = _power_loss_image(baseline, journal.read_bytes(), rng, keep, power)
            (directory / "kv.log").write_bytes(image)

        store = FileStore(directory, log_bytes=log_kib * 1024)
        names = set(store.actor_ids())
        optional: set[str] = set()
        in_flight = 0
        for actor, own in owns.items():
            own.start, flying, committed = _check_own(store, actor, own, lines, names, optional)
            in_flight += flying
            landed += committed
        in_flight += _check_shared(
            store, shared, lines, [t for ts in shared_threads.values() for t in ts], names
        )
        required = {a for a in owns if owns[a].start > 0 or a in names}
        required |= {n for own in owns.values() for n in own.created}
        if shared.gens:
            required.add(SHARED)
        assert required <= names, ("acknowledged namespaces lost", required - names)
        assert names <= required | optional | {SHARED, *owns}, names - required - optional
        # Ids are stable across lives and distinct, and the children saw the same ones.
        for name in names:
            ns_id = store.namespace(name)._id
            assert ids.setdefault(name, ns_id) == ns_id, (name, ids[name], ns_id)
        assert len(set(ids.values())) == len(ids)
        for line in lines:
            word, *rest = line.split()
            if word == "id":
                assert ids[rest[0]] == int(rest[1]), line
            elif word == "ack" and rest[2] != "-":
                assert ids[f"{rest[0]}/c{rest[1]}"] == int(rest[2]), line
        store.close()
        _integrity_ok(directory)
        in_flight_lives += in_flight > 0
        total_in_flight += in_flight
    folds = _folded_epochs(directory)
    print(
        f"lives={lives} ops per thread={[o.start for o in owns.values()]} "
        f"shared keys={len(shared.model)} generation={shared.generation} "
        f"in flight at kills={total_in_flight} (found committed: {landed}) folds={folds} "
        f"lives with group commit={grouped_lives} "
        f"power losses: {power}"
    )
    if power_loss:
        assert power.lost > 0 and power.kept > 0, "the power losses changed nothing"
        assert power.buffered > 0, "no write waited for a shared flush"
        if own_threads == 1:  # the variant where writers are often alone (see above)
            assert power.direct > 0, "no write went alone (O_DSYNC) beside the grouped ones"
    assert grouped_lives >= 1, "no child ever shared a flush: group commit never happened"
    assert in_flight_lives >= lives // 2, "the kills did not land while writes were in flight"
    assert all(own.start >= 2 for own in owns.values()), "a thread made no progress"
    assert shared.gens and shared.rejected, "the shared namespace saw no race of takeovers"
    assert folds >= lives, folds


if __name__ == "__main__":
    role, *argv = sys.argv[1:]
    if role == "writer":
        _writer(argv[0], int(argv[1]), int(argv[2]), *argv[3:])
    elif role == "racer":
        _racer(argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4])
    elif role == "threads":
        _threads_child(argv[0], argv[1])
    else:
        raise SystemExit(f"unknown role {role!r}")


def test_a_full_disk_during_a_fold_is_a_typed_error_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite rolls the fold back by itself on `SQLITE_FULL`; the store must still answer with a
    `KvError` naming the cause (it raised a raw `apsw.SQLError` from its own ROLLBACK)."""
    store = FileStore(tmp_path / "s", log_bytes=64 * 1024)
    ns = store.namespace("a")
    pages = store.base.db.execute("PRAGMA page_count").fetchall()[0][0]
    store.base.db.execute(f"PRAGMA max_page_count = {pages + 3}")  # the disk fills up
    written: dict[bytes, bytes] = {}
    with pytest.raises(KvUnavailable, match="full"):
        for i in range(200):
            key, value = b"k%04d" % i, os.urandom(3000)
            ns.put({key: value})
            written[key] = value
    assert len(written) > 10, "the disk filled up at a fold, not at once"
    assert dict(ns.list()) == written
    store.close()


def test_limits_the_log_cannot_encode_are_refused_at_open(tmp_path: Path) -> None:
    """A range record stores key lengths as u16 with 0xFFFF meaning "no end": a 65,535-byte end
    key read back as "no end" and left a log no store could open again."""
    with pytest.raises(ValueError, match="keys of up to 65534 bytes, not max_key_bytes=65535"):
        FileStore(tmp_path / "s", limits=KvLimits(max_key_bytes=65535, max_batch_bytes=10**6))
    assert not (tmp_path / "s").exists()
    store = FileStore(tmp_path / "s", limits=KvLimits(max_key_bytes=65534, max_batch_bytes=10**6))
    ns = store.namespace("a")
    ns.put({b"a": b"1", b"c": b"2"})
    ns.delete_range(b"a", b"b" * 65534)
    store.close()
    again = FileStore(tmp_path / "s", limits=KvLimits(max_key_bytes=65534, max_batch_bytes=10**6))
    assert again.namespace("a").list() == [(b"c", b"2")]
    again.close()
