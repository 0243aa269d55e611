"""Running a real server on loopback inside the test's event loop (uvicorn, port 0)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from server_defs import registry

from pagekv.actor import ActorDefinition
from pagekv.client import HttpClient
from pagekv.kv import KvStore, MemoryStore
from pagekv.server import ServerConfig, store_server, uvicorn_server

TOKEN = "s3cret-token-for-tests-0123456789"
UNSET: Any = object()


@dataclass
class Served:
    url: str
    token: str | None
    store: KvStore
    app: Any = None
    """The Starlette app (its `state.registry` once started)."""

    def client(self, token: str | None = UNSET) -> HttpClient:
        return HttpClient(self.url, token=self.token if token is UNSET else token)

    def http(self, *, token: str | None = UNSET) -> httpx.AsyncClient:
        """A raw HTTP client, authenticated with `token` (default: the server's)."""
        token = self.token if token is UNSET else token
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)


@asynccontextmanager
async def serving(
    actors: Iterable[ActorDefinition] | None = None,
    *,
    kv: KvStore | None = None,
    token: str | None = TOKEN,
    advertise: bool = False,
    port: int = 0,
    **config: Any,
) -> AsyncIterator[Served]:
    """A server on a loopback port of its own (`port`: that one, to restart a server where its
    clients come back); `advertise`: it tells the other servers of its store its address, so
    they forward it the calls for the actors it owns."""
    store = kv if kv is not None else MemoryStore()
    sock, url = _loopback(port)
    if advertise:
        config["advertise_url"] = url
    settings = ServerConfig(token=token, unauthenticated=token is None, **config)
    server = uvicorn_server(
        registry.definitions.values() if actors is None else actors,
        kv=store,
        config=settings,
        host="127.0.0.1",
        port=0,
        log_level="warning",
    )
    async with _running(server, sock, Served(url, token, store, server.config.app)) as served:
        yield served


@asynccontextmanager
async def serving_store(
    kv: KvStore, *, token: str | None = TOKEN, **config: Any
) -> AsyncIterator[Served]:
    """`pagekv ui`'s app over `kv` on a loopback port of its own: no registry, read-only."""
    sock, url = _loopback()
    settings = ServerConfig(token=token, unauthenticated=token is None, **config)
    server = store_server(kv=kv, config=settings, host="127.0.0.1", port=0, log_level="warning")
    async with _running(server, sock, Served(url, token, kv, server.config.app)) as served:
        yield served


def _loopback(port: int = 0) -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart on a port just used
    sock.bind(("127.0.0.1", port))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def _running(server: Any, sock: socket.socket, served: Served) -> AsyncIterator[Served]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        try:
            yield served
        finally:
            server.should_exit = True
