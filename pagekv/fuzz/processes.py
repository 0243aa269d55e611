"""Real crashes: a child process commits on a durable store and is killed with SIGKILL.

The parent and the child generate the same transactions from the seed. The child prints
`ack N` after transaction N commits; the parent kills it at a random moment, reopens the
namespace itself and checks the content is the oracle's state after the last acknowledged
transaction, or after the one in flight — then starts a new child from there. When a sequence is
done, the next one starts on a fresh actor, until the time is up.

With the `disk` event on a `file:` store, one child life in three fills the disk instead: after a
few commits the child lowers `RLIMIT_FSIZE` (SIGXFSZ ignored) to a random point just past the
end of the log, or inside the base that the next fold writes (the child's log is then 64 KiB, so
it folds often), and goes on committing. Writes past the limit are cut short, then refused with
`EFBIG`, as on a full disk. The first commit that fails ends the child (`fault N`); its error
must be a typed KV error, and the parent checks the store as after a kill: a commit acknowledged
over a short write would be missing.
"""

from __future__ import annotations

import os
import random
import resource
import select
import signal
import subprocess
import sys
import time
from typing import Final

import apsw

from pagekv.fuzz.oracle import Oracle, digest, run_txn
from pagekv.fuzz.runner import Coverage, FuzzFailure
from pagekv.fuzz.steps import PROCESS_EVENTS, StepGenerator, Txn
from pagekv.kv import FileStore, KvError, KvStore, open_kv
from pagekv.vfs import open_database


def _transactions(seed: int, count: int, max_blob: int) -> list[Txn]:
    generator = StepGenerator(random.Random(seed), frozenset(), max_blob)
    return [s for s in generator.steps(count) if isinstance(s, Txn)]


_COMPACT_DELTAS = 8
"""The child compacts every few commits (the default is 256, more than a run commits), so that
kills land in compactions too."""


_FOLDING_LOG_KIB: Final = 64
"""The log of a child that fills the disk: small, so that its commits fold it into the base."""


def child_main(argv: list[str]) -> None:
    """Entry point of the child: commit transactions `start..` and acknowledge each, with the
    number of compactions this child has finished (`ack N COMPACTIONS`). `disk` is `-`, or
    `AFTER:SEED`: fill the disk after `AFTER` commits, at a point drawn from `SEED`."""
    url, actor, seed, start, count, max_blob, disk = argv
    txns = _transactions(int(seed), int(count), int(max_blob))
    if disk != "-" and "log_kib=" not in url:
        url += ("&" if "?" in url else "?") + f"log_kib={_FOLDING_LOG_KIB}"
    store = open_kv(url)
    db = open_database(
        store.namespace(actor),
        compact_deltas=_COMPACT_DELTAS,
        in_place_commits=int(seed) % 2 == 0,  # half the runs: deltas, so kills hit compactions
    )
    print("ready", flush=True)
    fill_at = int(start) + int(disk.split(":")[0]) if disk != "-" else -1
    filled = False
    where = ""
    for n in range(int(start), len(txns)):
        if n == fill_at and isinstance(store, FileStore):
            where, limit = _fill_point(store, random.Random(int(disk.split(":")[1])))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            filled = True
        try:
            run_txn(db.connection, txns[n])
        except apsw.Error as e:
            if not filled:
                raise
            cause = db.take_last_kv_error()
            typed = "typed" if isinstance(cause, KvError) else "untyped"
            print(f"fault {n} {where} {typed} {cause!r} {e!r}", flush=True)
            return
        print(f"ack {n} {db.metrics()['compactions']}", flush=True)
    print("done", flush=True)


def _fill_point(store: FileStore, rng: random.Random) -> tuple[str, int]:
    """Where the disk fills up: just past the log's end (`log`), or inside the base, past
    anything the log will write (`fold`); and the file size limit that puts it there."""
    base = os.path.getsize(store.path / "kv.sqlite3")
    past_log = store.log_bytes + 8192
    if base > past_log and rng.random() < 0.5:
        return "fold", rng.randrange(past_log, base)
    return "log", store.log_used + rng.randrange(1, 16384)


