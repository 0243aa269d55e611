"""Durable workflows on pagekv (`file:`) and on DBOS Transact (SQLite system database, in its
default journal mode and with WAL + synchronous=FULL), on the same disk, interleaved.

    .venv/bin/pip install 'dbos>=3.4'        # the `peers` extra of pyproject.toml
    .venv/bin/python benchmarks/peers/workflows.py [--reps 5] [--requests 200] [--concurrency 8]
        [--steps 1000] [--dir DIR] [--json PATH]

Cases: (a) a 3-step workflow started per request, the request waiting for its result, sequential
and from `--concurrency` concurrent clients; (b) one workflow of `--steps` steps. Every system
runs each repetition in a fresh process and a fresh directory under one temporary directory in
`--dir` (so on the same disk), warms up there, then runs the cases (the long workflow first, on a
runtime with nothing else in it); the systems take turns in a
rotating order. Printed: medians over repetitions (min-max), and ratios pagekv / DBOS (above 1
pagekv is faster) as the medians of each repetition's ratio. README.md says why this is fair and
what is not.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSTEMS = ("pagekv", "dbos-default", "dbos-wal-full")
HEADINGS = {
    "pagekv": "pagekv `file:`",
    "dbos-default": "DBOS default",
    "dbos-wal-full": "DBOS WAL+FULL",
}
WARM_UP_REQUESTS = 30
WARM_UP_STEPS = 100
THREE_STEP_OUTPUT = 6
"""What the 3-step workflow returns, (0+1)+(1+1)+(2+1): each side checks every result."""


@dataclass(frozen=True)
class Sizes:
    requests: int
    concurrency: int
    steps: int

    @property
    def warm_up_requests(self) -> int:
        return min(WARM_UP_REQUESTS, self.requests)

    @property
    def warm_up_steps(self) -> int:
        return min(WARM_UP_STEPS, self.steps)


CASES = {
    "sequential": "3-step workflow per request, sequential (workflows/s)",
    "concurrent": "3-step workflow per request, {c} concurrent clients (workflows/s)",
    "inline": "3-step, DBOS workflow called in the request, sequential (workflows/s)",
    "steps": "{n:,}-step workflow (steps/s)",
}
"""The rows, in order. `inline` is DBOS's other way to run a workflow for a request (its function
called directly, no `start_workflow`); pagekv has only the one, so its column repeats
`sequential` there."""


async def _clients(request: Callable[[int], Awaitable[None]], sizes: Sizes) -> float:
    """Workflows/s of `sizes.requests` requests from `sizes.concurrency` concurrent clients."""
    per_client = sizes.requests // sizes.concurrency

    async def client(c: int) -> None:
        for i in range(per_client):
            await request(c * per_client + i)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(sizes.concurrency)))
    return per_client * sizes.concurrency / (time.perf_counter() - started)


# -- pagekv ------------------------------------------------------------------------------------


async def run_pagekv(directory: Path, sizes: Sizes) -> dict[str, Any]:
    """Each request creates an actor, whose workflow starts with it (one workflow per actor),
    and polls `handle.workflow.status()` every millisecond until it completed: the public API
    has no call that waits for a workflow's outcome."""
    import anyio

    from pagekv.actor import ActorDefinition, Client, Registry, actor
    from pagekv.actor.workflow import StepContext, WorkflowContext, WorkflowState

    def add(i: int) -> Callable[[StepContext], Awaitable[int]]:
        async def step(step: StepContext) -> int:
            return i + 1

        return step

    def flow(name: str, steps: int) -> ActorDefinition:
        definition = actor(name)

        @definition.workflow
        async def run(wf: WorkflowContext) -> int:
            total = 0
            for i in range(steps):
                total += await wf.step(f"s{i}", add(i))
            return total

        return definition

    async def result(client: Client, name: str, key: str) -> Any:
        handle = await client.create(name, key)
        while (status := await handle.workflow.status()).state is not WorkflowState.COMPLETED:
            if status.state is WorkflowState.FAILED:
                raise RuntimeError(f"workflow {name}/{key} failed: {status.error}")
            await anyio.sleep(0.001)
        return status.output

    definitions = [flow("three", 3), flow("warm", sizes.warm_up_steps), flow("long", sizes.steps)]
    async with Registry(definitions, kv=f"file://{directory}/store").run() as client:

        async def three(key: str) -> None:
            if await result(client, "three", key) != THREE_STEP_OUTPUT:
                raise RuntimeError("the 3-step workflow returned something else")

        await result(client, "warm", "warm")
        started = time.perf_counter()
        await result(client, "long", "long")
        steps = sizes.steps / (time.perf_counter() - started)
        for i in range(sizes.warm_up_requests):
            await three(f"warm-{i}")
        started = time.perf_counter()
        for i in range(sizes.requests):
            await three(f"seq-{i}")
        sequential = sizes.requests / (time.perf_counter() - started)
        concurrent = await _clients(lambda i: three(f"conc-{i}"), sizes)
    return {
        "figures": {
            "sequential": sequential,
            "concurrent": concurrent,
            "inline": sequential,
            "steps": steps,
        },
        "setup": _pagekv_setup(),
    }


