"""`/metrics` in the Prometheus text format, and the meters behind it.

A small renderer of our own counters rather than `prometheus_client`: the runtime already keeps
its counters (`Registry.metrics`, `Database.metrics`), the exposition format is a few lines of
text, and a process-global collector registry would only get in the way of several servers in
one process (as the tests run them).

What is measured where:
- actor counts, wakes, sleeps, takeovers, actions: the registry's counters;
- action latency: around every gateway call (`Histogram`, by actor and action);
- KV round trips and commit sizes: `MeteredStore`, which wraps the store the registry runs on,
  so every request of every actor (awake or asleep since) is counted; a commit is one KV write
  batch to an actor's namespace, so the write-size histogram is the commit-size histogram;
- VFS page-cache hits and misses: summed over the actors awake now (a cache lives and dies with
  its instance, so these are gauges).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pagekv.actor.registry import REGISTRY_NAMESPACE
from pagekv.kv import ActorKv, KvStore
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
            self.sums[labels] += value

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
    """A `KvStore` whose namespaces count their round trips into one `KvMeter`."""

    def __init__(self, inner: KvStore, meter: KvMeter) -> None:
        self.inner = inner
        self.meter = meter

    def namespace(self, actor_id: str) -> ActorKv:
        commits = actor_id != REGISTRY_NAMESPACE
        return _MeteredKv(self.inner.namespace(actor_id), self.meter, commits=commits)

    def close(self) -> None:
        self.inner.close()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Iterable[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Exposition:
    """Builds one `/metrics` answer."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _head(self, name: str, kind: str, help: str) -> None:
        self.lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]

    def metric(self, name: str, kind: str, help: str, value: float) -> None:
        self._head(name, kind, help)
        self.lines.append(f"{name} {value:g}")

    def labelled(
        self, name: str, kind: str, help: str, label: str, values: Mapping[str, float]
    ) -> None:
        self._head(name, kind, help)
        for key, value in sorted(values.items()):
            self.lines.append(f"{name}{_labels([label], [key])} {value:g}")

    def histogram(
        self, name: str, help: str, label_names: Sequence[str], histogram: Histogram
    ) -> None:
        self._head(name, "histogram", help)
        for labels, counts, total in sorted(histogram.samples()):
            for bound, count in zip(histogram.buckets, counts, strict=False):
                le = _labels(label_names, labels, f'le="{bound:g}"')
                self.lines.append(f"{name}_bucket{le} {count}")
            inf = _labels(label_names, labels, 'le="+Inf"')
            self.lines.append(f"{name}_bucket{inf} {counts[-1]}")
            self.lines.append(f"{name}_sum{_labels(label_names, labels)} {total:g}")
            self.lines.append(f"{name}_count{_labels(label_names, labels)} {counts[-1]}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


_REGISTRY_COUNTERS = {
    "wakes": "Actor wakes (every wake is a takeover of the actor's namespace).",
    "sleeps": "Actors put to sleep.",
    "destroys": "Actors destroyed.",
    "crashes": "Instances torn down after a failure.",
    "takeovers": "Calls that found their instance taken over by another process.",
    "actions": "Actions run (gateway calls and schedules).",
    "housekeeping_errors": "Rounds of the registry's background loop that failed (retried).",
}


def render(
    registry_metrics: Mapping[str, float],
    meter: KvMeter,
    latency: Histogram,
    live_storage: Sequence[Mapping[str, object]],
) -> str:
    """The exposition text. `live_storage` holds `Database.metrics()` of every awake actor."""
    out = Exposition()
    out.metric(
        "pagekv_actors_live", "gauge", "Actors awake in this process.", registry_metrics["live"]
    )
    for key, help in _REGISTRY_COUNTERS.items():
        out.metric(f"pagekv_{key}_total", "counter", help, registry_metrics.get(key, 0))
    phases = {
        key.removesuffix("_ms_total"): value
        for key, value in registry_metrics.items()
        if key.endswith("_ms_total")
    }
    out.labelled(
        "pagekv_wake_phase_milliseconds_total",
        "counter",
        "Time spent in each phase of waking actors.",
        "phase",
        phases,
    )
    out.histogram(
        "pagekv_action_duration_seconds",
        "Latency of actions called through the gateway.",
        ("actor", "action"),
        latency,
    )
    out.labelled(
        "pagekv_kv_round_trips_total",
        "counter",
        "KV requests made by the actors and the registry, by operation.",
        "op",
        meter.snapshot(),
    )
    out.histogram(
        "pagekv_commit_bytes",
        "Size of each KV write batch to an actor's namespace (one per small commit).",
        (),
        meter.commit_bytes,
    )
    hits = sum(cast(int, m["cache_hits"]) for m in live_storage)
    misses = sum(cast(int, m["cache_misses"]) for m in live_storage)
    out.metric("pagekv_vfs_cache_hits", "gauge", "Page-cache hits of awake actors.", hits)
    out.metric("pagekv_vfs_cache_misses", "gauge", "Page-cache misses of awake actors.", misses)
    ratio = hits / (hits + misses) if hits + misses else 0.0
    out.metric("pagekv_vfs_cache_hit_ratio", "gauge", "Page-cache hit rate of awake actors.", ratio)
    return out.text()
