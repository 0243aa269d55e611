"""`/metrics` in the Prometheus text format, and the meters behind it.

The runtime keeps its own counters (`Registry.metrics`, `Database.metrics`, the meters below);
`/metrics` turns them into `prometheus_client` metric families at each scrape, through a collector
in a `CollectorRegistry` of the app's own (never `prometheus_client.REGISTRY`, the process-global
one: several apps in one process, as the tests run them, share no metric), and writes them with
`prometheus_client`'s exposition, so every value and bucket bound is exact (a counter of 1,234,567
is `1.234567e+06`, the 1 MiB bucket `le="1.048576e+06"`).

What is measured where:
- actor counts, wakes, sleeps, takeovers, actions: the registry's counters;
- action latency: around every gateway call (`Histogram`, by actor and action);
- KV round trips and commit sizes: `MeteredStore`, which wraps the store the registry runs on,
  so every request of every actor (awake or asleep since) is counted; a commit is one KV write
  batch to an actor's namespace, so the write-size histogram is the commit-size histogram;
- VFS page-cache hits and misses: summed over the actors awake now (a cache lives and dies with
  its instance, so these are gauges);
- durable writes, flushes and folds: the store's own `flush_counts()`, where it has one (the
  `file:` store): `flushes / writes` shows how many acknowledged writes share a flush.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.worker_threads import never_waits
from pagekv.kv import ActorKv, FlushCounts, KvStore
from pagekv.kv.limits import is_mapping
from pagekv.kv.wrappers import KvWrapper

T = TypeVar("T")
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
COMMIT_BUCKETS_BYTES = (256, 1024, 4096, 8192, 16384, 65536, 262144, 1048576)


@dataclass
class Histogram:
    """A cumulative histogram per label tuple. Thread-safe (KV calls run on worker threads)."""

    buckets: tuple[float, ...]
    counts: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    sums: Counter[tuple[str, ...]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        with self._lock:
            counts = self.counts.setdefault(labels, [0] * (len(self.buckets) + 1))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1
            # Counter holds any number; typeshed types its values as int only
            self.sums[labels] += value  # type: ignore[assignment]

    def samples(self) -> list[tuple[tuple[str, ...], list[int], float]]:
        with self._lock:
            return [(labels, list(c), self.sums[labels]) for labels, c in self.counts.items()]


@dataclass
class KvMeter:
    round_trips: Counter[str] = field(default_factory=Counter)
    commit_bytes: Histogram = field(default_factory=lambda: Histogram(COMMIT_BUCKETS_BYTES))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, op: str) -> None:
        with self._lock:
            self.round_trips[op] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.round_trips)


class _MeteredKv(KvWrapper):
    def __init__(self, inner: ActorKv, meter: KvMeter, *, commits: bool) -> None:
        super().__init__(inner)
        self._meter = meter
        self._commits = commits

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._meter.count(op)
        if op == "write" and self._commits:
            put: Mapping[bytes, bytes] | Sequence[tuple[bytes, bytes]] = kwargs["put"]
            items = put.items() if is_mapping(put) else put
            size = sum(len(k) + len(v) for k, v in items) + sum(map(len, kwargs["delete"]))
            self._meter.commit_bytes.observe((), size)
        return fn(*args, **kwargs)


class MeteredStore:
    """A `KvStore` whose namespaces count their round trips into one `KvMeter`. It never waits
    where its store never waits (`KvStore.never_waits`): the registry then runs the actors' work
    on the event loop, as it does in process, not on worker threads."""

    def __init__(self, inner: KvStore, meter: KvMeter) -> None:
        self.inner = inner
        self.meter = meter
        self.never_waits = never_waits(inner)

    def namespace(self, actor_id: str) -> ActorKv:
        commits = actor_id != REGISTRY_NAMESPACE
        return _MeteredKv(self.inner.namespace(actor_id), self.meter, commits=commits)

    def close(self) -> None:
        self.inner.close()


_REGISTRY_COUNTERS = {
    "wakes": "Actor wakes (every wake is a takeover of the actor's namespace).",
    "sleeps": "Actors put to sleep.",
    "destroys": "Actors destroyed.",
    "crashes": "Instances torn down after a failure.",
    "takeovers": "Instances that found themselves taken over by another process.",
    "actions": "Actions run (gateway calls and schedules).",
    "owned_elsewhere": "Calls for actors another server owned (each then forwarded to it).",
    "forwarded": "Calls forwarded to the server owning their actor, and answered by it.",
    "connections_relayed": "Connections opened here and relayed to their actor's owner.",
    "housekeeping_errors": "Rounds of the registry's background loop that failed (retried).",
}
CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The content type of a `/metrics` answer: `prometheus_client`'s text format."""


