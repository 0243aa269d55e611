"""Several `pagekv serve` processes on one store (issue #28, placement): round-robin calls across
two servers, failover after SIGKILL of an actor's owner, and `serve --workers 2` against 1.

    .venv/bin/python benchmarks/placement_bench.py [--quick] [--json] [--kv postgresql|file|URL]

Every server is a real `pagekv serve` subprocess on loopback serving `http_bench.py`'s `bench`
actor, whose `bump` adds 1 to a counter in its state (one commit) and returns it. The load comes
from `http_bench.RawCaller`s (prebuilt JSON requests on keep-alive sockets, so the figures are
the servers', and every answer that is not a 200 is counted, never retried), except in the
failover, which goes through `pagekv.client.HttpClient` because its retries and its account of
calls whose outcome is unknown are what is measured there. The store is a throwaway PostgreSQL
cluster (`fsync=on`) when PostgreSQL's binaries are installed, else `file:` in a temporary
directory (`--kv` picks; the header says which ran).

1. Round-robin: servers A and B; N requests a case (1,200; 300 with `--quick`) sent alternately
   to A and B, against the same requests all sent to A, in interleaved repetitions (medians;
   ratios are medians of each repetition's pair). Cases: one actor from one client
   (sequential), one actor from 8 concurrent clients, 8 actors from 8 clients (one each).
   Checked: no failed request; each actor's counter, read by one more call, equals the calls
   acknowledged, and those returned 1..acknowledged, each once (a write lost, repeated or run
   twice would show); wakes and takeovers are the difference of both servers' `/metrics`.
2. Failover: A and B with `--lease 2`; the actor is woken on A; one writer calls it through A,
   one through B (forwarded to A), each one call at a time; A is SIGKILLed 1-2 s later, at
   another point of its lease's renewal period (half the lease) each repetition. The
   writer through A sends its calls to B once A is unreachable (as a load balancer would;
   a call refused at the connection, which was not sent, is not counted). Measured: the
   time from the kill to the first answer to a call sent after it; acknowledged writes lost
   (a value returned twice, or above the final counter); calls whose outcome is unknown
   (`ServerUnreachable` after the request went out, 503 `owner_timeout`), counted apart from
   calls that failed having written nothing.
3. Workers: `serve --workers 2` against `--workers 1` (fresh servers each repetition,
   interleaved), 64 actors, 64 concurrent clients, each calling its own actor in a loop
   (`http_bench.measure`); calls per worker are read from each worker's own `/metrics`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx
from http_bench import TOKEN, RawCaller, Server, UnexpectedAnswer, measure, start_server

from pagekv.client import HttpClient, RemoteError, ServerUnreachable
from pagekv.kv.pg_cluster import TempCluster, find_pg_bin
from pagekv.protocol import ErrorCode

ACTOR = "bench"
LEASE_S = 2.0
LONGEST_CLIENT_WAIT_S = 1.0
"""`HttpClient`'s longest wait between two attempts: how late after the lease, at most, a
client that keeps being told to retry sends the call that the new owner serves."""
FAILOVER_TIMEOUT_S = 20.0
ROUND_ROBIN_CASES = [
    ("one actor, sequential", 1, 1),
    ("one actor, 8 clients", 1, 8),
    ("8 actors, 8 clients", 8, 8),
]
"""(label, actors, concurrent clients)."""
WORKER_CLIENTS = 64
TARGET_RATIO = 0.8
TARGET_WAKES = 2
TARGET_WORKERS_RATIO = 1.6


@dataclass
class Plan:
    requests: int
    round_robin_reps: int
    failover_reps: int
    workers_reps: int
    workers_seconds: float


FULL = Plan(requests=1200, round_robin_reps=3, failover_reps=3, workers_reps=3, workers_seconds=4)
QUICK = Plan(requests=300, round_robin_reps=2, failover_reps=1, workers_reps=1, workers_seconds=2)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def totals(urls: Sequence[str]) -> Counter[str]:
    """The `pagekv_*_total` counters of the servers at `urls`, summed."""
    found: Counter[str] = Counter()
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=10) as http:
        for url in urls:
            response = await http.get(url + "/metrics")
            response.raise_for_status()
            for name, value in re.findall(r"^pagekv_(\w+)_total (\S+)$", response.text, re.M):
                found[name] += int(float(value))
    return found


async def start(kv: str, *args: str, processes: int = 1) -> Server:
    return await anyio.to_thread.run_sync(partial(start_server, kv, *args, processes=processes))


@contextlib.asynccontextmanager
async def servers(kv: str, count: int, *args: str) -> AsyncIterator[list[Server]]:
    """`count` servers on `kv`, started at once; stopped (SIGTERM) at the end, unless dead."""
    started: list[Server] = []

    async def one() -> None:
        started.append(await start(kv, *args))

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
        yield started
    except BaseException:
        show_logs(started)
        raise
    finally:
        for server in started:
            await anyio.to_thread.run_sync(server.stop)


def show_logs(started: Sequence[Server], lines: int = 20) -> None:
    """What the servers said last: the run failed, and their side of it may say why."""
    for server in started:
        log(f"--- the last lines of the server at {server.url} (pid {server.proc.pid}):")
        log("".join(list(server.log)[-lines:]).rstrip())


def _error_code(body: bytes) -> str:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(body)["error"]["code"])
    return body[:40].decode(errors="replace")


async def bump(caller: RawCaller, failures: Counter[str]) -> int | None:
    """One call; the counter it returned, or None, counted in `failures` by what went wrong."""
    try:
        body = await caller.call()
    except UnexpectedAnswer as e:
        failures[f"{e.status} {_error_code(e.body)}"] += 1
        return None
    except (OSError, anyio.EndOfStream, anyio.BrokenResourceError) as e:
        failures[f"connection lost ({type(e).__name__})"] += 1
        with contextlib.suppress(Exception):
            await caller.aclose()
        return None
    return int(json.loads(body)["result"])


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


@dataclass
class RoundRobinRun:
    case: str
    servers: int
    requests: int
    acknowledged: int
    failed: dict[str, int]
    per_second: float
    p50_ms: float
    p99_ms: float
    wakes: int
    takeovers: int
    forwarded: int
    counters_match: bool
    """Every actor's final counter equals its acknowledged calls, which returned 1..n once each."""
    mismatches: list[str] = field(default_factory=list)


