"""`GET /metrics`: `prometheus_client`'s text exposition of the runtime's counters, from a
collector registry per app; values and bucket bounds exact past 10^6.

The commit sizes are checked against an oracle: the test's store is itself a `MeteredStore`
counting into a meter of the test's own, beneath the one the app wraps it in, so both see every
KV write batch the actors send.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import Served, serving

from pagekv.actor import Registry
from pagekv.kv import ActorKv, FileStore, MemoryStore
from pagekv.kv.api import FlushCounts
from pagekv.kv.limits import KvLimits
from pagekv.server.metrics import COMMIT_BUCKETS_BYTES, KvMeter, MeteredStore

pytestmark = pytest.mark.anyio

CATALOG = {
    "pagekv_actors_live": ("gauge", "Actors awake in this process."),
    "pagekv_connections_open": (
        "gauge",
        "Connections open in this process (of awake and hibernating actors).",
    ),
    "pagekv_wakes_total": (
        "counter",
        "Actor wakes (every wake is a takeover of the actor's namespace).",
    ),
    "pagekv_sleeps_total": ("counter", "Actors put to sleep."),
    "pagekv_destroys_total": ("counter", "Actors destroyed."),
    "pagekv_crashes_total": ("counter", "Instances torn down after a failure."),
    "pagekv_takeovers_total": (
        "counter",
        "Instances that found themselves taken over by another process.",
    ),
    "pagekv_actions_total": ("counter", "Actions run (gateway calls and schedules)."),
    "pagekv_owned_elsewhere_total": (
        "counter",
        "Calls for actors another server owned (each then forwarded to it).",
    ),
    "pagekv_forwarded_total": (
        "counter",
        "Calls forwarded to the server owning their actor, and answered by it.",
    ),
    "pagekv_connections_relayed_total": (
        "counter",
        "Connections opened here and relayed to their actor's owner.",
    ),
    "pagekv_housekeeping_errors_total": (
        "counter",
        "Rounds of the registry's background loop that failed (retried).",
    ),
    "pagekv_wake_phase_milliseconds_total": (
        "counter",
        "Time spent in each phase of waking actors.",
    ),
    "pagekv_action_duration_seconds": (
        "histogram",
        "Latency of actions called through the gateway.",
    ),
    "pagekv_kv_round_trips_total": (
        "counter",
        "KV requests made by the actors and the registry, by operation.",
    ),
    "pagekv_commit_bytes": (
        "histogram",
        "Size of each KV write batch to an actor's namespace (one per small commit).",
    ),
    "pagekv_vfs_cache_hits": ("gauge", "Page-cache hits of awake actors."),
    "pagekv_vfs_cache_misses": ("gauge", "Page-cache misses of awake actors."),
    "pagekv_vfs_cache_hit_ratio": ("gauge", "Page-cache hit rate of awake actors."),
}
"""Every family `/metrics` writes, by the name of its `# TYPE` line: type and help text."""


async def scrape(served: Served) -> str:
    async with served.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return response.text


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(text: str, sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` with exactly `labels`."""
    (found,) = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and s.labels == labels
    ]
    return found


def durations(text: str) -> dict[tuple[str, str], float]:
    """Action count by (actor, action), from the latency histogram."""
    family = families(text)["pagekv_action_duration_seconds"]
    return {
        (s.labels["actor"], s.labels["action"]): s.value
        for s in family.samples
        if s.name == "pagekv_action_duration_seconds_count"
    }


def commit_histogram(text: str) -> tuple[dict[float, float], float, float]:
    """Buckets (by bound, parsed), sum and count of the commit-size histogram."""
    samples = families(text)["pagekv_commit_bytes"].samples
    buckets = {float(s.labels["le"]): s.value for s in samples if s.name.endswith("_bucket")}
    (total,) = [s.value for s in samples if s.name == "pagekv_commit_bytes_sum"]
    (count,) = [s.value for s in samples if s.name == "pagekv_commit_bytes_count"]
    return buckets, total, count


