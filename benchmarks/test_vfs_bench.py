"""pytest-benchmark suites for the `pagekv bench` workloads: pagekv and native SQLite side by side.

Every workload is the one `pagekv bench` runs (`pagekv.bench.WORKLOADS`: same set-up, same inputs,
same timed body); each is run on pagekv and on the native baselines matched in durability with the
store, in one benchmark group per workload, for regression tracking with `--benchmark-compare`. The
concurrent workload (`pagekv bench --writers`) is left out: its rows are systems at writer counts.

Run: `.venv/bin/python -m pytest benchmarks/test_vfs_bench.py --benchmark-only`
Environment (all optional):
- `PAGEKV_BENCH_KV`: store URL (default `memory://`); `file:///dir` compares with native
  DELETE+FULL and WAL+FULL in that directory;
- `PAGEKV_BENCH_LATENCY_MS`: simulated latency per KV round trip (default 0);
- `PAGEKV_BENCH_SIZES`: `quick` (default) or `full` (the sizes the targets are set for: 50 MiB
  scan, 100 MiB wake);
- `PAGEKV_BENCH_ROUNDS`: timed rounds per benchmark (default 5).

For pagekv, `extra_info` holds the KV round trips and bytes of the last round, per operation.
For the interleaved, paired comparison and the targets, use `pagekv bench`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from pagekv.bench import (
    PAGEKV,
    WORKLOADS,
    Harness,
    Sizes,
    Subject,
    SystemSpec,
    Workspace,
    baselines_for,
)
from pagekv.bench.sampling import variants
from pagekv.kv import KvStats

URL = os.environ.get("PAGEKV_BENCH_KV", "memory://")
LATENCY_MS = float(os.environ.get("PAGEKV_BENCH_LATENCY_MS", "0"))
SIZES = (
    Sizes.full() if os.environ.get("PAGEKV_BENCH_SIZES") == "full" else Sizes.quick()
).for_latency(LATENCY_MS)
ROUNDS = int(os.environ.get("PAGEKV_BENCH_ROUNDS", "5"))
SYSTEMS = (PAGEKV, *baselines_for(URL))


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    ws = Workspace(URL, LATENCY_MS)
    yield ws
    ws.close()


def _stats_info(stats: KvStats, ops: int) -> dict[str, Any]:
    return {
        "round_trips_per_op": stats.total / ops,
        "round_trips": dict(stats.round_trips),
        "kv_bytes_written_per_op": stats.bytes_written / ops,
        "kv_bytes_read_per_op": stats.bytes_read / ops,
    }


@pytest.mark.parametrize("spec", SYSTEMS, ids=[s.name for s in SYSTEMS])
@pytest.mark.parametrize(
    "name", [n for n, w in WORKLOADS.items() if not w.large_only and not w.writers]
)
def test_workload(
    benchmark: BenchmarkFixture, workspace: Workspace, name: str, spec: SystemSpec
) -> None:
    workload = WORKLOADS[name]
    if workload.needs_reopen and not spec.can_reopen:
        pytest.skip(f"{spec.label} cannot be closed and reopened")
    if not variants(workload, [spec]):
        pytest.skip(f"{spec.label} runs only where the other systems' databases are warm")
    benchmark.group = name
    harness = Harness(workspace, workload, [spec], SIZES)
    data = workload.inputs(SIZES, random.Random(f"{name}:0"))
    current: list[Subject] = []
    ops: list[int] = []

    def finish_round() -> None:
        """Dispose of the last round's database; keep its KV traffic (untimed)."""
        if current:
            subject = current.pop()
            stats = subject.kv_reset()
            if stats is not None and ops:
                benchmark.extra_info.update(_stats_info(stats, ops[-1]))
            harness.done(subject)

    def setup() -> tuple[tuple[Subject, Any], dict[str, Any]]:
        finish_round()
        subject = harness.ready(spec)
        subject.kv_reset()
        current.append(subject)
        return (subject, data), {}

    def body(subject: Subject, inputs: Any) -> None:
        ops.append(workload.body(subject, inputs))

    harness.open(spec)
    try:
        benchmark.pedantic(body, setup=setup, rounds=ROUNDS, iterations=1)
        finish_round()
    finally:
        harness.close()
    benchmark.extra_info["ops_per_round"] = ops[-1]
    benchmark.extra_info["unit"] = workload.unit
    benchmark.extra_info["title"] = workload.describe(SIZES)