async def round_robin(
    urls: list[str], all_urls: list[str], case: str, actors: int, clients: int, n: int, tag: str
) -> RoundRobinRun:
    """`n` calls from `clients` concurrent clients to `actors` new actors, request j of client c
    going to `urls[(c + j) % len(urls)]`."""
    keys = [f"{tag}-{i}" for i in range(actors)]
    returned: dict[str, list[int]] = {key: [] for key in keys}
    failures: Counter[str] = Counter()
    latencies: list[float] = []
    before = await totals(all_urls)

    async def client(c: int) -> None:
        key = keys[c % actors]
        callers = [RawCaller(url, "bump", key) for url in urls]
        try:
            for j in range(n // clients):
                started = time.perf_counter()
                value = await bump(callers[(c + j) % len(callers)], failures)
                latencies.append(time.perf_counter() - started)
                if value is not None:
                    returned[key].append(value)
        finally:
            for caller in callers:
                await caller.aclose()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for c in range(clients):
            tg.start_soon(client, c)
    elapsed = time.perf_counter() - started
    mismatches = []
    for key in keys:  # the counter each actor ends with: one more call's answer, less that call
        caller = RawCaller(urls[0], "bump", key)
        final = await bump(caller, failures)
        await caller.aclose()
        values = sorted(returned[key])
        counter = None if final is None else final - 1
        if counter != len(values) or values != list(range(1, len(values) + 1)):
            duplicates = len(values) - len(set(values))
            mismatches.append(
                f"{key}: counter {counter}, {len(values)} acknowledged, {duplicates} values "
                "returned twice"
            )
    after = await totals(all_urls)
    acknowledged = sum(map(len, returned.values()))
    return RoundRobinRun(
        case=case,
        servers=len(urls),
        requests=n // clients * clients,
        acknowledged=acknowledged,
        failed=dict(failures),
        per_second=acknowledged / elapsed,
        p50_ms=_percentile(latencies, 0.5) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        wakes=after["wakes"] - before["wakes"],
        takeovers=after["takeovers"] - before["takeovers"],
        forwarded=after["forwarded"] - before["forwarded"],
        counters_match=not mismatches,
        mismatches=mismatches,
    )


async def run_round_robin(kv: str, plan: Plan) -> list[RoundRobinRun]:
    runs: list[RoundRobinRun] = []
    async with servers(kv, 2) as (a, b):
        for rep in range(plan.round_robin_reps):
            for index, (case, actors, clients) in enumerate(ROUND_ROBIN_CASES):
                # alternate which goes first, so neither always meets a warmer machine
                order = [1, 2] if (rep + index) % 2 == 0 else [2, 1]
                for count in order:
                    urls = [a.url] if count == 1 else [a.url, b.url]
                    tag = f"rr{rep}-{index}-{count}"
                    run = await round_robin(
                        urls, [a.url, b.url], case, actors, clients, plan.requests, tag
                    )
                    runs.append(run)
                    log(
                        f"round-robin rep {rep + 1}: {case}, {count} server(s): "
                        f"{run.per_second:,.0f}/s, failed {sum(run.failed.values())}, "
                        f"wakes {run.wakes}, takeovers {run.takeovers}, "
                        f"forwarded {run.forwarded}, "
                        f"counters {'ok' if run.counters_match else 'WRONG'}"
                    )
    return runs


@dataclass
class FailoverRun:
    lease_s: float
    served_after_s: float | None
    """From the SIGKILL to the first answer to a call sent after it (None: none came)."""
    acknowledged: int
    final_counter: int | None
    lost: int
    """Acknowledged writes missing: values returned twice, or above the final counter."""
    ran_unacknowledged: int | None
    """Final counter less acknowledged calls: calls that ran without their answer arriving."""
    unknown: dict[str, int]
    failed: dict[str, int]
    retries: int
    takeovers_on_b: int
    wakes_on_b: int


async def failover(kv: str, tag: str, load_s: float, after_s: float = 1.0) -> FailoverRun:
    lease = ["--lease", f"{LEASE_S:g}"]
    async with servers(kv, 2, *lease) as (a, b):
        via_a = HttpClient(a.url, token=TOKEN, retry_for=0)  # it moves to B instead of retrying
        via_b = HttpClient(b.url, token=TOKEN, retry_for=15.0)
        acknowledged: list[int] = [await via_a.get_or_create(ACTOR, tag).bump()]  # A owns it
        unknown: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        killed_at: float | None = None
        served_at: float | None = None
        served = anyio.Event()
        stop = anyio.Event()

        async def writer(clients: list[HttpClient]) -> None:
            nonlocal served_at
            current = 0
            while not stop.is_set():
                sent_at = time.monotonic()
                handle = clients[current].get_or_create(ACTOR, tag)
                try:
                    value = await handle.bump()
                except ServerUnreachable as e:
                    nothing_sent = isinstance(
                        e.__cause__, httpx.ConnectError | httpx.ConnectTimeout
                    )
                    if not nothing_sent:
                        unknown["ServerUnreachable, may have run"] += 1
                    elif current + 1 == len(clients):  # no other server to send it to
                        failed["ServerUnreachable, nothing sent"] += 1
                    current = min(current + 1, len(clients) - 1)
                    continue
                except RemoteError as e:
                    if e.code == ErrorCode.OWNER_TIMEOUT:
                        unknown[f"{e.status} {e.code}"] += 1
                    else:
                        failed[f"{e.status} {e.code}"] += 1
                    continue
                except Exception as e:
                    failed[type(e).__name__] += 1
                    continue
                acknowledged.append(value)
                if killed_at is not None and sent_at >= killed_at and served_at is None:
                    served_at = time.monotonic()
                    served.set()

        async def kill_a() -> None:
            nonlocal killed_at
            await anyio.sleep(load_s)
            a.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            with anyio.move_on_after(FAILOVER_TIMEOUT_S):
                await served.wait()
            await anyio.sleep(after_s)
            stop.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer, [via_a, via_b])
            tg.start_soon(writer, [via_b])
            tg.start_soon(kill_a)
        try:
            final: int | None = await via_b.get_or_create(ACTOR, tag).bump() - 1
        except Exception as e:
            log(f"failover: the final read through B failed: {e!r}")
            final = None
        b_totals = await totals([b.url])
        retries = via_a.retries + via_b.retries
        await via_a.aclose()
        await via_b.aclose()
    lost = len(acknowledged) - len(set(acknowledged))
    if final is not None:
        lost += sum(1 for v in acknowledged if v > final)
    assert killed_at is not None
    return FailoverRun(
        lease_s=LEASE_S,
        served_after_s=None if served_at is None else served_at - killed_at,
        acknowledged=len(acknowledged),
        final_counter=final,
        lost=lost,
        ran_unacknowledged=None if final is None else final - len(acknowledged),
        unknown=dict(unknown),
        failed=dict(failed),
        retries=retries,
        takeovers_on_b=b_totals["takeovers"],
        wakes_on_b=b_totals["wakes"],
    )


