"""`pagekv serve app.py[:registry]`: the command line of the server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from typing import Any

import anyio

from pagekv.cli_args import add_store_argument, port, positive_int, positive_seconds
from pagekv.kv import KvError, KvStore, open_kv, redact_url
from pagekv.server.config import (
    DEFAULT_INSPECT_CONCURRENCY,
    DEFAULT_INSPECT_MAX_BYTES,
    ConfigError,
    ServerConfig,
)
from pagekv.server.loader import AppNotFound, load_registry
from pagekv.server.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, TOKEN_ENV
from pagekv.server.run import serve


def _serve(args: argparse.Namespace) -> int:
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    try:
        config = ServerConfig(
            token=token,
            unauthenticated=args.unauthenticated,
            max_body_bytes=args.max_body_bytes,
            cors_origins=tuple(args.cors_origin),
            inspect_max_bytes=args.inspect_max_bytes,
            inspect_concurrency=args.inspect_concurrency,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            max_connections=args.max_connections,
            max_header_bytes=args.max_header_bytes,
        )
        registry = load_registry(args.app)
        config = replace(config, lease_s=registry.lease)
    except (ConfigError, AppNotFound) as e:
        print(f"pagekv serve: {e}", file=sys.stderr)
        return 2
    _configure_logging(args.log_level)
    shown = redact_url(args.kv)
    pool_log = logging.getLogger("psycopg.pool")  # its retries: the error below says it all
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        store = open_kv(args.kv)
    except (KvError, OSError, ValueError) as e:
        reason = " ".join(str(e).split())  # one line: a driver's message may span several
        print(f"pagekv serve: cannot open the store {shown}: {reason}", file=sys.stderr)
        return 1
    finally:
        pool_log.setLevel(level)
    auth = "unauthenticated" if config.unauthenticated else "token required"
    print(
        f"pagekv serve: {len(registry.definitions)} actor type(s) "
        f"({', '.join(sorted(registry.definitions))}) on {shown}, "
        f"http://{args.host}:{args.port} ({auth})",
        file=sys.stderr,
        flush=True,
    )
    try:
        anyio.run(lambda: _run(registry.definitions.values(), store, config, args))
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
    return 0


async def _run(actors: Any, store: KvStore, config: ServerConfig, args: argparse.Namespace) -> None:
    await serve(
        actors,
        kv=store,
        config=config,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
    )


def _configure_logging(level: str) -> None:
    """One format for pagekv's records and uvicorn's (which then adds no handlers of its own):
    time, level, logger, message, on stderr."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def add_serve_command(commands: Any, summary: str) -> None:
    serve_cmd = commands.add_parser(
        "serve",
        help=summary,
        description=(
            "Serve the actors of APP (a Python file defining `registry = Registry([...])`; "
            "APP:NAME picks another attribute) over HTTP. A token is required "
            f"(--token or ${TOKEN_ENV}) unless --unauthenticated is given."
        ),
    )
    serve_cmd.add_argument("app", help="path/to/app.py[:registry]")
    add_store_argument(serve_cmd)
    serve_cmd.add_argument(
        "--host",
        default=os.environ.get("PAGEKV_HOST", "127.0.0.1"),
        help="address to bind (default $PAGEKV_HOST, else 127.0.0.1)",
    )
    serve_cmd.add_argument(
        "--port",
        type=port,
        default=os.environ.get("PAGEKV_PORT", str(DEFAULT_PORT)),
        help=f"port (default $PAGEKV_PORT, else {DEFAULT_PORT})",
    )
    auth = serve_cmd.add_mutually_exclusive_group()
    auth.add_argument(
        "--token", help=f"bearer token clients must send (prefer ${TOKEN_ENV}: argv is visible)"
    )
    auth.add_argument(
        "--unauthenticated", action="store_true", help="serve without any authentication"
    )
    serve_cmd.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body accepted (default {DEFAULT_MAX_BODY_BYTES})",
    )
    serve_cmd.add_argument(
        "--header-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="time a client has to send a request's headers (default 10; 408 past it)",
    )
    serve_cmd.add_argument(
        "--body-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="time a request's body has to arrive whole (default 30; 408 past it)",
    )
    serve_cmd.add_argument(
        "--max-header-bytes",
        type=positive_int,
        default=64 * 1024,
        help="most bytes a request's headers may hold (default 65536; 431 beyond)",
    )
    serve_cmd.add_argument(
        "--max-connections",
        type=positive_int,
        default=1024,
        help="connections and requests served at once; more are answered 503 (default 1024)",
    )
    serve_cmd.add_argument(
        "--inspect-max-bytes",
        type=positive_int,
        default=DEFAULT_INSPECT_MAX_BYTES,
        help="most bytes of values in one inspector answer, and in any value a query reads "
        f"or makes (default {DEFAULT_INSPECT_MAX_BYTES}; 413 past it)",
    )
    serve_cmd.add_argument(
        "--inspect-concurrency",
        type=positive_int,
        default=DEFAULT_INSPECT_CONCURRENCY,
        help="inspector reads run at once on threads of their own; actors never wait behind "
        f"them (default {DEFAULT_INSPECT_CONCURRENCY})",
    )
    serve_cmd.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an exact origin browsers may call from (repeatable; default: no CORS)",
    )
    serve_cmd.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="least level logged, pagekv's and the HTTP server's (default info)",
    )
    serve_cmd.add_argument(
        "--access-log", action="store_true", help="log one line per HTTP request"
    )
    serve_cmd.set_defaults(run=_serve)
