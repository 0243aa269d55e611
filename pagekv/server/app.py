"""The ASGI application: routes, middleware, error answers, and the registry's lifetime.

The registry runs inside the app's lifespan: it starts (store opened, registry index ready)
before the server accepts a single connection and stops (every awake actor put to sleep) after
the last request, so there is no lazy initialisation for concurrent first requests to race on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagekv.actor import ActorDefinition, Registry
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.kv import FlushCounts, KvStore, open_kv, redact_url
from pagekv.protocol import ErrorCode
from pagekv.server.app_state import Runtime, StoreView, runtime
from pagekv.server.auth import BearerAuth, ScopedCors
from pagekv.server.cluster.forward import FORWARDED_HEADER, Forwarder
from pagekv.server.cluster.owner_calls import OwnerCalls
from pagekv.server.cluster.peer_auth import MEMBER_PATH, ClusterKey, PeerAuth
from pagekv.server.config import ServerConfig
from pagekv.server.guard import HostAndOriginGuard
from pagekv.server.http_errors import HttpError, classify
from pagekv.server.metrics import CONTENT_TYPE, Exposition, KvMeter, MeteredStore, Reading
from pagekv.server.process.logs import RequestIds
from pagekv.server.request_io import answer, error_answer
from pagekv.server.routes import (
    actor_types,
    gateway,
    inspector,
    inspector_page,
    raw_http,
    sockets,
)

log = logging.getLogger("pagekv.server")
_DRAIN_MARGIN_S = 0.25


async def health(request: Request) -> Response:
    """503 once the registry drains or has stopped (it failed, or the server is shutting down),
    so a load balancer stops sending calls here."""
    registry = runtime(request).registry
    if registry.running and not registry.draining:
        return answer(request, {"status": "ok"})
    status = "draining" if registry.running else "stopped"
    return answer(request, {"status": status}, status=503)


async def drain(app: Starlette, config: ServerConfig) -> None:
    """The start of a graceful stop, while this server still takes connections (its server
    calls it before it closes them, `process/run.py`): the registry lets its actors go
    (`Registry.drain`), every answer to a forwarded call from now on closes its connection,
    and, if other servers share the store, it waits out their forwarders' keep-alive
    (`forward_keepalive_s`): then none of them holds a pooled connection here that it could
    send a call on just as this server closes it (a call whose outcome it could not know)."""
    registry: Registry | None = getattr(app.state, "registry", None)
    if registry is None or not registry.running:
        return
    await registry.drain()
    if registry.address is not None and await registry.peers():
        await anyio.sleep(config.forward_keepalive_s + _DRAIN_MARGIN_S)


class _CloseWhileDraining:
    """Once the registry drains, every answer to a forwarded call closes its connection (see
    `drain`): the forwarder does not reuse it as this server closes it. Direct clients keep
    theirs, since a new connection per call would only meet the listener's close more often."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        forwarded = any(k == FORWARDED_HEADER.encode() for k, _ in scope.get("headers", ()))
        if scope["type"] != "http" or not forwarded:
            await self.app(scope, receive, send)
            return
        state = scope.get("app")

        async def sending(message: Message) -> None:
            registry = getattr(getattr(state, "state", None), "registry", None)
            if message["type"] == "http.response.start" and registry and registry.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, sending)


async def member(request: Request) -> Response:
    """Which registry answers at this address: how a `serve` process checks that the address it
    advertises to the others reaches itself."""
    registry = runtime(request).registry
    return answer(request, {"registry": registry.id, "address": registry.address})


async def metrics(exposition: Exposition, request: Request) -> Response:
    rt = runtime(request)
    instances = rt.registry.live()
    flush_counts = getattr(rt.store, "flush_counts", None)

    def read_storage() -> tuple[list[dict[str, object]], FlushCounts | None]:
        live = [i.ctx.db.database.metrics() for i in instances]
        return live, flush_counts() if flush_counts is not None else None

    storage, flushes = await anyio.to_thread.run_sync(read_storage)
    reading = Reading(rt.registry.metrics(), rt.meter, rt.latency, storage, flushes)
    return Response(exposition.render(reading), media_type=CONTENT_TYPE)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HttpError)
    return error_answer(request, error)


async def _routing_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(
        error.status_code, ErrorCode.INVALID_PARAMETER
    )
    message = f"{request.method} {request.url.path}: {error.detail}"
    return error_answer(request, HttpError(error.status_code, code, message))


