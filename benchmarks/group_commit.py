"""Group commit of the `file:` store at the KV level: N writers on N namespaces of one store.

    .venv/bin/python benchmarks/group_commit.py [--writers 1 8 64] [--delays 0 2] [--reps 3]
    .venv/bin/python benchmarks/group_commit.py --processes 8 [--delays 0 2]

Each writer puts one 100-byte entry per call, as fast as it can, for `--seconds`; writers are
threads of one process, or with `--processes N` one thread in each of N processes sharing the
directory. Printed: aggregate durable writes/s and the store's flushes per write
(`flush_counts()`), medians of `--reps` fresh stores (min-max), the cases interleaved.
`flush_delay_ms` adds that much to every flush, as a slower disk would.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pagekv.kv import FileStore

_CHILD = """
import sys, time
from pagekv.kv import FileStore
store = FileStore(sys.argv[1], flush_delay_ms=float(sys.argv[2]))
ns = store.namespace("p" + sys.argv[3])
start, stop = float(sys.argv[4]), float(sys.argv[5])
while time.time() < start:
    time.sleep(0.001)
before, n = store.flush_counts(), 0
while time.time() < stop:
    ns.put({b"k": b"v" * 100})
    n += 1
print(n, store.flush_counts().flushes - before.flushes)
"""


def _threads(directory: Path, writers: int, delay: float, seconds: float) -> tuple[float, float]:
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
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    flushes = store.flush_counts().flushes - before.flushes
    store.close()
    return sum(counts) / elapsed, flushes / sum(counts)


def _processes(
    directory: Path, processes: int, delay: float, seconds: float
) -> tuple[float, float]:
    FileStore(directory).close()
    start = time.time() + 1.5
    args = [str(directory), str(delay)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, *args, str(p), str(start), str(start + seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(processes)
    ]
    out = [tuple(map(int, child.communicate()[0].split())) for child in children]
    writes, flushes = sum(o[0] for o in out), sum(o[1] for o in out)
    return writes / seconds, flushes / writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--processes", type=int, help="N processes of one writer each, and 1")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 2.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dir", default=".", help="where the stores go (the disk measured)")
    args = parser.parse_args()
    counts = [1, args.processes] if args.processes else args.writers
    kind = "processes" if args.processes else "threads"
    results: dict[tuple[float, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.reps):
            for delay in args.delays:
                for n in counts:
                    directory = Path(tmp) / f"{rep}-{delay:g}-{n}"
                    run = _processes if args.processes else _threads
                    results.setdefault((delay, n), []).append(
                        run(directory, n, delay, args.seconds)
                    )
    print(f"{kind:>9} {'delay ms':>8} {'writes/s':>22} {'flushes/write':>20} {'vs 1':>6}")
    for (delay, n), values in results.items():
        rates, flushes = [v[0] for v in values], [v[1] for v in values]
        one = statistics.median(v[0] for v in results[(delay, 1)])
        print(
            f"{n:9} {delay:8g} {statistics.median(rates):10,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) {statistics.median(flushes):8.3f} ({min(flushes):.3f}-"
            f"{max(flushes):.3f}) {statistics.median(rates) / one:5.1f}x"
        )


if __name__ == "__main__":
    main()
