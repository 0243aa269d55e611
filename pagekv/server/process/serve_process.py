"""One `pagekv serve` process: its settings from the command line, its store, its listening
sockets, and uvicorn serving the app on them until a signal, with the check, once it listens,
that its advertise URL reaches it.

`pagekv serve` is one such process, or supervises several (`workers.py`); each opens its own
store and runs its own registry. The sockets are bound here rather than by uvicorn so that the
address to advertise (whose default has the port actually bound) is known before the app's
lifespan starts the registry, and so that workers can share one.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import replace

import anyio
from starlette.applications import Starlette

from pagekv.actor import ActorDefinition, Registry
from pagekv.kv import KvError, KvStore, open_kv, redact_url
from pagekv.protocol import TOKEN_ENV
from pagekv.server.cluster.advertise import check_address, check_peers, http_url
from pagekv.server.cluster.peer_auth import CLUSTER_SECRET_ENV, stored_secret
from pagekv.server.config import ConfigError, ServerConfig
from pagekv.server.process.loader import load_registry
from pagekv.server.process.logs import configure_logging as configure_logging
from pagekv.server.process.uvicorn_run import uvicorn_server

log = logging.getLogger("pagekv.server")


class StartupError(Exception):
    """What keeps a process from serving, as its one line for stderr (after `pagekv serve: `)."""


def settings(args: argparse.Namespace) -> tuple[ServerConfig, Registry]:
    """The configuration and the app's registry that `args` (of `pagekv serve`) name; raises
    `ConfigError` or `AppNotFound`. The lease is `--lease`, else the app's registry's."""
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    config = ServerConfig(
        token=token,
        unauthenticated=args.unauthenticated,
        max_body_bytes=args.max_body_bytes,
        cors_origins=tuple(args.cors_origin),
        allowed_hosts=args.allowed_hosts,
        listen_host=args.host,
        inspect_max_bytes=args.inspect_max_bytes,
        inspect_temp_bytes=args.inspect_temp_bytes,
        inspect_concurrency=args.inspect_concurrency,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
        max_header_bytes=args.max_header_bytes,
        advertise_url=args.advertise_url,
        ws_max_in_bytes=args.ws_max_in,
        ws_max_out_bytes=args.ws_max_out,
        ws_buffer_bytes=args.ws_buffer,
        cluster_secret=args.cluster_secret or os.environ.get(CLUSTER_SECRET_ENV),
    )
    registry = load_registry(args.app)
    return replace(config, lease_s=registry.lease if args.lease is None else args.lease), registry


def with_stored_secret(config: ServerConfig, url: str) -> ServerConfig:
    """`config` with its store's cluster secret if none was given and the store is a `file:`
    directory (opened already), where it is generated once (`peer_auth.stored_secret`): so the
    processes of one host need no setup to prove themselves to each other."""
    if config.cluster_secret is not None:
        return config
    try:
        secret = stored_secret(url)
        return config if secret is None else replace(config, cluster_secret=secret)
    except (OSError, ConfigError) as e:
        raise StartupError(f"the store's cluster secret: {e}") from None


def open_store(url: str, *, create: bool = True) -> KvStore:
    """The store `url` names (`create=False`: only one that exists, see `open_kv`), or a
    `StartupError` saying in one line why it cannot be opened."""
    shown = redact_url(url)
    pool_log = logging.getLogger("psycopg.pool")  # its retries: the error below says it all
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        return open_kv(url, create=create)
    except (KvError, OSError, ValueError) as e:
        reason = " ".join(str(e).split())  # one line: a driver's message may span several
        raise StartupError(f"cannot open the store {shown}: {reason}") from None
    finally:
        pool_log.setLevel(level)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: a free port), as uvicorn would bind it, with
    `TCP_NODELAY`, which the accepted connections inherit: asyncio sets it itself only on
    sockets made with `IPPROTO_TCP`, and without it each answer's body waits for the client's
    delayed ACK (about 40 ms)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen on {http_url(host, port)}: {e.strerror or e}") from None
    return sock


async def serve_process(
    actors: Iterable[ActorDefinition],
    store: KvStore,
    config: ServerConfig,
    sockets: list[socket.socket],
    args: argparse.Namespace,
    *,
    fix: str,
    supervisor: int | None = None,
) -> str | None:
    """Serve `actors` on `sockets` (the public one first) until SIGINT/SIGTERM;
    None then. Once listening, check `config.advertise_url` (`check_address`): if it must not
    be served with, stop gracefully and return the one line saying why, ending with `fix`. A
    worker (`supervisor`: its supervisor's pid) also stops once its supervisor is gone, rather
    than serve on unsupervised."""
    assert config.advertise_url is not None, "a serve process always advertises an address"
    advertised = config.advertise_url
    server = uvicorn_server(
        actors,
        kv=store,
        config=config,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
    )
    app = server.config.app
    assert isinstance(app, Starlette), "uvicorn_server serves the app create_app made"
    host, port = sockets[0].getsockname()[:2]
    problem: list[str] = []

    async def watch() -> None:
        while not server.started:
            await anyio.sleep(0.05)
        # uvicorn says this itself only when it binds the socket
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on %s (Press CTRL+C to quit)", http_url(host, port)
        )
        log.info("advertising %s to the other processes of the store", advertised)
        try:
            found = await check_address(app.state.registry, advertised, config.cluster_secret, fix)
        except Exception:  # the store, say: the check is advice, the server serves on
            log.exception("could not check that %s reaches this process", advertised)
            found = None
        if found is None and config.cluster_secret is None and await app.state.registry.peers():
            found = (
                "other processes share the store, and this one has no cluster secret to prove "
                f"itself to them with: give each the same --cluster-secret (${CLUSTER_SECRET_ENV})"
            )
        if found is not None:
            problem.append(found)
            server.should_exit = True
            return
        try:
            await check_peers(app.state.registry, config.cluster_secret)
        except Exception:  # the store, say: the check is advice, as the address's
            log.exception("could not check the cluster secret of the other processes")
        if supervisor is not None:
            while os.getppid() == supervisor:
                await anyio.sleep(1)
            log.warning("the supervisor (pid %d) is gone: stopping", supervisor)
            server.should_exit = True

    ended: BaseException | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            await server.serve(sockets=sockets)
        except (SystemExit, KeyboardInterrupt) as e:  # uvicorn's: a failed startup, a SIGINT
            ended = e  # raised as is below, not in the task group's exception group
        tg.cancel_scope.cancel()
    if ended is not None:
        raise ended
    return problem[0] if problem else None