async def run_failover(kv: str, plan: Plan) -> list[FailoverRun]:
    runs = []
    for rep in range(plan.failover_reps):
        # The owner renews its lease every half lease: a kill always at the same point of that
        # period would always find the same lease left (a kill at 1 s found 2 s or 1 s left,
        # as the renewal raced it).
        phase = (rep + 0.5) / plan.failover_reps
        run = await failover(kv, f"fo{rep}", load_s=LEASE_S / 2 * (1 + phase))
        runs.append(run)
        served = "never" if run.served_after_s is None else f"{run.served_after_s:.2f} s"
        log(
            f"failover rep {rep + 1}: served by B {served} after the kill, "
            f"{run.acknowledged} acknowledged, final counter {run.final_counter}, "
            f"lost {run.lost}, unknown {sum(run.unknown.values())}, "
            f"failed {sum(run.failed.values())}, retries {run.retries}"
        )
    return runs


@dataclass
class WorkersRun:
    workers: int
    per_second: float
    p50_ms: float
    p99_ms: float
    calls_per_worker: list[int]
    forwarded: int


async def workers_run(kv: str, workers: int, seconds: float, tag: str) -> WorkersRun:
    server = await start(kv, "--workers", str(workers), processes=workers)
    try:
        before = [await totals([url]) for url in server.advertised]
        run = await measure(server.url, "bump", WORKER_CLIENTS, seconds, tag, "raw")
        after = [await totals([url]) for url in server.advertised]
    except BaseException:
        show_logs([server])
        raise
    finally:
        await anyio.to_thread.run_sync(server.stop)
    return WorkersRun(
        workers=workers,
        per_second=run.per_second,
        p50_ms=run.p50_ms,
        p99_ms=run.p99_ms,
        calls_per_worker=[x["actions"] - y["actions"] for x, y in zip(after, before, strict=True)],
        forwarded=sum(x["forwarded"] - y["forwarded"] for x, y in zip(after, before, strict=True)),
    )


