"""What the routes of an app read and call while it runs, made once in the app's lifespan before
any request is accepted (so concurrent first requests never race to initialise anything).

Two apps share the inspector's routes: `pagekv serve`, whose `Runtime` also runs a registry
(its live instances, the owner routing, the gateway), and `pagekv ui`, whose `StoreView` only
reads the store: it knows no live instance, answers every read itself and refuses every change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request
from starlette.responses import Response

from pagekv.actor import Registry
from pagekv.actor import inspect_reads as view
from pagekv.actor.directory.leases import Forwarded
from pagekv.actor.lifecycle.instance import ActorInstance
from pagekv.kv import ActorKv, KvStore
from pagekv.server.cluster.forward import Forwarder
from pagekv.server.config import ServerConfig
from pagekv.server.metrics import LATENCY_BUCKETS_S, Histogram, KvMeter

Serve = Callable[[Forwarded | None], Awaitable[Response]]


@dataclass
class StoreView:
    """The inspector's reads of a store, with no registry of its own (`pagekv ui`): it never
    takes an actor over and never writes, so it is safe beside any number of live servers.

    Invariant: nothing here creates a namespace. The registry's index is looked up (and only
    once it exists, kept) per request, so a store a server starts using later shows up."""

    config: ServerConfig
    store: KvStore
    """The store itself, unmetered: the inspector's reads are not the actors' round trips."""
    inspector: anyio.CapacityLimiter
    """The inspector's own worker threads (`ServerConfig.inspect_concurrency`)."""
    store_label: str | None = None
    """The store's URL with any password redacted, when the app opened it from one."""
    registry_index: ActorKv | None = None
    """The registry's index namespace once found (`index`)."""

    read_only = True
    """Workflow cancel and replay, which only an actor's owner may do, are refused."""

    @property
    def registry_id(self) -> str | None:
        return None

    def index(self) -> ActorKv | None:
        """The registry's index of existing actors; None while no registry ever ran on the
        store. Blocks: call it on a worker thread."""
        if self.registry_index is None:
            self.registry_index = view.open_index(self.store)
        return self.registry_index

    def live(self, actor_id: str) -> ActorInstance | None:
        return None

    def live_ids(self) -> set[str]:
        return set()

    async def route(self, request: Request, body: bytes, serve: Serve) -> Response:
        """Answer here: a store view has no owner to send anything to."""
        return await serve(None)

    async def locate(self, name: str, key: str) -> None:
        """Nothing to locate: every server's actors are read from the store alike."""


@dataclass
class Runtime(StoreView):
    """A `pagekv serve` app's: the store view of its registry, plus the registry itself."""

    registry: Registry = field(kw_only=True)
    meter: KvMeter = field(kw_only=True)
    forwarder: Forwarder = field(kw_only=True)
    """Sends calls for actors another server owns to it."""
    latency: Histogram = field(kw_only=True, default_factory=lambda: Histogram(LATENCY_BUCKETS_S))

    read_only = False

    @property
    def registry_id(self) -> str | None:
        return self.registry.id

    def live(self, actor_id: str) -> ActorInstance | None:
        return next((i for i in self.registry.live() if i.actor_id == actor_id), None)

    def live_ids(self) -> set[str]:
        return {i.actor_id for i in self.registry.live()}

    async def route(self, request: Request, body: bytes, serve: Serve) -> Response:
        return await self.forwarder.route(request, body, serve)

    async def locate(self, name: str, key: str) -> None:
        await self.registry.placement.locate(name, key)


def store_view(request: Request) -> StoreView:
    return request.state.runtime


def runtime(request: Request) -> Runtime:
    """The runtime of a route only `pagekv serve`'s app has (`create_app`)."""
    rt: Runtime = request.state.runtime
    return rt
