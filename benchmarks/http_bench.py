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
import collections
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
IDLE_S = 4.0
"""A connection idle this long is replaced before a request: uvicorn closes idle keep-alive
connections after 5 s, and a request sent as it does so gets no answer (on a loaded machine the
warm-up of 64 actors, one after the other, took longer than that)."""
CASES = [(action, clients) for clients in (1, 50) for action in ("bump", "bump_sql")]
LABELS = {"bump": "state-only action", "bump_sql": "action with one SQL write"}


@dataclass
class Run:
    per_second: float
    p50_ms: float
    p99_ms: float


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


class UnexpectedAnswer(RuntimeError):
    """An answer other than a 200. Its body was read, so the connection can carry on (the
    placement benchmark counts these instead of stopping)."""

    def __init__(self, head: bytes, body: bytes) -> None:
        super().__init__(f"unexpected answer: {head!r} {body[:300]!r}")
        self.status = int(head.split(b" ", 2)[1])
        self.body = body


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
        self._used_at = 0.0

    async def call(self) -> bytes:
        """The answer's body; `UnexpectedAnswer` for anything but a 200."""
        if self._stream is not None and time.monotonic() - self._used_at > IDLE_S:
            await self.aclose()
        if self._stream is None:
            self._stream = await anyio.connect_tcp(self._address.hostname, self._address.port)
        await self._stream.send(self._request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
        while len(rest) < length:
            rest += await self._stream.receive()
        body, self._buffer = rest[:length], rest[length:]
        self._used_at = time.monotonic()
        if re.search(rb"(?i)\r\nconnection: close", head):  # the server closes it after this
            await self.aclose()
        if not head.startswith(b"HTTP/1.1 200"):
            raise UnexpectedAnswer(head, body)
        return body

    async def aclose(self) -> None:
        """Close the connection; a later `call` opens a new one."""
        if self._stream is not None:
            stream, self._stream, self._buffer = self._stream, None, b""
            await stream.aclose()


class PagekvCaller:
    def __init__(self, client: HttpClient, action: str, key: str) -> None:
        self._handle = client.get_or_create("bench", key)
        self._action = action

    async def call(self) -> None:
        await self._handle.call(self._action)

    async def aclose(self) -> None:
        pass


async def measure(
    url: str,
    action: str,
    clients: int,
    seconds: float,
    tag: str,
    kind: str,
    timed: Callable[[], None] | None = None,
) -> Run:
    """`clients` callers of `action` for `seconds`, once every caller has made a first call
    (connected, its actor awake); `timed` is called as the timed part starts."""
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
        if timed is not None:
            timed()
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


@dataclass
class Server:
    """A `pagekv serve` subprocess. Its stderr is read to the end on a thread of its own, so
    that a server logging a lot (warnings under failures) never blocks on a full pipe."""

    proc: subprocess.Popen[str]
    url: str = ""
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    advertised: list[str] = field(default_factory=list)
    """The URLs each process (each worker, with `--workers`) advertises to the others."""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()


def start_server(kv: str, *args: str, processes: int = 1, app: str = __file__) -> Server:
    """`pagekv serve` on the registry of `app` (this file's by default) at a free port, with
    `args` added; returns once `processes` processes (`--workers`) listen."""
    env = {**os.environ, "PAGEKV_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagekv", "serve", app, "--kv", kv, "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    server = Server(proc)
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            server.log.append(line)
            if match := re.search(r"Uvicorn running on (http://\S+)", line):
                server.url = match.group(1)
            # each process says what it advertises once it listens
            if match := re.search(r"advertising (http://\S+)", line):
                server.advertised.append(match.group(1))
                if len(server.advertised) == processes:
                    ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(60)
    if proc.poll() is not None or not server.url:
        server.stop()
        raise RuntimeError(f"pagekv serve exited with {proc.returncode}:\n{''.join(server.log)}")
    return server


def summary(values: list[float], fmt: str) -> tuple[str, str]:
    return fmt.format(statistics.median(values)), (
        f"{fmt.format(min(values))}-{fmt.format(max(values))}"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        kv = args.kv or f"file:{tmp}/store"
        server = start_server(kv)
        url = server.url
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
            server.stop()
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
