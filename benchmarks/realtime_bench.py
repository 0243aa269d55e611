"""Connections against a real `pagekv serve` process: broadcast fan-out latency, actions per
second over one socket, and the server's memory per idle hibernated connection.

    .venv/bin/python benchmarks/realtime_bench.py [--rounds 3] [--fanout 1,100,1000]

The server runs this file's `registry` in a subprocess (`http_bench.start_server`); the clients
are raw `websockets` clients (CBOR frames) in this process, so client and server share the
machine's cores as they would on one host. Cases, interleaved over `--rounds`, medians printed:

- fan-out: N connections subscribed to one room; one HTTP-free action over a socket broadcasts
  a stamp 20 times per round; latency is receipt time minus the stamp (one clock), over every
  receipt of every connection;
- actions/s: one socket with 1 and with 32 action frames in flight, each action a state write
  whose commit the answer waits for plus an event to the caller; and the same write over HTTP,
  one call at a time on a keep-alive connection (httpx), for the ratio;
- memory: on a fresh server, one actor woken by a first connection and asleep; then the
  server's RSS (from /proc) before and after 2,000 more connections to it are opened and it has
  gone back to sleep (its connections' state in its database, the sockets kept), per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import cbor2
import httpx
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).parent))
from http_bench import TOKEN, start_server

from pagekv.actor import ActorContext, Registry, actor

room = actor("room", state={"n": 0}, sleep_timeout=1.0)


@room.on_connect
async def _joined(ctx: ActorContext, conn: Any) -> None:
    conn.state = {"joined": time.time()}


@room.action
async def stamp(ctx: ActorContext, round_: int) -> int:
    return ctx.broadcast("stamp", round_, time.time())


@room.action
async def bump(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    ctx.conn.send("bumped", ctx.state["n"])  # type: ignore[union-attr]
    return ctx.state["n"]


@room.action
async def bump_http(ctx: ActorContext) -> int:
    ctx.state["n"] += 1
    return ctx.state["n"]


registry = Registry([room])


async def _open(url: str, key: str, events: tuple[str, ...] = ()) -> ClientConnection:
    socket = await connect(
        f"{url.replace('http', 'ws', 1)}/actors/room/connect?key={key}&encoding=cbor",
        subprotocols=["pagekv", f"pagekv.token.{TOKEN}"],  # type: ignore[list-item]
        max_size=None,
        compression=None,
    )
    await socket.send(cbor2.dumps({"t": "connect", "params": {}}))
    assert cbor2.loads(await socket.recv())["t"] == "init"
    for i, event in enumerate(events):
        await socket.send(cbor2.dumps({"t": "sub", "id": i + 1, "event": event}))
        assert cbor2.loads(await socket.recv())["t"] == "result"
    return socket


async def fanout(url: str, count: int, key: str, broadcasts: int = 20) -> list[float]:
    """Latencies (ms) of `broadcasts` stamps to `count` subscribed connections."""
    sockets = [await _open(url, key, ("stamp",)) for _ in range(count)]
    latencies: list[float] = []

    async def listen(socket: ClientConnection) -> None:
        for _ in range(broadcasts):
            while True:
                frame = cbor2.loads(await socket.recv())
                if frame.get("t") == "event":
                    latencies.append((time.time() - frame["args"][1]) * 1000)
                    break

    caller = sockets[0]
    async with anyio.create_task_group() as tg:
        for socket in sockets[1:]:
            tg.start_soon(listen, socket)
        for round_ in range(broadcasts):
            await caller.send(
                cbor2.dumps({"t": "action", "id": 100 + round_, "name": "stamp", "args": [round_]})
            )
            got_event = got_result = False
            while not (got_event and got_result):
                frame = cbor2.loads(await caller.recv())
                if frame["t"] == "event":
                    latencies.append((time.time() - frame["args"][1]) * 1000)
                    got_event = True
                elif frame["t"] == "result":
                    got_result = True
            await anyio.sleep(0.05)
    for socket in sockets:
        await socket.close()
    return latencies


async def http_actions_per_second(url: str, key: str, seconds: float = 3.0) -> float:
    """The same action over HTTP, one call at a time on a keep-alive connection."""
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        done, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            answer = await http.post(f"/actors/room/actions/bump_http?key={key}", content=b"{}")
            answer.raise_for_status()
            done += 1
        return done / (time.monotonic() - started)


async def actions_per_second(url: str, key: str, window: int, seconds: float = 3.0) -> float:
    """Actions over one socket, `window` frames in flight."""
    socket = await _open(url, key)
    ids = itertools.count(1)
    in_flight = anyio.Semaphore(window)
    done = 0
    deadline = time.monotonic() + seconds

    async def reader() -> None:
        nonlocal done
        async for data in socket:
            frame = cbor2.loads(data)
            if frame["t"] == "result":
                done += 1
                in_flight.release()
            elif frame["t"] == "error":
                raise RuntimeError(frame)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        started = time.monotonic()
        while time.monotonic() < deadline:
            await in_flight.acquire()
            await socket.send(cbor2.dumps({"t": "action", "id": next(ids), "name": "bump"}))
        finished = done
        elapsed = time.monotonic() - started
        tg.cancel_scope.cancel()
    await socket.close()
    return finished / elapsed


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def memory_per_connection(url: str, pid: int, tag: str, count: int = 2000) -> float:
    """Bytes of server RSS per idle connection of one hibernated actor (woken once before, so
    its wake is not counted)."""
    first = await _open(url, f"{tag}-mem", ("stamp",))
    await anyio.sleep(2.5)  # asleep, its one connection kept
    before = _rss_kib(pid)
    sockets = [await _open(url, f"{tag}-mem", ("stamp",)) for _ in range(count)]
    await anyio.sleep(2.5)  # asleep again, every socket open
    after = _rss_kib(pid)
    for socket in [first, *sockets]:
        await socket.close()
    return (after - before) * 1024 / count


async def main(args: argparse.Namespace) -> None:
    sizes = [int(n) for n in args.fanout.split(",")]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        server = start_server(f"file:{tmp}/store", app=__file__)
        try:
            for round_ in range(args.rounds):
                for n in sizes:
                    lat = await fanout(server.url, n, f"r{round_}-fan{n}")
                    results.setdefault(f"fanout {n} p50", []).append(statistics.median(lat))
                    p99 = statistics.quantiles(lat, n=100)[98] if len(lat) > 1 else lat[0]
                    results.setdefault(f"fanout {n} p99", []).append(p99)
                for window in (1, 32):
                    per_s = await actions_per_second(server.url, f"r{round_}-rate", window)
                    results.setdefault(f"socket actions/s x{window}", []).append(per_s)
                per_s = await http_actions_per_second(server.url, f"r{round_}-http")
                results.setdefault("HTTP actions/s x1", []).append(per_s)
                fresh = start_server(f"file:{tmp}/mem{round_}", app=__file__)
                try:  # on a fresh server: freed memory of earlier rounds would hide the growth
                    mem = await memory_per_connection(fresh.url, fresh.proc.pid, f"r{round_}")
                finally:
                    fresh.stop()
                results.setdefault("bytes/connection", []).append(mem)
                print(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{k} {v[-1]:,.2f}" for k, v in results.items()),
                    file=sys.stderr,
                )
        finally:
            server.stop()
    print(f"\n{args.rounds} rounds, medians (min-max)")
    print("| measure | median | min-max |")
    print("|---|---|---|")
    for name, values in results.items():
        print(
            f"| {name} | {statistics.median(values):,.2f} | {min(values):,.2f}-{max(values):,.2f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fanout", default="1,100,1000")
    asyncio.run(main(parser.parse_args()))
