"""Actions per second over HTTP, with p50/p99 latency, against a real `pagekv serve` process.

    .venv/bin/python benchmarks/http_bench.py [--kv file:DIR] [--rounds 3] [--seconds 3]
                                              [--client raw|pagekv]

Starts `pagekv serve` on this file's `registry` (a subprocess, so the load generator does not
share the server's event loop), then runs each case for `--seconds`, in `--rounds` interleaved
rounds, and prints medians with min-max. Cases: a state-only action (`bump`: one commit of the
state row) and an action with one SQL write (`bump_sql`: INSERT + state in one transaction, one
commit), each at 1 and 50 concurrent clients. Every client is a task with its own keep-alive
HTTP/1.1 connection, calling its own actor in a loop; latency is measured per call.

`--client raw` (the default) sends prebuilt JSON requests on raw sockets, so the figures are the
server's; `--client pagekv` goes through `pagekv.client.HttpClient` (httpx, CBOR), which costs more
client CPU per call than the server spends (on a 2-core machine the two compete).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc

from pagekv.actor import ActorContext, Registry, actor
from pagekv.client import HttpClient

bench = actor("bench", state={"n": 0}, sleep_timeout=3600)


@bench.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v INTEGER)")


@bench.action
async def bump(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    return ctx.state["n"]


@bench.action
async def bump_sql(ctx: ActorContext) -> int:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO t(v) VALUES (?)", (ctx.state["n"],))
        ctx.state["n"] += 1
    return ctx.state["n"]


registry = Registry([bench])

TOKEN = "http-bench-token"
CASES = [(action, clients) for clients in (1, 50) for action in ("bump", "bump_sql")]
LABELS = {"bump": "state-only action", "bump_sql": "action with one SQL write"}


@dataclass
class Run:
    per_second: float
    p50_ms: float
    p99_ms: float


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


class RawCaller:
    """One keep-alive connection sending one prebuilt request; checks every answer is a 200."""

    def __init__(self, url: str, action: str, key: str) -> None:
        self._address = urlsplit(url)
        self._request = (
            f"POST /actors/bench/actions/{action}?key={key} HTTP/1.1\r\n"
            f"host: {self._address.netloc}\r\nauthorization: Bearer {TOKEN}\r\n"
            "content-length: 0\r\n\r\n"
        ).encode()
        self._stream: anyio.abc.SocketStream | None = None
        self._buffer = b""

    async def call(self) -> None:
        if self._stream is None:
            self._stream = await anyio.connect_tcp(self._address.hostname, self._address.port)
        await self._stream.send(self._request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {head!r}")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
        while len(rest) < length:
            rest += await self._stream.receive()
        self._buffer = rest[length:]

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


class PagekvCaller:
    def __init__(self, client: HttpClient, action: str, key: str) -> None:
        self._handle = client.get_or_create("bench", key)
        self._action = action

    async def call(self) -> None:
        await self._handle.call(self._action)

    async def aclose(self) -> None:
        pass


async def measure(url: str, action: str, clients: int, seconds: float, tag: str, kind: str) -> Run:
    latencies: list[float] = []
    async with HttpClient(url, token=TOKEN) as client:
        callers: list[RawCaller | PagekvCaller] = [
            RawCaller(url, action, f"{tag}-{i}")
            if kind == "raw"
            else PagekvCaller(client, action, f"{tag}-{i}")
            for i in range(clients)
        ]
        for caller in callers:  # connect and wake every actor before timing
            await caller.call()
        deadline = time.perf_counter() + seconds

        async def loop(caller: RawCaller | PagekvCaller) -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                await caller.call()
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for caller in callers:
                tg.start_soon(loop, caller)
        elapsed = time.perf_counter() - started
        for caller in callers:
            await caller.aclose()
    latencies.sort()
    return Run(
        len(latencies) / elapsed,
        _percentile(latencies, 0.5) * 1000,
        _percentile(latencies, 0.99) * 1000,
    )


def start_server(kv: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PAGEKV_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagekv.cli", "serve", __file__, "--kv", kv, "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"Uvicorn running on (http://\S+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError(f"pagekv serve exited with {proc.wait()}")


def summary(values: list[float], fmt: str) -> tuple[str, str]:
    return fmt.format(statistics.median(values)), (
        f"{fmt.format(min(values))}-{fmt.format(max(values))}"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        kv = args.kv or f"file:{tmp}/store"
        proc, url = start_server(kv)
        try:
            runs: dict[tuple[str, int], list[Run]] = {case: [] for case in CASES}
            for round_ in range(args.rounds):
                for action, clients in CASES:
                    tag = f"r{round_}"
                    run = await measure(url, action, clients, args.seconds, tag, args.client)
                    runs[action, clients].append(run)
                    print(
                        f"round {round_ + 1}: {action} x{clients}: {run.per_second:,.0f}/s, "
                        f"p50 {run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms",
                        file=sys.stderr,
                    )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    store = kv if args.kv else "file: (temporary directory)"
    print(f"\n{store}, {args.client} client, {args.rounds} rounds, medians")
    print("| action | clients | actions/s (min-max) | p50 ms (min-max) | p99 ms (min-max) |")
    print("|---|---:|---:|---:|---:|")
    for action, clients in CASES:
        case = runs[action, clients]
        rate = summary([r.per_second for r in case], "{:,.0f}")
        p50 = summary([r.p50_ms for r in case], "{:.2f}")
        p99 = summary([r.p99_ms for r in case], "{:.2f}")
        print(
            f"| {LABELS[action]} | {clients} | {rate[0]} ({rate[1]}) | {p50[0]} ({p50[1]}) "
            f"| {p99[0]} ({p99[1]}) |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", help="store URL (default: file: in a temporary directory)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--client", choices=["raw", "pagekv"], default="raw")
    anyio.run(main, parser.parse_args())
