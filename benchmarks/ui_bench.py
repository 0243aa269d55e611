"""The web inspector's server costs: the actors page over 10,000 actors, and the live metrics.

    .venv/bin/python benchmarks/ui_bench.py [--actors 10000] [--awake 100] [--seconds 30]

A `file:` store in a temporary directory gets `--actors` actors' registry records (written
directly, as a create writes them, each with 1 KiB in its namespace so that its KV usage is not
zero); `pagekv serve` (a subprocess, `http_bench.start_server`) then serves it, and `--awake`
more actors are created and kept awake through the gateway.

1. The actors page: every page of 50 that the page's Next button fetches
   (`/inspect/actors?limit=50&usage=1&owners=1&after=...`), in order, timed at the client on
   loopback (an upper bound of the server's time), with the page and its script for comparison;
   then the same from `pagekv ui` (a second subprocess, read-only) over the same store.
2. The metrics page's refresh: the server's CPU (utime + stime from /proc) over `--seconds`
   with one `GET /metrics` a second, minus its CPU over as long idle; and its CPU per request
   over 500 requests back to back (finer than the clock ticks the first figure counts in).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from http_bench import TOKEN, start_server

from pagekv.actor.directory.records import REGISTRY_NAMESPACE, actor_id, encode_record, record_key
from pagekv.kv import open_kv

PAGE = 50
_BATCH = 100
_BURST = 500


def populate(kv: str, actors: int) -> None:
    """`actors` registry records of actor `bench`, each with 1 KiB in its own namespace."""
    with open_kv(kv) as store:
        index = store.namespace(REGISTRY_NAMESPACE)
        keys = [f"idle-{n:05}" for n in range(actors)]
        for start in range(0, actors, _BATCH):
            chunk = keys[start : start + _BATCH]
            index.put(
                [(record_key(actor_id("bench", k), 1), encode_record("bench", k, 1)) for k in chunk]
            )
            for k in chunk:
                store.namespace(actor_id("bench", k)).put([(b"data", b"x" * 1024)])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"median {statistics.median(ordered) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms"
    )


def actors_pages(http: httpx.Client, extra: dict[str, int]) -> tuple[list[float], int]:
    """Every page in order, as the Next button walks them: (seconds per page, actors seen)."""
    times, seen, after = [], 0, None
    while True:
        params: dict[str, str | int] = {"limit": PAGE, **extra}
        if after is not None:
            params["after"] = after
        started = time.perf_counter()
        response = http.get("/inspect/actors", params=params)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
        page = response.json()
        seen += len(page["actors"])
        after = page["next_after"]
        if after is None:
            return times, seen


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        kv = f"file:{tmp}/store"
        started = time.perf_counter()
        populate(kv, args.actors)
        print(f"{args.actors} actor records written in {time.perf_counter() - started:.1f} s")
        server = start_server(kv)
        try:
            headers = {"authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
                for n in range(args.awake):
                    http.post(
                        "/actors/bench/actions/bump", params={"key": f"live-{n:03}"}
                    ).raise_for_status()
                for path in ("/", "/ui/app.js"):
                    times = []
                    for _ in range(50):
                        t = time.perf_counter()
                        http.get(path).raise_for_status()
                        times.append(time.perf_counter() - t)
                    print(f"GET {path}: {_ms(times)}")
                for extra in ({}, {"usage": 1}, PAGE_ASKS):
                    walk("pagekv serve", http, extra)
                pid = server.proc.pid
                before = cpu_seconds(pid)
                time.sleep(args.seconds)
                idle = cpu_seconds(pid) - before
                before = cpu_seconds(pid)
                start = time.perf_counter()
                for n in range(args.seconds):
                    http.get("/metrics").raise_for_status()
                    time.sleep(max(0.0, start + n + 1 - time.perf_counter()))
                busy = cpu_seconds(pid) - before
                before = cpu_seconds(pid)
                for _ in range(_BURST):
                    http.get("/metrics").raise_for_status()
                burst = (cpu_seconds(pid) - before) / _BURST
                per = (busy - idle) / args.seconds
                print(
                    f"server CPU over {args.seconds} s with {args.awake} actors awake: idle "
                    f"{idle / args.seconds * 100:.2f} %, with /metrics every second "
                    f"{busy / args.seconds * 100:.2f} %: the refresh costs "
                    f"{per * 100:.2f} % CPU; {_BURST} refreshes back to back: "
                    f"{burst * 1000:.2f} ms of server CPU each"
                )
        finally:
            server.stop()
        view = subprocess.Popen(
            [sys.executable, "-m", "pagekv", "ui", "--kv", kv, "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PAGEKV_TOKEN": TOKEN},
        )
        try:
            assert view.stderr is not None
            url = re.search(r" at (http://\S+)/ ", view.stderr.readline())
            assert url is not None, "pagekv ui did not say where it listens"
            with httpx.Client(base_url=url.group(1), headers=headers, timeout=60) as http:
                walk("pagekv ui", http, PAGE_ASKS)
        finally:
            view.terminate()
            view.wait()


PAGE_ASKS = {"usage": 1, "owners": 1}
"""What the actors page asks: the KV bytes and the owner of each actor."""


def walk(who: str, http: httpx.Client, extra: dict[str, int]) -> None:
    actors_pages(http, extra)  # warm: the index pages are in the cache
    times, seen = actors_pages(http, extra)
    asked = "".join(f", {k}={v}" for k, v in extra.items())
    print(
        f"{who}: actors page (limit={PAGE}{asked}), all {len(times)} pages of {seen} actors: "
        f"{_ms(times)}, {sum(times):.2f} s in all"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, default=10_000)
    parser.add_argument("--awake", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=30)
    main(parser.parse_args())