@dataclass(frozen=True)
class Reading:
    """What one scrape reads: `Registry.metrics()` (read on the event loop, which changes those
    counters), the app's meters, and `Database.metrics()` of every awake actor (read on a worker
    thread, since each takes its page store's lock)."""

    registry: Mapping[str, float]
    meter: KvMeter
    latency: Histogram
    live_storage: Sequence[Mapping[str, object]]
    flushes: FlushCounts | None = None
    """The store's `flush_counts()` (None: the store keeps none, e.g. `memory://`)."""


def _labelled(
    family: CounterMetricFamily | GaugeMetricFamily, values: Mapping[str, float]
) -> CounterMetricFamily | GaugeMetricFamily:
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _histogram(
    name: str, help: str, label_names: Sequence[str], histogram: Histogram
) -> HistogramMetricFamily:
    """`histogram` as a family; its counts are cumulative already (see `Histogram.observe`)."""
    family = HistogramMetricFamily(name, help, labels=label_names)
    bounds = [floatToGoString(bound) for bound in histogram.buckets] + ["+Inf"]
    for labels, counts, total in sorted(histogram.samples()):
        family.add_metric(list(labels), list(zip(bounds, counts, strict=True)), total)
    return family


def families(reading: Reading) -> Iterator[Metric]:
    """The metric families of one reading, in the order of the exposition."""
    registry = reading.registry
    yield GaugeMetricFamily(
        "pagekv_actors_live", "Actors awake in this process.", value=registry["live"]
    )
    yield GaugeMetricFamily(
        "pagekv_connections_open",
        "Connections open in this process (of awake and hibernating actors).",
        value=registry.get("connections", 0),
    )
    for key, help in _REGISTRY_COUNTERS.items():
        yield CounterMetricFamily(f"pagekv_{key}_total", help, value=registry.get(key, 0))
    phases = {
        key.removesuffix("_ms_total"): value
        for key, value in registry.items()
        if key.endswith("_ms_total")
    }
    yield _labelled(
        CounterMetricFamily(
            "pagekv_wake_phase_milliseconds_total",
            "Time spent in each phase of waking actors.",
            labels=["phase"],
        ),
        phases,
    )
    yield _histogram(
        "pagekv_action_duration_seconds",
        "Latency of actions called through the gateway.",
        ("actor", "action"),
        reading.latency,
    )
    yield _labelled(
        CounterMetricFamily(
            "pagekv_kv_round_trips_total",
            "KV requests made by the actors and the registry, by operation.",
            labels=["op"],
        ),
        reading.meter.snapshot(),
    )
    yield _histogram(
        "pagekv_commit_bytes",
        "Size of each KV write batch to an actor's namespace (one per small commit).",
        (),
        reading.meter.commit_bytes,
    )
    hits = sum(cast(int, m["cache_hits"]) for m in reading.live_storage)
    misses = sum(cast(int, m["cache_misses"]) for m in reading.live_storage)
    yield GaugeMetricFamily("pagekv_vfs_cache_hits", "Page-cache hits of awake actors.", hits)
    yield GaugeMetricFamily("pagekv_vfs_cache_misses", "Page-cache misses of awake actors.", misses)
    ratio = hits / (hits + misses) if hits + misses else 0.0
    yield GaugeMetricFamily(
        "pagekv_vfs_cache_hit_ratio", "Page-cache hit rate of awake actors.", ratio
    )
    if reading.flushes is not None:
        for key, help in _FLUSH_COUNTERS.items():
            value = getattr(reading.flushes, key)
            yield CounterMetricFamily(f"pagekv_kv_{key}_total", help, value=value)


_FLUSH_COUNTERS = {
    "writes": "Writes the store made durable since this process opened it.",
    "flushes": "Durable flushes of the store's log (concurrent writes can share one).",
    "folds": "Folds of the store's log into its base.",
}


_NOTHING_YET = Reading({"live": 0}, KvMeter(), Histogram(LATENCY_BUCKETS_S), ())


class RuntimeCollector:
    """A `prometheus_client` collector over the runtime's own counters: each `collect()` turns
    the reading of the scrape under way (`Exposition.render`) into metric families."""

    def __init__(self) -> None:
        self.reading: Reading | None = None

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (what `CollectorRegistry.register` checks names on)."""
        return families(_NOTHING_YET)

    def collect(self) -> Iterator[Metric]:
        assert self.reading is not None, "collected outside Exposition.render"
        return families(self.reading)


class Exposition:
    """The `/metrics` answers of one app, from a `CollectorRegistry` of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._collector = RuntimeCollector()
        self.registry.register(self._collector)
        self._lock = threading.Lock()

    def render(self, reading: Reading) -> bytes:
        """The exposition text (UTF-8) of `reading`."""
        with self._lock:
            self._collector.reading = reading
            try:
                return generate_latest(self.registry)
            finally:
                self._collector.reading = None
