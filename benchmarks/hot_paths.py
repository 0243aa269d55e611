"""CPU per operation on the four hot paths, for comparing two builds of pagekv side by side.

    .venv/bin/python benchmarks/hot_paths.py [--ops 2000] [--json]

Measures, in this process and in this order, the CPU time (`time.process_time`: user + system of
every thread) and the wall time of:

- `kv-write file`: one-entry durable writes to a `file:` store (each fsynced before it returns);
- `commit memory` / `commit file`: one-row `INSERT` commits on a warm VFS database;
- `action memory` / `action file`: state-only actions on a live actor through a `Registry`.

CPU, not throughput, is the figure to compare: on two cores with the GIL, the wall time of a
durable write is mostly the disk's, and the CPU is what pagekv itself spends. To compare builds,
run this script with each build's interpreter in turn, several rounds, and take medians (the
RESULTS file says how the current figures were taken).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import anyio

from pagekv.actor import ActorContext, Registry, actor
from pagekv.kv import KvStore, open_kv
from pagekv.vfs import open_database

counter = actor("hot", state={"n": 0}, sleep_timeout=3600)


@counter.action
async def bump(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    return int(ctx.state["n"])


@dataclass(frozen=True, slots=True)
class Figure:
    path: str
    ops: int
    cpu_us: float
    """CPU µs per operation, all threads of the process."""
    wall_us: float


def _measure(path: str, ops: int, run: Callable[[], None]) -> Figure:
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Figure(path, ops, cpu * 1e6 / ops, wall * 1e6 / ops)


@contextmanager
def _store(kind: str, directory: str) -> Iterator[KvStore]:
    store = open_kv("memory://" if kind == "memory" else f"file:{directory}/{kind}")
    try:
        yield store
    finally:
        store.close()


def kv_write(directory: str, ops: int) -> Figure:
    with _store("file", directory) as store:
        ns = store.namespace("kv-write")
        value = os.urandom(100)
        ns.write(put=[(b"warm", value)])

        def run() -> None:
            for i in range(ops):
                ns.write(put=[(b"k%d" % (i % 64), value)])

        return _measure("kv-write file", ops, run)


def commit(kind: str, directory: str, ops: int) -> Figure:
    with _store(kind, directory) as store, open_database(store.namespace("commit")) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, body BLOB)")
        body = os.urandom(100)
        for _ in range(100):
            db.execute("INSERT INTO t(body) VALUES (?)", (body,))

        def run() -> None:
            for _ in range(ops):
                db.execute("INSERT INTO t(body) VALUES (?)", (body,))

        return _measure(f"commit {kind}", ops, run)


def action(kind: str, directory: str, ops: int) -> Figure:
    async def main() -> Figure:
        url = f"file:{directory}/actions" if kind == "file" else "memory://"
        registry = Registry([counter], kv=url)
        async with registry.run() as client:
            handle = client.get_or_create("hot", "one")
            for _ in range(100):
                await handle.call("bump")
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(ops):
                await handle.call("bump")
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Figure(f"action {kind}", ops, cpu * 1e6 / ops, wall * 1e6 / ops)

    return anyio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per path")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as directory:
        figures = [
            kv_write(directory, args.ops),
            commit("memory", directory, args.ops * 5),
            commit("file", directory, args.ops),
            action("memory", directory, args.ops),
            action("file", directory, args.ops),
        ]
    for figure in figures:
        if args.json:
            print(json.dumps(asdict(figure)))
        else:
            print(f"{figure.path:14} {figure.cpu_us:8.1f} CPU µs/op  {figure.wall_us:8.1f} µs/op")


if __name__ == "__main__":
    main()