def fuzz_processes(
    url: str,
    seed: int,
    seconds: float,
    max_blob: int = 2**20,
    count: int = 400,
    events: frozenset[str] = frozenset(PROCESS_EVENTS),
) -> Coverage:
    """Kill committing children at random moments for `seconds`, or fill the disk under them
    (`events`); raise `FuzzFailure` on a loss.

    A run commits one generated sequence of transactions on a fresh actor, across as many child
    lives as it takes; runs follow each other until the time is up, so a faster store gets more
    crashes, not an early end.
    """
    if url.startswith("memory:"):
        raise ValueError("--processes needs a durable store shared between processes (file://)")
    if not events or not events <= set(PROCESS_EVENTS):
        raise ValueError(f"events must be some of {PROCESS_EVENTS}, got {sorted(events)}")
    rng = random.Random(seed)
    coverage = Coverage(runs=0)
    deadline = time.monotonic() + seconds
    store = open_kv(url)
    try:
        while time.monotonic() < deadline:
            run_seed = rng.randrange(2**32)
            coverage.runs += 1
            _run(store, url, run_seed, max_blob, count, rng, deadline, coverage, events)
    finally:
        store.close()
    return coverage


def _run(
    store: KvStore,
    url: str,
    seed: int,
    max_blob: int,
    count: int,
    rng: random.Random,
    deadline: float,
    coverage: Coverage,
    events: frozenset[str],
) -> None:
    txns = _transactions(seed, count, max_blob)
    actor = f"pagekv-fuzz-processes/{seed}/{time.time_ns()}"
    oracle = Oracle()
    committed_before = coverage.commits
    done = 0
    fills = "disk" in events and url.startswith("file:")
    while done < len(txns) and time.monotonic() < deadline:
        disk = "-"
        if fills and ("crash" not in events or rng.random() < 1 / 3):
            disk = f"{rng.randrange(4)}:{rng.randrange(2**32)}"
        # A life that fills the disk ends by itself unless crashes are wanted too.
        kill_after = rng.uniform(0.0, 0.3) if disk == "-" or "crash" in events else 60.0
        acked, compactions, fault = _run_child(
            url, actor, seed, done, count, max_blob, disk, kill_after
        )
        if fault is None:
            coverage.crashes += 1
        elif fault.split()[3] == "typed":
            coverage.faults[f"disk-{fault.split()[2]}"] += 1
            coverage.failed_commits += 1
        else:
            raise FuzzFailure(done, f"the disk filled up with an untyped error: {fault}")
        coverage.compactions += compactions
        for n in range(done, acked + 1):
            oracle.apply(txns[n])
        done = acked + 1
        if done < len(txns):
            oracle.pending = txns[done]
        with open_database(store.namespace(actor)) as db:
            check = db.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                raise FuzzFailure(done, f"integrity_check after SIGKILL: {check[:5]}")
            got = digest(db.connection)
        old, new = oracle.states()
        if got == new:
            oracle.resolve(committed=True)
            done += 1
        elif got == old:
            oracle.resolve(committed=False)
        else:
            raise FuzzFailure(
                done,
                "after the child ended (killed, disk full): content neither acknowledged nor next",
            )
        coverage.verifications += 1
        coverage.commits = coverage.steps = committed_before + done
    store.namespace(actor).drop()


_CHILD = "import sys; from pagekv.fuzz.processes import child_main; child_main(sys.argv[1:])"
"""The child's program. Not `-m pagekv.fuzz.processes`: the package imports this module first,
and running it again as `__main__` made Python warn on every child's start."""


def _run_child(
    url: str,
    actor: str,
    seed: int,
    start: int,
    count: int,
    max_blob: int,
    disk: str,
    kill_after: float,
) -> tuple[int, int, str | None]:
    """Start a child at `start`, SIGKILL it after `kill_after` seconds (unless a full disk ended
    it first); return the last acknowledged index, the compactions the child had finished by then,
    and the child's `fault` line if it reported one."""
    args = [url, actor, str(seed), str(start), str(count), str(max_blob), disk]
    command = [sys.executable, "-c", _CHILD, *args]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked, compactions, fault = start - 1, 0, None
    try:
        if child.stdout.readline().strip() != "ready":
            raise FuzzFailure(start, f"child failed to start (exit {child.wait()})")
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
            if line.startswith("ack "):
                acked, compactions = _parse_ack(line)
            elif line.startswith("fault "):
                fault = line.strip()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout:
            if line.startswith("ack "):
                acked, compactions = _parse_ack(line)
            elif line.startswith("fault "):
                fault = line.strip()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return acked, compactions, fault


def _parse_ack(line: str) -> tuple[int, int]:
    _, acked, compactions = line.split()
    return int(acked), int(compactions)