async def run_workers(kv: str, plan: Plan) -> list[WorkersRun]:
    runs = []
    for rep in range(plan.workers_reps):
        for workers in [1, 2] if rep % 2 == 0 else [2, 1]:
            run = await workers_run(kv, workers, plan.workers_seconds, f"w{rep}-{workers}")
            runs.append(run)
            log(
                f"workers rep {rep + 1}: --workers {workers}: {run.per_second:,.0f}/s, "
                f"p99 {run.p99_ms:.1f} ms, calls per worker {run.calls_per_worker}"
            )
    return runs


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _status(met: bool) -> str:
    return "met" if met else "missed"


def _round_robin_summary(runs: list[RoundRobinRun]) -> list[dict[str, Any]]:
    cases = []
    for case, actors, clients in ROUND_ROBIN_CASES:
        sides = {n: [r for r in runs if r.case == case and r.servers == n] for n in (1, 2)}
        pairs = zip(sides[1], sides[2], strict=True)  # one pair a repetition
        ratios = [two.per_second / one.per_second for one, two in pairs]
        cases.append(
            {
                "case": case,
                "actors": actors,
                "clients": clients,
                "ratio": _median(ratios),
                "ratios": ratios,
                **{
                    f"{count}_servers": {
                        "per_second": _median([r.per_second for r in mine]),
                        "per_second_min": min(r.per_second for r in mine),
                        "per_second_max": max(r.per_second for r in mine),
                        "p50_ms": _median([r.p50_ms for r in mine]),
                        "p99_ms": _median([r.p99_ms for r in mine]),
                        "requests": sum(r.requests for r in mine),
                        "failed": sum(sum(r.failed.values()) for r in mine),
                        "most_wakes_per_actor": max(r.wakes for r in mine) / actors,
                        "takeovers": sum(r.takeovers for r in mine),
                        "forwarded": _median([r.forwarded for r in mine]),
                        "counters_match": all(r.counters_match for r in mine),
                    }
                    for count, mine in sides.items()
                },
            }
        )
    return cases


