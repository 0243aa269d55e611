"""Group commit of the `file:` store at the KV level: N writers on N namespaces of one store.

    .venv/bin/python benchmarks/group_commit.py [--writers 1 8 64] [--delays 0 2] [--reps 3]
    .venv/bin/python benchmarks/group_commit.py --processes 8 [--delays 0 2]
    .venv/bin/python benchmarks/group_commit.py --processes 4 --stopped-flusher [--lock-timeout 3]

Each writer puts one 100-byte entry per call, as fast as it can, for `--seconds`; writers are
threads of one process, or with `--processes N` one thread in each of N processes sharing the
directory. Printed: aggregate durable writes/s and the store's flushes per write
(`flush_counts()`), medians of `--reps` fresh stores (min-max), the cases interleaved.
`flush_delay_ms` adds that much to every flush, as a slower disk would.

`--stopped-flusher` compares N writer processes alone with the same N beside one more writer
process that is SIGSTOPped while it holds the host's flusher lock (caught in the act: stopped, then
let go again unless `/proc/locks` shows it holding the lock on `kv.shm`) before the N start
counting; it stays stopped until they are done. Durability must not wait for it.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pagekv.kv import FileStore
from pagekv.kv.file.lock_holders import flock_holders

_CHILD = """
import sys, threading, time
from pagekv.kv import FileStore
store = FileStore(sys.argv[1], flush_delay_ms=float(sys.argv[2]), lock_timeout=float(sys.argv[6]))
start, stop = float(sys.argv[4]), float(sys.argv[5])
print("ready", flush=True)
counts = []
def write(ns):
    n = 0
    while time.time() < stop:
        ns.put({b"k": b"v" * 100})
        n += 1
    counts.append(n)
threads = [
    threading.Thread(target=write, args=(store.namespace(f"p{sys.argv[3]}-{t}"),))
    for t in range(int(sys.argv[7]))
]
while time.time() < start:
    time.sleep(0.001)
