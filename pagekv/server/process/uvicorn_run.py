"""Running the app under uvicorn in the current event loop.

uvicorn owns SIGINT and SIGTERM: on either, the app first drains (`app.drain`: its actors are
put to sleep, their leases released, and its answers close their connections) while it still
takes connections; then uvicorn stops accepting them, lets requests in flight finish (up to
`GRACEFUL_S`), runs the app's lifespan shutdown, and finally re-raises the signal as the
process's own exit.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

import uvicorn
from starlette.applications import Starlette

from pagekv.actor import ActorDefinition
from pagekv.kv import KvStore
from pagekv.server.app import create_app, create_store_app
from pagekv.server.config import GRACEFUL_S, ServerConfig
from pagekv.server.process.http_protocol import http_protocol


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, with the app's drain before it closes any connection."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = getattr(getattr(self.config.app, "state", None), "drain", None)
        if drain is not None:
            await drain()
        await super().shutdown(sockets)


def uvicorn_server(
    actors: Iterable[ActorDefinition],
    *,
    kv: str | KvStore,
    config: ServerConfig,
    host: str,
    port: int,
    log_level: str = "info",
    access_log: bool = False,
) -> uvicorn.Server:
    """The server; logging goes through the standard library's root configuration (uvicorn
    sets levels only, no handlers or formats of its own)."""
    app = create_app(actors, kv=kv, config=config)
    return _DrainingServer(_uvicorn_config(app, config, host, port, log_level, access_log))


def store_server(
    *,
    kv: str | KvStore,
    config: ServerConfig,
    host: str,
    port: int,
    label: str | None = None,
    log_level: str = "info",
    access_log: bool = False,
) -> uvicorn.Server:
    """`pagekv ui`'s server: the inspector over the store `kv`, no registry (`create_store_app`)."""
    app = create_store_app(kv=kv, config=config, label=label)
    return uvicorn.Server(_uvicorn_config(app, config, host, port, log_level, access_log))


def _uvicorn_config(
    app: Starlette,
    config: ServerConfig,
    host: str,
    port: int,
    log_level: str,
    access_log: bool,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level=log_level,
        log_config=None,
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_S,
        server_header=False,
        http=http_protocol(config.header_timeout_s, config.max_header_bytes),
        ws="websockets-sansio",
        # a compressor and a decompressor per socket cost ~100 KiB of memory each idle
        # connection; frames are small actions and events (RESULTS: Connections)
        ws_per_message_deflate=False,
        ws_max_size=config.ws_max_in_bytes,
        ws_ping_interval=config.ws_ping_interval_s,
        ws_ping_timeout=config.ws_ping_timeout_s,
        limit_concurrency=config.max_connections,
    )


async def serve(
    actors: Iterable[ActorDefinition],
    *,
    kv: str | KvStore,
    config: ServerConfig,
    host: str,
    port: int,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM (or the server's `should_exit`)."""
    server = uvicorn_server(
        actors,
        kv=kv,
        config=config,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
    )
    await server.serve()