async def _client_gone(request: Request, error: Exception) -> Response:
    """The client hung up before its request was read whole: one line at debug level (this
    answer reaches nobody)."""
    log.debug("client disconnected during %s %s", request.method, request.url.path)
    return Response(status_code=499)


async def _internal_error(request: Request, error: Exception) -> Response:
    return error_answer(request, classify(error, in_action=False))


def create_app(
    actors: Iterable[ActorDefinition], *, kv: str | KvStore, config: ServerConfig
) -> Starlette:
    """An app serving `actors` on the store `kv` (a URL is opened and closed by the app)."""
    definitions = list(actors)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        async with _opened(kv) as store:
            meter = KvMeter()
            registry = Registry(
                definitions,
                kv=MeteredStore(store, meter),
                lease=config.lease_s,
                address=config.advertise_url,
                connection_limits=config.connection_limits(),
            )
            app.state.registry = registry  # for the process serving the app (`process/launch.py`)
            forwarder = Forwarder(config, registry)
            registry.remote = owner_calls = OwnerCalls(config)
            try:
                async with registry.run():
                    index = await anyio.to_thread.run_sync(store.namespace, REGISTRY_NAMESPACE)
                    yield {
                        "runtime": Runtime(
                            config,
                            store,
                            anyio.CapacityLimiter(config.inspect_concurrency),
                            _label(kv),
                            index,
                            registry=registry,
                            meter=meter,
                            forwarder=forwarder,
                        )
                    }
            finally:
                await forwarder.aclose()
                await owner_calls.aclose()

    app = _app(
        [
            Route("/health", health, methods=["GET"]),
            Route(MEMBER_PATH, member, methods=["GET"]),
            # an Exposition per app: apps in one process share no metric
            Route("/metrics", partial(metrics, Exposition()), methods=["GET"]),
            *gateway.ROUTES,
            *actor_types.ROUTES,
            *sockets.ROUTES,
            *raw_http.ROUTES,
            *inspector.ROUTES,
            *inspector_page.ROUTES,
        ],
        config,
        lifespan,
        cluster=ClusterKey(config.cluster_secret),
    )
    app.state.drain = partial(drain, app, config)
    return app


def create_store_app(
    *, kv: str | KvStore, config: ServerConfig, label: str | None = None
) -> Starlette:
    """`pagekv ui`: the inspector's page and API over the store `kv`, with no registry: it
    reads the registry's index and snapshots only, so it never takes an actor over nor writes
    (`StoreView`), and runs beside any number of servers of the store. `label` names the store
    on the page (default: `kv`'s URL, redacted)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        async with _opened(kv) as store:
            limiter = anyio.CapacityLimiter(config.inspect_concurrency)
            yield {"runtime": StoreView(config, store, limiter, label or _label(kv))}

    return _app(
        [
            Route("/health", _store_health, methods=["GET"]),
            *inspector.ROUTES,
            *inspector_page.ROUTES,
        ],
        config,
        lifespan,
    )


async def _store_health(request: Request) -> Response:
    return answer(request, {"status": "ok"})


@asynccontextmanager
async def _opened(kv: str | KvStore) -> AsyncIterator[KvStore]:
    """`kv` itself, or the store its URL opens, closed at the end."""
    if not isinstance(kv, str):
        yield kv
        return
    store = await anyio.to_thread.run_sync(open_kv, kv)
    try:
        yield store
    finally:
        store.close()


def _label(kv: str | KvStore) -> str | None:
    return redact_url(kv) if isinstance(kv, str) else None


def _app(
    routes: list[BaseRoute],
    config: ServerConfig,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[dict[str, Any]]],
    *,
    cluster: ClusterKey | None = None,
) -> Starlette:
    """A Starlette app with pagekv's middleware (request ids, Host and Origin, auth, CORS,
    draining) and error answers; with `cluster`, it serves forwarded calls that prove the
    cluster secret (and no others)."""
    middleware = [
        Middleware(RequestIds),
        Middleware(HostAndOriginGuard, config=config),
        Middleware(_CloseWhileDraining),
    ]
    if config.cors_origins:
        middleware.append(Middleware(ScopedCors, origins=config.cors_origins))
    if cluster is not None:
        middleware.append(Middleware(PeerAuth, key=cluster, max_body_bytes=config.max_body_bytes))
    if config.token is not None:
        middleware.append(Middleware(BearerAuth, token=config.token))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HttpError: _http_error,
            HTTPException: _routing_error,
            ClientDisconnect: _client_gone,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # a redirect would be built from the client's Host
    return app
