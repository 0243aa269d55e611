"""What a running server holds while its registry runs: shared by the gateway, the inspector and
`/metrics`, made once in the app's lifespan before any request is accepted (so concurrent first
requests never race to initialise anything)."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from starlette.requests import Request

from pagekv.actor import Registry
from pagekv.actor.instance import ActorInstance
from pagekv.kv import ActorKv, KvStore
from pagekv.server.config import ServerConfig
from pagekv.server.forward import Forwarder
from pagekv.server.metrics import LATENCY_BUCKETS_S, Histogram, KvMeter


@dataclass
class Runtime:
    config: ServerConfig
    registry: Registry
    store: KvStore
    """The store itself, unmetered: the inspector's reads are not the actors' round trips."""
    index: ActorKv
    """The registry's index of existing actors."""
    meter: KvMeter
    inspector: anyio.CapacityLimiter
    """The inspector's own worker threads (`ServerConfig.inspect_concurrency`)."""
    forwarder: Forwarder
    """Sends calls for actors another server owns to it."""
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))

    def live(self, actor_id: str) -> ActorInstance | None:
        return next((i for i in self.registry.live() if i.actor_id == actor_id), None)


def runtime(request: Request) -> Runtime:
    return request.state.runtime