before, cpu = store.flush_counts(), time.process_time()
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
cpu = time.process_time() - cpu
print(sum(counts), store.flush_counts().flushes - before.flushes, round(cpu * 1e6))
"""


def _threads(
    directory: Path, writers: int, delay: float, seconds: float
) -> tuple[float, float, float]:
    """Writes/s, flushes per write and CPU µs per write (the process's, all threads)."""
    store = FileStore(directory, flush_delay_ms=delay)
    namespaces = [store.namespace(f"w{i}") for i in range(writers)]
    counts = [0] * writers
    before = store.flush_counts()
    stop = time.monotonic() + seconds

    def write(i: int) -> None:
        ns, n = namespaces[i], 0
        while time.monotonic() < stop:
            ns.put({b"k": b"v" * 100})
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    started, cpu = time.monotonic(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    flushes = store.flush_counts().flushes - before.flushes
    store.close()
    writes = sum(counts)
    return writes / elapsed, flushes / writes, cpu * 1e6 / writes


def _processes(
    directory: Path,
    processes: int,
    delay: float,
    seconds: float,
    stopped: bool = False,
    lock_timeout: float = 30.0,
) -> tuple[float, float, float]:
    """Writes/s, flushes per write and CPU µs per write (the writer processes', summed; not
    the stopped one's)."""
    FileStore(directory).close()
    start = time.time() + 1.5 + (1.0 if stopped else 0.0)

    def spawn(p: int, begin: float, end: float, threads: int = 1) -> subprocess.Popen[str]:
        args = [str(directory), str(delay), str(p), str(begin), str(end), str(lock_timeout)]
        args.append(str(threads))
        return subprocess.Popen(
            [sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, text=True
        )

    # Threads of its own, so that it flushes for a group, under the flusher lock.
    victim = spawn(processes, 0.0, start + seconds + 60, threads=4) if stopped else None
    children = [spawn(p, start, start + seconds) for p in range(processes)]
    try:
        if victim is not None:
            assert victim.stdout is not None and victim.stdout.readline() == "ready\n"
            _stop_holding_flusher_lock(victim.pid, directory, start)
        out = [tuple(map(int, child.communicate()[0].split()[1:])) for child in children]
    finally:
        if victim is not None:
            victim.kill()
            victim.wait()
    writes, flushes, cpu_us = (sum(o[i] for o in out) for i in range(3))
    return writes / seconds, flushes / writes, cpu_us / writes


def _stop_holding_flusher_lock(pid: int, directory: Path, before: float) -> None:
    """SIGSTOP `pid` at a moment it holds the flusher lock (a `flock` on `kv.shm`) and not the
    log's, by `before`."""
    while time.time() < before:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.001)  # let the signal land
        shm, log = flock_holders(directory / "kv.shm"), flock_holders(directory / "kv.log")
        if pid in shm and pid not in log:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(random.uniform(0, 0.002))
    raise SystemExit("never caught the victim holding the flusher lock")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--processes", type=int, help="N processes of one writer each, and 1")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 2.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dir", default=".", help="where the stores go (the disk measured)")
    parser.add_argument(
        "--stopped-flusher",
        action="store_true",
        help="with --processes N: N alone, against N beside a process stopped holding the "
        "flusher lock",
    )
    parser.add_argument("--lock-timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.stopped_flusher:
        return _stopped_flusher(args)
    counts = [1, args.processes] if args.processes else args.writers
    kind = "processes" if args.processes else "threads"
    results: dict[tuple[float, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.reps):
            for delay in args.delays:
                for n in counts:
                    directory = Path(tmp) / f"{rep}-{delay:g}-{n}"
                    run = _processes if args.processes else _threads
                    results.setdefault((delay, n), []).append(
                        run(directory, n, delay, args.seconds)
                    )
    print(
        f"{kind:>9} {'delay ms':>8} {'writes/s':>22} {'flushes/write':>20} {'CPU µs/write':>12} "
        f"{'vs 1':>6}"
    )
    for (delay, n), values in results.items():
        rates, flushes = [v[0] for v in values], [v[1] for v in values]
        one = statistics.median(v[0] for v in results[(delay, 1)])
        print(
            f"{n:9} {delay:8g} {statistics.median(rates):10,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) {statistics.median(flushes):8.3f} ({min(flushes):.3f}-"
            f"{max(flushes):.3f}) {statistics.median(v[2] for v in values):12.1f} "
            f"{statistics.median(rates) / one:5.1f}x"
        )


def _stopped_flusher(args: argparse.Namespace) -> None:
    """N writer processes alone, then beside one stopped holding the flusher lock, interleaved."""
    if not args.processes:
        raise SystemExit("--stopped-flusher goes with --processes N")
    results: dict[tuple[float, bool], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.reps):
            for delay in args.delays:
                for stopped in (False, True):
                    directory = Path(tmp) / f"{rep}-{delay:g}-{stopped}"
                    run = _processes(
                        directory, args.processes, delay, args.seconds, stopped, args.lock_timeout
                    )
                    results.setdefault((delay, stopped), []).append(run)
    print(f"{args.processes} writer processes, lock_timeout {args.lock_timeout:g} s")
    print(
        f"{'delay ms':>8} {'flusher':>8} {'writes/s':>22} {'flushes/write':>20} "
        f"{'CPU µs/write':>12} {'ratio':>6}"
    )
    for (delay, stopped), values in results.items():
        rates, flushes = [v[0] for v in values], [v[1] for v in values]
        alone = statistics.median(v[0] for v in results[(delay, False)])
        cpu = statistics.median(v[2] for v in values)
        print(
            f"{delay:8g} {'stopped' if stopped else 'none':>8} {statistics.median(rates):10,.0f} "
            f"({min(rates):,.0f}-{max(rates):,.0f}) {statistics.median(flushes):8.3f} "
            f"({min(flushes):.3f}-{max(flushes):.3f}) {cpu:12.1f} "
            f"{statistics.median(rates) / alone:5.2f}x"
        )


if __name__ == "__main__":
    main()