def _pagekv_setup() -> dict[str, Any]:
    """Which pagekv ran (a built checkout on PYTHONPATH, or this one) and whether compiled."""
    import apsw

    import pagekv
    import pagekv.kv.limits

    return {
        "from": str(Path(pagekv.__file__).parent.parent),
        "compiled": not pagekv.kv.limits.__file__.endswith(".py"),
        "sqlite": apsw.sqlite_lib_version(),
    }


# -- DBOS --------------------------------------------------------------------------------------


def run_dbos(directory: Path, sizes: Sizes, wal_full: bool) -> dict[str, Any]:
    """DBOS's own ways to run a workflow for a request: `DBOS.start_workflow(...).get_result()`
    (sequential: its primary, synchronous API, at least as fast as the async one in trials),
    `start_workflow_async` from concurrent asyncio clients (threads calling the synchronous API
    reached ~60 % of that with WAL), and the workflow function called directly (`inline`).

    WAL is set on the new file before DBOS opens it (journal_mode=WAL persists in the file),
    and every connection DBOS's engine opens runs `PRAGMA synchronous=FULL` (a SQLAlchemy pool
    `connect` listener: DBOS has no pragma setting); what each connection then reports is
    returned, to show what ran."""
    import sqlite3

    import sqlalchemy
    from dbos import DBOS

    path = directory / "dbos.sqlite"
    if wal_full:
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
    seen: set[tuple[str, int]] = set()

    @sqlalchemy.event.listens_for(sqlalchemy.pool.Pool, "connect")
    def _on_connect(connection: Any, _record: Any) -> None:
        if wal_full:
            connection.execute("PRAGMA synchronous=FULL")
        journal = connection.execute("PRAGMA journal_mode").fetchone()[0]
        synchronous = connection.execute("PRAGMA synchronous").fetchone()[0]
        seen.add((journal, synchronous))

    DBOS(
        config={
            "name": "peers",
            "system_database_url": f"sqlite:///{path}",
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def add(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def many(steps: int) -> int:
        return sum(add(i) for i in range(steps))

    @DBOS.step()
    async def add_async(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    async def many_async(steps: int) -> int:
        total = 0
        for i in range(steps):
            total += await add_async(i)
        return total

    def check(output: int) -> None:
        if output != THREE_STEP_OUTPUT:
            raise RuntimeError("the 3-step workflow returned something else")

    async def three_async(_: int) -> None:
        check(await (await DBOS.start_workflow_async(many_async, 3)).get_result())

    async def concurrently() -> float:
        for i in range(sizes.warm_up_requests):
            await three_async(i)
        return await _clients(three_async, sizes)

    DBOS.launch()
    try:
        DBOS.start_workflow(many, sizes.warm_up_steps).get_result()
        started = time.perf_counter()
        DBOS.start_workflow(many, sizes.steps).get_result()
        steps = sizes.steps / (time.perf_counter() - started)
        for _ in range(sizes.warm_up_requests):
            check(DBOS.start_workflow(many, 3).get_result())
        started = time.perf_counter()
        for _ in range(sizes.requests):
            check(DBOS.start_workflow(many, 3).get_result())
        sequential = sizes.requests / (time.perf_counter() - started)
        concurrent = asyncio.run(concurrently())
        started = time.perf_counter()
        for _ in range(sizes.requests):
            check(many(3))
        inline = sizes.requests / (time.perf_counter() - started)
    finally:
        DBOS.destroy()
    return {
        "figures": {
            "sequential": sequential,
            "concurrent": concurrent,
            "inline": inline,
            "steps": steps,
        },
        "setup": {
            "connections": sorted(f"journal_mode={j} synchronous={s}" for j, s in seen),
            "sqlite": sqlite3.sqlite_version,
            "dbos": _version("dbos"),
        },
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# -- the parent: interleaved repetitions -------------------------------------------------------


def child(system: str, directory: Path, sizes: Sizes) -> None:
    """One repetition of one system, in this fresh process; the result goes to a file, since
    DBOS may print on stdout."""
    if system == "pagekv":
        result = asyncio.run(run_pagekv(directory, sizes))
    else:
        result = run_dbos(directory, sizes, wal_full=system == "dbos-wal-full")
    (directory / "result.json").write_text(json.dumps(result))


def run_once(system: str, base: Path, rep: int, sizes: Sizes) -> dict[str, Any]:
    directory = base / f"{system}-{rep}"
    directory.mkdir()
    command = [sys.executable, __file__, "--child", system, "--child-dir", str(directory)]
    command += ["--requests", str(sizes.requests), "--concurrency", str(sizes.concurrency)]
    command += ["--steps", str(sizes.steps)]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads((directory / "result.json").read_text())
    shutil.rmtree(directory)
    return result


def _spread(values: list[float], fmt: str, unit: str = "") -> str:
    low, high = min(values), max(values)
    return f"{statistics.median(values):{fmt}}{unit} ({low:{fmt}}-{high:{fmt}})"


def report(runs: list[dict[str, dict[str, Any]]], sizes: Sizes, systems: list[str]) -> str:
    dbos = [s for s in systems if s != "pagekv"]
    header = ["case", *(HEADINGS[s] for s in systems)]
    if "pagekv" in systems:
        header += [f"pagekv / {HEADINGS[s]}" for s in dbos]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for case, label in CASES.items():
        if case == "inline" and not dbos:
            continue
        cells = [label.format(c=sizes.concurrency, n=sizes.steps)]
        cells += [_spread([run[s]["figures"][case] for run in runs], ",.0f") for s in systems]
        if "pagekv" in systems:
            for s in dbos:
                ratios = [run["pagekv"]["figures"][case] / run[s]["figures"][case] for run in runs]
                cells.append(_spread(ratios, ".2f", "x"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for s in systems:
        setup = runs[-1][s]["setup"]
        lines.append(f"{HEADINGS[s]}: " + ", ".join(f"{k} {v}" for k, v in setup.items()))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    sizes = Sizes(args.requests, args.concurrency, args.steps)
    systems = list(SYSTEMS) if args.systems is None else args.systems
    if any(s != "pagekv" for s in systems) and importlib.util.find_spec("dbos") is None:
        sys.exit(
            "DBOS Transact (the peers extra) is not installed: .venv/bin/pip install 'dbos>=3.4'"
        )
    runs: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="peers-", dir=args.dir) as base:
        for rep in range(args.reps):
            order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
            runs.append({s: run_once(s, Path(base), rep, sizes) for s in order})
            done = ", ".join(f"{s} {runs[-1][s]['figures']['sequential']:.0f}/s" for s in order)
            print(f"repetition {rep + 1}/{args.reps}: {done}", file=sys.stderr)
    print(
        f"{args.reps} interleaved repetitions; {sizes.requests} requests a case; "
        f"in {os.path.abspath(args.dir)}\n"
    )
    print(report(runs, sizes, systems))
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": vars(sizes), "runs": runs}, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="requests a 3-step case")
    parser.add_argument("--concurrency", type=int, default=8, help="clients of the concurrent case")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the long workflow")
    parser.add_argument("--dir", default=".", help="where the systems' files go (default: here)")
    parser.add_argument("--json", help="write every repetition's figures here")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, help="a subset (default: all)")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.requests < args.concurrency or min(args.reps, args.concurrency, args.steps) < 1:
        parser.error("--reps, --concurrency and --steps must be >= 1, --requests >= --concurrency")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.child is not None:
        child(
            arguments.child,
            arguments.child_dir,
            Sizes(arguments.requests, arguments.concurrency, arguments.steps),
        )
    else:
        main(arguments)
