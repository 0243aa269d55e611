"""Actions over HTTP on pagekv and on its peers, with the same load client, interleaved:
Cloudflare's runtime (Durable Objects with SQLite storage, in `miniflare`) and RivetKit 2.3.19 (on
its local engine).

    npm install --prefix benchmarks/peers/cloudflare     # miniflare and workerd (~170 MB)
    npm install --prefix benchmarks/peers/rivetkit       # rivetkit and its engine (~340 MB)
    .venv/bin/python benchmarks/peers/http_peers.py [--rounds 5] [--seconds 3] [--kv URL]
                                                    [--peers miniflare rivetkit]

Every system serves the actor of `benchmarks/http_bench.py` behind the same route, and
`http_bench`'s raw client (prebuilt requests on keep-alive connections, a task per client, each
calling its own actor) drives them all: a state-only action (`bump`) and an action with one SQL
insert and the state (`bump_sql`; RivetKit's peer has only `bump`), at 1 and 64 clients. Each
round runs every case on every system, in an order that rotates; the report gives medians, the
ratio pagekv ÷ peer of each round's actions/s (its median, min and max), and the servers' CPU per
action (their process trees' user + system time, from `/proc`, ÷ actions), since on two cores
throughput alone hides what a call costs.

The peers are optional npm installs, never dependencies of pagekv: by default the script runs
those installed, and with none it says how to install them and exits 2.
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
import threading
from dataclasses import dataclass
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from http_bench import Run, UnexpectedAnswer, measure, start_server

HERE = Path(__file__).resolve().parent
CASES = [(action, clients) for clients in (1, 64) for action in ("bump", "bump_sql")]
LABELS = {"bump": "state-only", "bump_sql": "insert + state"}


@dataclass(frozen=True)
class Peer:
    name: str
    directory: Path
    command: tuple[str, ...]
    """`node SCRIPT`; the port (and a data directory) are added."""
    package: str
    """The npm package whose presence says the peer is installed."""
    actions: tuple[str, ...]

    def installed(self) -> bool:
        return (self.directory / "node_modules" / self.package).is_dir()


PEERS = {
    "miniflare": Peer(
        "miniflare", HERE / "cloudflare", ("node", "serve.mjs"), "miniflare", ("bump", "bump_sql")
    ),
    "rivetkit": Peer("rivetkit", HERE / "rivetkit", ("node", "server.mjs"), "rivetkit", ("bump",)),
}


@dataclass
class Sample:
    run: Run
    cpu_us: float
    """The server's CPU time per action, µs."""


@dataclass
class Failed:
    """A peer that failed a case: its answer, kept for the report (pagekv failing stops the run)."""

    reason: str


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


def start_peer(peer: Peer, directory: str) -> tuple[subprocess.Popen[str], str]:
    """The peer's server, once it says where it listens (what it printed before is skipped)."""
    proc = subprocess.Popen(
        [*peer.command, str(_free_port()), directory],
        cwd=peer.directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: RivetKit's engine is a child that must go too
    )
    assert proc.stdout is not None
    said = []
    for line in proc.stdout:
        if line.startswith("listening "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # never a full pipe
            return proc, line.split()[1].rstrip("/")
        said.append(line)
    proc.kill()
    raise RuntimeError(f"{peer.name} did not start:\n{''.join(said)}")


async def sample(
    url: str, server: Process, action: str, clients: int, args: argparse.Namespace, tag: str
) -> Sample:
    before = [server.cpu_seconds()]  # read again once every caller's actor is awake

    def timed() -> None:
        before[0] = server.cpu_seconds()

    run = await measure(url, action, clients, args.seconds, tag, "raw", timed)
    used = server.cpu_seconds() - before[0]
    actions = run.per_second * args.seconds
    return Sample(run, used / actions * 1e6 if actions else float("nan"))


def _median_range(values: list[float], fmt: str) -> str:
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return f"{fmt.format(statistics.median(values))} ({low}-{high})"


def report(
    samples: dict[tuple[str, str, int], list[Sample]],
    peers: list[str],
    args: argparse.Namespace,
    failed: dict[tuple[str, str, int], Failed] | None = None,
) -> str:
    lines = [
        f"pagekv --kv {args.kv or 'file: (temporary directory)'} and {', '.join(peers)}; raw "
        f"HTTP client; {args.rounds} rounds x {args.seconds:g} s, medians (min-max)",
        "",
        "| action | clients | system | actions/s | pagekv ÷ it | CPU µs/action |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for action, clients in CASES:
        ours = samples["pagekv", action, clients]
        for system in ("pagekv", *peers):
            got = samples.get((system, action, clients))
            failure = (failed or {}).get((system, action, clients))
            if failure is not None:  # in some round: its other rounds' figures are left out
                lines.append(
                    f"| {LABELS[action]} | {clients} | {system} | failed: {failure.reason} | | |"
                )
                continue
            if not got:
                continue
            ratios = [a.run.per_second / b.run.per_second for a, b in zip(ours, got, strict=True)]
            ratio = "" if system == "pagekv" else _median_range(ratios, "{:.2f}x")
            lines.append(
                f"| {LABELS[action]} | {clients} | {system} "
                f"| {_median_range([s.run.per_second for s in got], '{:,.0f}')} | {ratio} "
                f"| {statistics.median(s.cpu_us for s in got):,.0f} |"
            )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    wanted = args.peers or [name for name, peer in PEERS.items() if peer.installed()]
    missing = [name for name in wanted if not PEERS[name].installed()]
    if shutil.which("node") is None or not wanted or missing:
        for name in missing or list(PEERS):
            print(
                f"{name} is not installed: npm install --prefix "
                f"{os.path.relpath(PEERS[name].directory)}",
                file=sys.stderr,
            )
        return 2
    samples: dict[tuple[str, str, int], list[Sample]] = {}
    failed: dict[tuple[str, str, int], Failed] = {}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        ours = start_server(args.kv or f"file:{tmp}/store")
        servers: dict[str, tuple[str, Process]] = {"pagekv": (ours.url, Process(ours.proc))}
        started: list[subprocess.Popen[str]] = []
        try:
            for name in wanted:
                proc, url = start_peer(PEERS[name], f"{tmp}/{name}")
                started.append(proc)
                servers[name] = (url, Process(proc))
            systems = list(servers)
            for round_ in range(args.rounds):
                order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
                for action, clients in CASES:
                    for system in order:
                        if system != "pagekv" and action not in PEERS[system].actions:
                            continue
                        if (system, action, clients) in failed:
                            continue
                        url, process = servers[system]
                        try:
                            got = await sample(url, process, action, clients, args, f"r{round_}")
                        except UnexpectedAnswer as e:
                            if system == "pagekv":
                                raise
                            failed[system, action, clients] = Failed(
                                e.body.decode(errors="replace")
                            )
                            print(f"{system} {action} x{clients} failed: {e}", file=sys.stderr)
                            continue
                        samples.setdefault((system, action, clients), []).append(got)
                        print(
                            f"round {round_ + 1}: {system} {action} x{clients}: "
                            f"{got.run.per_second:,.0f}/s, {got.cpu_us:,.0f} CPU µs/action",
                            file=sys.stderr,
                        )
        finally:
            ours.stop()
            for proc in started:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            for name in wanted:  # what a peer started in a session of its own (RivetKit's engine)
                subprocess.run(["pkill", "-f", str(PEERS[name].directory / "node_modules")])
    print(report(samples, wanted, args, failed))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", help="pagekv's store URL (default: file: in a temporary directory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--peers", nargs="+", choices=sorted(PEERS), help="default: every peer installed"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