def summarize(
    rr: list[RoundRobinRun], fo: list[FailoverRun], wk: list[WorkersRun]
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The summary figures, and the targets table (target, measured, status)."""
    cases = _round_robin_summary(rr)
    by_workers = {n: [r for r in wk if r.workers == n] for n in (1, 2)}
    worker_ratios = [
        two.per_second / one.per_second
        for one, two in zip(by_workers[1], by_workers[2], strict=True)
    ]
    served = [r.served_after_s for r in fo]
    summary = {
        "round_robin": cases,
        "failover": {
            "lease_s": LEASE_S,
            "served_after_s_median": _median([s for s in served if s is not None]),
            "served_after_s_worst": None if None in served else max(served),
            "lost": sum(r.lost for r in fo),
            "unknown": sum(sum(r.unknown.values()) for r in fo),
            "failed": sum(sum(r.failed.values()) for r in fo),
        },
        "workers": {
            "ratio": _median(worker_ratios),
            "ratios": worker_ratios,
            **{
                f"{n}_workers_per_second": _median([r.per_second for r in runs])
                for n, runs in by_workers.items()
            },
        },
    }
    targets: list[dict[str, str]] = []

    def target(name: str, measured: str, met: bool) -> None:
        targets.append({"target": name, "measured": measured, "status": _status(met)})

    two = [c["2_servers"] for c in cases]
    failed = sum(side["failed"] for side in two)
    target(
        "round-robin on 2 servers: no failed request",
        f"{failed} of {sum(side['requests'] for side in two):,}",
        failed == 0,
    )
    for case in cases:
        target(
            f"{case['case']}: 2 servers >= {TARGET_RATIO}x 1 server",
            f"{case['ratio']:.2f}x ({case['2_servers']['per_second']:,.0f} against "
            f"{case['1_servers']['per_second']:,.0f}/s)",
            case["ratio"] >= TARGET_RATIO,
        )
    for case in cases:
        wakes = case["2_servers"]["most_wakes_per_actor"]
        target(
            f"{case['case']}: wakes per actor <= {TARGET_WAKES} (worst repetition)",
            f"{wakes:g}",
            wakes <= TARGET_WAKES,
        )
    match = all(c[f"{n}_servers"]["counters_match"] for c in cases for n in (1, 2))
    target("round-robin: final counter = acknowledged calls", "yes" if match else "NO", match)
    bound = LEASE_S + LONGEST_CLIENT_WAIT_S
    worst = summary["failover"]["served_after_s_worst"]
    target(
        f"failover: served by B within lease + client wait ({bound:g} s), worst",
        "never" if worst is None else f"{worst:.2f} s",
        worst is not None and worst <= bound,
    )
    lost = summary["failover"]["lost"]
    target("failover: acknowledged writes lost = 0", str(lost), lost == 0)
    ratio = summary["workers"]["ratio"]
    target(
        f"--workers 2 >= {TARGET_WORKERS_RATIO}x --workers 1 ({WORKER_CLIENTS} clients)",
        f"{ratio:.2f}x",
        ratio >= TARGET_WORKERS_RATIO,
    )
    return summary, targets


def _failures(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "0"


def print_report(report: dict[str, Any]) -> None:
    machine, plan, summary = report["machine"], report["plan"], report["summary"]
    print(
        f"\nplacement_bench on {report['store']}; {machine['cpus']} CPUs (os.cpu_count()), "
        f"load {machine['load_before']} before, {machine['load_after']} after; "
        f"{'--quick' if report['quick'] else 'full run'}"
    )
    print(
        f"\n1. Two servers on one store, calls alternating between them, "
        f"{plan['requests']:,} requests a case, {plan['round_robin_reps']} interleaved "
        "repetitions, medians"
    )
    print(
        "| case | servers | requests/s (min-max) | p50 ms | p99 ms | failed | wakes per actor "
        "(worst) | takeovers | forwarded | counter = acknowledged |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in summary["round_robin"]:
        for count, label in ((1, "A only"), (2, "A, B alternately")):
            side = case[f"{count}_servers"]
            print(
                f"| {case['case']} | {label} | {side['per_second']:,.0f} "
                f"({side['per_second_min']:,.0f}-{side['per_second_max']:,.0f}) "
                f"| {side['p50_ms']:.2f} | {side['p99_ms']:.2f} | {side['failed']} "
                f"| {side['most_wakes_per_actor']:g} | {side['takeovers']} "
                f"| {side['forwarded']:g} | {'yes' if side['counters_match'] else 'NO'} |"
            )
    for run in report["round_robin_runs"]:
        if run["failed"] or run["mismatches"]:
            print(
                f"  {run['case']}, {run['servers']} server(s): failed {_failures(run['failed'])}"
                + "".join(f"; {m}" for m in run["mismatches"])
            )
    print(
        f"\n2. Failover: SIGKILL of the owner A under load (--lease {LEASE_S:g}), writers "
        "through A and through B"
    )
    print(
        "| rep | kill to first answer | acknowledged | final counter | lost | ran without "
        "answer | unknown outcome | failed, nothing written | client retries | wakes on B "
        "| takeovers on B |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for i, run in enumerate(report["failover_runs"], 1):
        served = "never" if run["served_after_s"] is None else f"{run['served_after_s']:.2f} s"
        print(
            f"| {i} | {served} | {run['acknowledged']:,} | {run['final_counter']} "
            f"| {run['lost']} | {run['ran_unacknowledged']} | {_failures(run['unknown'])} "
            f"| {_failures(run['failed'])} | {run['retries']} | {run['wakes_on_b']} "
            f"| {run['takeovers_on_b']} |"
        )
    print(
        f"\n3. serve --workers 2 against --workers 1: {WORKER_CLIENTS} actors, "
        f"{WORKER_CLIENTS} clients, {plan['workers_seconds']:g} s, {plan['workers_reps']} "
        "interleaved repetitions"
    )
    print("| workers | actions/s | p50 ms | p99 ms | calls per worker | forwarded |")
    print("|---:|---:|---:|---:|---|---:|")
    for run in report["workers_runs"]:
        per_worker = " / ".join(f"{n:,}" for n in run["calls_per_worker"])
        print(
            f"| {run['workers']} | {run['per_second']:,.0f} | {run['p50_ms']:.2f} "
            f"| {run['p99_ms']:.2f} | {per_worker} | {run['forwarded']} |"
        )
    print("\nTargets")
    print("| target | measured | status |")
    print("|---|---|---|")
    for row in report["targets"]:
        print(f"| {row['target']} | {row['measured']} | {row['status']} |")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def store(choice: str | None) -> Iterator[tuple[str, str]]:
    """The store URL and how to name it: a throwaway PostgreSQL cluster (`fsync=on`) if
    PostgreSQL is installed and nothing else was asked for, else `file:` in a temporary
    directory, or the URL given."""
    if choice is None:
        choice = "postgresql" if find_pg_bin() is not None else "file"
    if choice in ("postgresql", "postgres"):
        with TempCluster(fsync=True) as cluster:
            yield cluster.url, "postgresql:// (throwaway cluster on 127.0.0.1, fsync=on)"
    elif choice == "file":
        with tempfile.TemporaryDirectory(prefix="placement-") as tmp:
            yield f"file:{tmp}/store", "file: (temporary directory)"
    else:
        yield choice, choice


async def main(args: argparse.Namespace) -> None:
    plan = QUICK if args.quick else FULL
    load_before = _load()
    started = time.monotonic()
    with store(args.kv) as (kv, label):
        log(f"store: {label}")
        rr = await run_round_robin(kv, plan)
        fo = await run_failover(kv, plan)
        wk = await run_workers(kv, plan)
    summary, targets = summarize(rr, fo, wk)
    report = {
        "store": label,
        "quick": args.quick,
        "seconds": round(time.monotonic() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "load_before": load_before,
            "load_after": _load(),
            "python": sys.version.split()[0],
        },
        "plan": asdict(plan),
        "summary": summary,
        "targets": targets,
        "round_robin_runs": [asdict(r) for r in rr],
        "failover_runs": [asdict(r) for r in fo],
        "workers_runs": [asdict(r) for r in wk],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repetitions")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--kv",
        help="postgresql (a throwaway cluster), file (a temporary directory) or a store URL "
        "(default: postgresql if its binaries are installed, else file)",
    )
    anyio.run(main, parser.parse_args())
