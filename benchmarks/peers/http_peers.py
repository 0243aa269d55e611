"""Actions over HTTP on pagekv and on Cloudflare's runtime (Durable Objects with SQLite storage,
in `miniflare`), with the same load client, interleaved.

    npm install --prefix benchmarks/peers/cloudflare     # once: miniflare and workerd (~170 MB)
    .venv/bin/python benchmarks/peers/http_peers.py [--rounds 5] [--seconds 3] [--kv URL]

Both serve the actor of `benchmarks/http_bench.py` behind the same route, and `http_bench`'s raw
client (prebuilt requests on keep-alive connections, a task per client, each calling its own
actor) drives both: a state-only action (`bump`) and an action with one SQL insert and the state
(`bump_sql`), at 1 and 64 clients. Each round runs every case on both systems, in alternating
order; the report gives medians, the ratio pagekv ÷ miniflare of each round's actions/s (its
median, min and max), and the servers' CPU per action (their processes' user + system time, from
`/proc`, ÷ actions), since on two cores throughput alone hides what a call costs.

Miniflare is an optional npm install, never a dependency of pagekv; without it the script says
how to install it and exits 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from http_bench import Run, measure, start_server

PEER = Path(__file__).resolve().parent / "cloudflare"
CASES = [(action, clients) for clients in (1, 64) for action in ("bump", "bump_sql")]
LABELS = {"bump": "state-only", "bump_sql": "insert + state"}
SYSTEMS = ("pagekv", "miniflare")


@dataclass
class Sample:
    run: Run
    cpu_us: float
    """The server's CPU time per action, µs."""


class Process:
    """A server and its descendants (miniflare runs `workerd` as a child), whose CPU time is read
    from `/proc`."""

    def __init__(self, proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
        self.proc = proc

    def _tree(self) -> list[int]:
        pids, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    todo += [int(c) for c in (task / "children").read_text().split()]
                except OSError:
                    continue
        return pids

    def cpu_seconds(self) -> float:
        ticks = 0
        for pid in self._tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_miniflare(directory: str) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    proc = subprocess.Popen(
        ["node", str(PEER / "serve.mjs"), str(port), directory],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening "):
        proc.kill()
        raise RuntimeError(f"miniflare did not start: {line}{proc.stdout.read()}")
    return proc, line.split()[1].rstrip("/")


async def sample(
    url: str, server: Process, action: str, clients: int, args: argparse.Namespace, tag: str
) -> Sample:
    before = server.cpu_seconds()
    run = await measure(url, action, clients, args.seconds, tag, "raw")
    used = server.cpu_seconds() - before
    actions = run.per_second * args.seconds
    return Sample(run, used / actions * 1e6 if actions else float("nan"))


def _median_range(values: list[float], fmt: str) -> str:
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return f"{fmt.format(statistics.median(values))} ({low}-{high})"


def report(samples: dict[tuple[str, str, int], list[Sample]], args: argparse.Namespace) -> str:
    lines = [
        f"pagekv --kv {args.kv or 'file: (temporary directory)'} vs miniflare (Durable Objects, "
        f"SQLite storage); raw HTTP client; {args.rounds} rounds x {args.seconds:g} s, "
        "medians (min-max)",
        "",
        "| action | clients | pagekv actions/s | miniflare actions/s | ratio "
        "| pagekv CPU µs/action | miniflare CPU µs/action |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for action, clients in CASES:
        ours, theirs = samples["pagekv", action, clients], samples["miniflare", action, clients]
        ratios = [a.run.per_second / b.run.per_second for a, b in zip(ours, theirs, strict=True)]
        lines.append(
            f"| {LABELS[action]} | {clients} "
            f"| {_median_range([s.run.per_second for s in ours], '{:,.0f}')} "
            f"| {_median_range([s.run.per_second for s in theirs], '{:,.0f}')} "
            f"| {_median_range(ratios, '{:.2f}x')} "
            f"| {statistics.median(s.cpu_us for s in ours):,.0f} "
            f"| {statistics.median(s.cpu_us for s in theirs):,.0f} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    if shutil.which("node") is None or not (PEER / "node_modules" / "miniflare").is_dir():
        print(
            "miniflare is not installed: npm install --prefix benchmarks/peers/cloudflare",
            file=sys.stderr,
        )
        return 2
    samples: dict[tuple[str, str, int], list[Sample]] = {
        (system, action, clients): [] for system in SYSTEMS for action, clients in CASES
    }
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        ours = start_server(args.kv or f"file:{tmp}/store")
        theirs, theirs_url = start_miniflare(f"{tmp}/miniflare")
        servers = {
            "pagekv": (ours.url, Process(ours.proc)),
            "miniflare": (theirs_url, Process(theirs)),
        }
        try:
            for round_ in range(args.rounds):
                for action, clients in CASES:
                    order = SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]
                    for system in order:
                        url, process = servers[system]
                        got = await sample(url, process, action, clients, args, f"r{round_}")
                        samples[system, action, clients].append(got)
                        print(
                            f"round {round_ + 1}: {system} {action} x{clients}: "
                            f"{got.run.per_second:,.0f}/s, {got.cpu_us:,.0f} CPU µs/action",
                            file=sys.stderr,
                        )
        finally:
            ours.stop()
            theirs.send_signal(signal.SIGTERM)
            theirs.wait(30)
    print(report(samples, args))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", help="pagekv's store URL (default: file: in a temporary directory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