def expected_commits(oracle: KvMeter) -> tuple[dict[float, float], float, float]:
    ((_, counts, total),) = oracle.commit_bytes.samples()
    bounds: Iterable[float] = [*COMMIT_BUCKETS_BYTES, math.inf]
    return dict(zip(bounds, map(float, counts), strict=True)), float(total), float(counts[-1])


async def test_a_counter_past_a_million_is_written_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`:g` wrote 1,234,567 as `1.23457e+06`, which reads back as 1,234,570."""
    counted = Registry.metrics

    def long_running(self: Registry) -> dict[str, float]:
        """The counters of a registry that ran 1,234,560 actions before these."""
        metrics = counted(self)
        metrics["actions"] += 1_234_560
        metrics["user.on_migrate_ms_total"] = 1_234_567.125
        return metrics

    monkeypatch.setattr(Registry, "metrics", long_running)
    async with serving() as served:
        async with served.client() as client:
            handle = client.get_or_create("ledger", "k")
            for n in range(7):
                await handle.add(n)
        text = await scrape(served)
    assert value(text, "pagekv_actions_total") == 1_234_567
    (line,) = [line for line in text.splitlines() if line.startswith("pagekv_actions_total ")]
    assert float(line.split(" ")[1]) == 1_234_567  # the text itself, not only the parser's reading
    phase = value(text, "pagekv_wake_phase_milliseconds_total", phase="user.on_migrate")
    assert phase == 1_234_567.125


async def test_the_mebibyte_bucket_bound_and_commit_sizes_are_exact() -> None:
    """The 1,048,576-byte bucket was `le="1.04858e+06"` (1,048,580 read back) and a sum of
    commit sizes past 10^6 was rounded to six digits."""
    oracle = KvMeter()
    # batches of up to 4 MiB, so one commit lands past the 1 MiB bound
    store = MemoryStore(limits=KvLimits(max_batch_bytes=4 << 20))
    async with serving(kv=MeteredStore(store, oracle)) as served:
        async with served.client() as client:
            handle = client.get_or_create("ledger", "k")
            await handle.fill(3, 400_000)
            await handle.add(1)
        text = await scrape(served)
        expected = expected_commits(oracle)  # before the actor's sleep at the end commits
    buckets, total, count = commit_histogram(text)
    assert list(buckets) == [*COMMIT_BUCKETS_BYTES, math.inf]
    assert 1_048_576.0 in buckets
    assert (buckets, total, count) == expected
    assert total > 1_000_000 and buckets[1_048_576.0] < buckets[math.inf]


async def test_the_exposition_is_prometheus_clients_with_every_metric(served: Served) -> None:
    """What the old renderer wrote, every family with its type and help text, now in the standard
    exposition: parsed and written again by `prometheus_client`, it is the same bytes."""
    async with served.client() as client:
        handle = client.get_or_create("ledger", "k")
        await handle.add(1)
        await handle.read()
    async with served.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    parsed = list(text_string_to_metric_families(response.text))
    written = {
        f.name + ("_total" if f.type == "counter" else ""): (f.type, f.documentation)
        for f in parsed
    }
    assert written == CATALOG
    assert len(parsed) == len(CATALOG)

    class Parsed:
        def collect(self) -> list[Metric]:
            return parsed

    again = CollectorRegistry()
    again.register(Parsed())
    assert generate_latest(again) == response.content
    assert durations(response.text) == {("ledger", "add"): 1, ("ledger", "read"): 1}
    assert value(response.text, "pagekv_actors_live") == 1


async def test_two_apps_in_one_process_share_no_metric() -> None:
    oracle_a, oracle_b = KvMeter(), KvMeter()
    async with (
        serving(kv=MeteredStore(MemoryStore(), oracle_a)) as a,
        serving(kv=MeteredStore(MemoryStore(), oracle_b)) as b,
    ):
        async with a.client() as client:
            handle = client.get_or_create("ledger", "k")
            await handle.fill(3, 400_000)
            for n in range(2):
                await handle.add(n)
        async with b.client() as client:
            await client.get_or_create("ledger", "k").read()
        text_a, text_b = await scrape(a), await scrape(b)
        expected_a, expected_b = expected_commits(oracle_a), expected_commits(oracle_b)
    assert value(text_a, "pagekv_actions_total") == 3
    assert value(text_b, "pagekv_actions_total") == 1
    assert durations(text_a) == {("ledger", "fill"): 1, ("ledger", "add"): 2}
    assert durations(text_b) == {("ledger", "read"): 1}
    assert commit_histogram(text_a) == expected_a
    assert commit_histogram(text_b) == expected_b
    assert commit_histogram(text_a)[1] > 1_000_000
    assert b"pagekv_" not in generate_latest(prometheus_client.REGISTRY)


class _FlushCountingStore:
    """A store that reports flush counts as a durable one does: one durable write per KV write
    batch its namespaces send, counted by a meter beneath them, and one flush per two writes."""

    def __init__(self) -> None:
        self.meter = KvMeter()
        self.counted = MeteredStore(MemoryStore(), self.meter)

    def namespace(self, actor_id: str) -> ActorKv:
        return self.counted.namespace(actor_id)

    def close(self) -> None:
        self.counted.close()

    def flush_counts(self) -> FlushCounts:
        writes = self.meter.snapshot().get("write", 0) + 1_234_560
        return FlushCounts(writes=writes, flushes=writes // 2, folds=3)


async def test_a_store_with_flush_counts_has_them_read_at_each_scrape() -> None:
    store = _FlushCountingStore()
    async with serving(kv=store) as served, served.client() as client:
        handle = client.get_or_create("ledger", "k")
        await handle.add(1)
        first = await scrape(served)
        await handle.add(2)
        second = await scrape(served)
        now = store.flush_counts()
    writes_first = value(first, "pagekv_kv_writes_total")
    assert writes_first > 1_234_560  # exact past a million, and the actor's writes counted
    assert value(second, "pagekv_kv_writes_total") == now.writes > writes_first  # read anew
    assert value(second, "pagekv_kv_flushes_total") == now.flushes
    assert value(second, "pagekv_kv_folds_total") == 3
    for name in ("writes", "flushes", "folds"):
        assert families(second)[f"pagekv_kv_{name}"].type == "counter"


async def test_a_store_without_flush_counts_writes_no_flush_metric(served: Served) -> None:
    text = await scrape(served)
    assert "pagekv_kv_round_trips_total" in text
    assert "pagekv_kv_writes" not in text and "pagekv_kv_flushes" not in text


async def test_the_file_stores_flush_counts_are_served(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "kv")
    try:
        async with serving(kv=store) as served, served.client() as client:
            handle = client.get_or_create("ledger", "k")
            await handle.add(1)
            first = await scrape(served)
            await handle.add(2)
            text = await scrape(served)
        for name in ("pagekv_kv_writes_total", "pagekv_kv_flushes_total"):
            assert value(text, name) > value(first, name) > 0, name  # a lone writer flushes
    finally:
        store.close()


async def test_metering_a_store_that_never_waits_keeps_the_actors_work_on_the_event_loop(
    tmp_path: Path,
) -> None:
    """The served registry's store is a `MeteredStore`: over `memory://` it still never waits,
    so the actors' SQL runs on the event loop as in process (it hopped to a worker thread per
    action, a third of the actions/s); over `file:` it waits, and the work goes to threads."""
    memory = MeteredStore(MemoryStore(), KvMeter())
    assert memory.never_waits is True
    assert MeteredStore(MemoryStore(latency_ms=1), KvMeter()).never_waits is False
    file_store = FileStore(tmp_path / "kv")
    try:
        assert MeteredStore(file_store, KvMeter()).never_waits is False
    finally:
        file_store.close()
    async with serving() as served, served.client() as client:
        assert (await client.get_or_create("ledger", "inline").add(1))["count"] == 1
        workers = served.app.state.registry.workers
        assert workers.inline is True and workers.busy() == 0
