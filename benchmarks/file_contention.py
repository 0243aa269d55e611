"""Several processes writing one `file://` directory at once: the cost of the bounded lock wait.

Each of `PROCS` child processes makes `N` one-entry durable writes to its own namespace of one
store; a sample is the wall time from the moment all children are ready until the last one is
done, reported as writes per second over all of them. Run it with two builds to compare them
(samples interleaved, so drift of the machine hits both):

    git worktree add /tmp/old <commit>   # and build it: cd /tmp/old && pip install -e .
    PROCS=4 N=2000 .venv/bin/python benchmarks/file_contention.py 7 /tmp/old

`BASE` is the scratch directory (default `./.bench-contention`, on the disk under test). Each
extra argument after the sample count is the root of another checkout to run the children from.
Results: `benchmarks/HISTORY.md` (its figures were of an earlier engine).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(os.environ.get("BASE", "./.bench-contention"))
PROCS = int(os.environ.get("PROCS", "4"))
N = int(os.environ.get("N", "2000"))
_CHILD = """
import sys, time
from pagekv.kv import FileStore
store = FileStore(sys.argv[1])
ns = store.namespace(sys.argv[2])
value = bytes(100)
print("ready", flush=True)
sys.stdin.readline()
for i in range(int(sys.argv[3])):
    ns.put({b"k%d" % (i % 64): value})
store.close()
"""


def sample(root: Path) -> float:
    """Writes per second of `PROCS` children of the checkout at `root`, together."""
    directory = BASE / "store"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    python = root / ".venv" / "bin" / "python"
    children = [
        subprocess.Popen(
            [str(python), "-c", _CHILD, str(directory), f"actor-{i}", str(N)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(PROCS)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    started = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        assert child.wait() == 0
    return PROCS * N / (time.perf_counter() - started)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    roots = [Path(__file__).resolve().parents[1], *map(Path, sys.argv[2:])]
    results: dict[Path, list[float]] = {root: [] for root in roots}
    for _ in range(rounds):
        for root in roots:
            results[root].append(sample(root))
    first = statistics.median(results[roots[0]])
    for root, rates in results.items():
        median = statistics.median(rates)
        print(
            f"{root!s:40} {median:8.0f} writes/s (range {min(rates):.0f}-{max(rates):.0f}), "
            f"{median / first:.2f}x this checkout"
        )
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
