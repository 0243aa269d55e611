"""Real crashes: a child process commits on a durable store and is killed with SIGKILL.

The parent and the child generate the same transactions from the seed. The child prints
`ack N` after transaction N commits; the parent kills it at a random moment, reopens the
namespace itself and checks the content is the oracle's state after the last acknowledged
transaction, or after the one in flight — then starts a new child from there. When a sequence is
done, the next one starts on a fresh actor, until the time is up.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

from pagekv.fuzz.oracle import Oracle, digest, run_txn
from pagekv.fuzz.runner import Coverage, FuzzFailure
from pagekv.fuzz.steps import StepGenerator, Txn
from pagekv.kv import KvStore, open_kv
from pagekv.vfs import open_database


def _transactions(seed: int, count: int, max_blob: int) -> list[Txn]:
    generator = StepGenerator(random.Random(seed), frozenset(), max_blob)
    return [s for s in generator.steps(count) if isinstance(s, Txn)]


_COMPACT_DELTAS = 8
"""The child compacts every few commits (the default is 256, more than a run commits), so that
kills land in compactions too."""


def child_main(argv: list[str]) -> None:
    """Entry point of the child: commit transactions `start..` and acknowledge each, with the
    number of compactions this child has finished (`ack N COMPACTIONS`)."""
    url, actor, seed, start, count, max_blob = argv
    txns = _transactions(int(seed), int(count), int(max_blob))
    store = open_kv(url)
    db = open_database(
        store.namespace(actor),
        compact_deltas=_COMPACT_DELTAS,
        in_place_commits=int(seed) % 2 == 0,  # half the runs: deltas, so kills hit compactions
    )
    print("ready", flush=True)
    for n in range(int(start), len(txns)):
        run_txn(db.connection, txns[n])
        print(f"ack {n} {db.metrics()['compactions']}", flush=True)
    print("done", flush=True)


def fuzz_processes(
    url: str, seed: int, seconds: float, max_blob: int = 2**20, count: int = 400
) -> Coverage:
    """Kill committing children at random moments for `seconds`; raise `FuzzFailure` on a loss.

    A run commits one generated sequence of transactions on a fresh actor, across as many child
    lives as it takes; runs follow each other until the time is up, so a faster store gets more
    crashes, not an early end.
    """
    if url.startswith("memory:"):
        raise ValueError("--processes needs a durable store shared between processes (file://)")
    rng = random.Random(seed)
    coverage = Coverage(runs=0)
    deadline = time.monotonic() + seconds
    store = open_kv(url)
    try:
        while time.monotonic() < deadline:
            run_seed = rng.randrange(2**32)
            coverage.runs += 1
            _run(store, url, run_seed, max_blob, count, rng, deadline, coverage)
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
) -> None:
    txns = _transactions(seed, count, max_blob)
    actor = f"pagekv-fuzz-processes/{seed}/{time.time_ns()}"
    oracle = Oracle()
    committed_before = coverage.commits
    done = 0
    while done < len(txns) and time.monotonic() < deadline:
        acked, compactions = _run_child(url, actor, seed, done, count, max_blob, rng)
        coverage.crashes += 1
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
            raise FuzzFailure(done, "content after SIGKILL is neither acknowledged nor next")
        coverage.verifications += 1
        coverage.commits = coverage.steps = committed_before + done
    store.namespace(actor).drop()


_CHILD = "import sys; from pagekv.fuzz.processes import child_main; child_main(sys.argv[1:])"
"""The child's program. Not `-m pagekv.fuzz.processes`: the package imports this module first,
and running it again as `__main__` made Python warn on every child's start."""


def _run_child(
    url: str, actor: str, seed: int, start: int, count: int, max_blob: int, rng: random.Random
) -> tuple[int, int]:
    """Start a child at `start`, SIGKILL it after a random delay; return the last acknowledged
    index and the compactions the child had finished by then."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            url,
            actor,
            str(seed),
            str(start),
            str(count),
            str(max_blob),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acked, compactions = start - 1, 0
    try:
        if child.stdout.readline().strip() != "ready":
            raise FuzzFailure(start, f"child failed to start (exit {child.wait()})")
        kill_at = time.monotonic() + rng.uniform(0.0, 0.3)
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
            acked, compactions = _parse_ack(line)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout:
            if line.startswith("ack "):
                acked, compactions = _parse_ack(line)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return acked, compactions


def _parse_ack(line: str) -> tuple[int, int]:
    _, acked, compactions = line.split()
    return int(acked), int(compactions)
