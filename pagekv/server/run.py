"""Running the app under uvicorn in the current event loop.

uvicorn owns SIGINT and SIGTERM: on either it stops accepting connections, lets requests in
flight finish (up to `GRACEFUL_S`), then runs the app's lifespan shutdown, which puts every
awake actor to sleep, and finally re-raises the signal as the process's own exit.
"""

from __future__ import annotations

from collections.abc import Iterable

import uvicorn

from pagekv.actor import ActorDefinition
from pagekv.kv import KvStore
from pagekv.server.app import create_app
from pagekv.server.config import GRACEFUL_S, ServerConfig
from pagekv.server.http_protocol import http_protocol


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
    return uvicorn.Server(
        uvicorn.Config(
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
            limit_concurrency=config.max_connections,
        )
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
