"""`pagekv serve app.py[:registry]`: the command line of the server."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import anyio

from pagekv.cli.args import add_store_argument, port, positive_int, positive_seconds
from pagekv.kv import redact_url
from pagekv.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, TOKEN_ENV
from pagekv.server.cluster.advertise import ADVERTISE_ENV, default_url, http_url
from pagekv.server.config import (
    DEFAULT_INSPECT_CONCURRENCY,
    DEFAULT_INSPECT_MAX_BYTES,
    DEFAULT_INSPECT_TEMP_BYTES,
    ConfigError,
)
from pagekv.server.guard import configured_name, is_loopback
from pagekv.server.process.loader import AppFailedToLoad, AppNotFound
from pagekv.server.process.logs import LOG_FORMATS, announce
from pagekv.server.process.serve_process import (
    StartupError,
    configure_logging,
    listen,
    open_store,
    serve_process,
    settings,
    with_stored_secret,
)
from pagekv.server.process.workers import supervise

_FIX = f"pass --advertise-url (or set ${ADVERTISE_ENV}) with an address they can reach"


def _serve(args: argparse.Namespace) -> int:
    try:
        config, registry = settings(args)
        if args.reload and args.workers > 1:
            raise ConfigError("--reload runs one worker; leave out --workers")
        if args.workers > 1 and urlsplit(args.kv).scheme == "memory":
            raise ConfigError(
                "--workers needs a store the processes share (file: or postgresql:), "
                "not memory://, which each would have to itself"
            )
    except (ConfigError, AppNotFound) as e:
        print(f"pagekv serve: {e}", file=sys.stderr)
        return 2
    except AppFailedToLoad as e:
        print(e.report("pagekv serve"), file=sys.stderr)
        return 1
    configure_logging(args.log_level, args.log_format)
    try:
        public = listen(args.host, args.port)  # first: a busy port leaves no store behind
    except StartupError as e:
        print(f"pagekv serve: {e}", file=sys.stderr)
        return 1
    try:
        store = open_store(args.kv)  # by the supervisor too, only to fail fast
    except StartupError as e:
        public.close()
        print(f"pagekv serve: {e}", file=sys.stderr)
        return 1
    try:
        config = with_stored_secret(config, args.kv)
    except StartupError as e:
        store.close()
        public.close()
        print(f"pagekv serve: {e}", file=sys.stderr)
        return 1
    bound = public.getsockname()[1]
    auth = "unauthenticated" if config.unauthenticated else "token required"
    workers = f", {args.workers} workers" if args.workers > 1 else ""
    announce(
        f"pagekv serve: {len(registry.definitions)} actor type(s) "
        f"({', '.join(sorted(registry.definitions))}) on {redact_url(args.kv)}, "
        f"{http_url(args.host, bound)} ({auth}){workers}",
        args.log_format,
    )
    warning = exposure_warning("serve", args.host, config.unauthenticated)
    if warning is not None:
        announce(warning, args.log_format)
    if args.workers > 1 or args.reload:
        store.close()  # each worker opens its own
        args.cluster_secret = config.cluster_secret or secrets.token_hex(32)  # theirs to share
        return supervise(args, public)
    config = replace(config, advertise_url=config.advertise_url or default_url(args.host, bound))
    try:
        problem = anyio.run(
            lambda: serve_process(
                registry.definitions.values(), store, config, [public], args, fix=_FIX
            )
        )
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
    if problem is not None:
        print(f"pagekv serve: {problem}", file=sys.stderr)
        return 1
    return 0


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
    add_auth_arguments(serve_cmd)
    serve_cmd.add_argument(
        "--advertise-url",
        default=os.environ.get(ADVERTISE_ENV),
        metavar="URL",
        help="http(s)://HOST[:PORT] where the other processes of the store reach this one to "
        f"forward calls for the actors it owns (default ${ADVERTISE_ENV}, else --host and "
        "--port, this machine's hostname for a wildcard --host; with --workers, its host and "
        "each worker's own port)",
    )
    serve_cmd.add_argument(
        "--cluster-secret",
        metavar="SECRET",
        help="what the processes sharing the store prove to each other that they are with: the "
        "same for all, 16 characters or more (prefer $PAGEKV_CLUSTER_SECRET: argv is visible; "
        "default for a file: store: one generated into its directory; required for "
        "postgresql:// when several processes share it)",
    )
    serve_cmd.add_argument(
        "--workers",
        type=positive_int,
        default=os.environ.get("PAGEKV_WORKERS", "1"),
        metavar="N",
        help="worker processes sharing the store and the port, each owning the actors it woke "
        "(default $PAGEKV_WORKERS, else 1)",
    )
    serve_cmd.add_argument(
        "--reload",
        action="store_true",
        help="restart the server when a .py file under the app's directory changes (for "
        "development; one worker process, restarted by a supervisor)",
    )
    serve_cmd.add_argument(
        "--lease",
        type=positive_seconds,
        metavar="SECONDS",
        help="how long an actor stays its process's after a renewal: how soon another "
        "process serves it once that one died (default: the app registry's lease, 10 s "
        "unless set; under heavy load keep it at 5 s or more, as a renewal waits its turn at "
        "the store and one that comes too late hands the actor on)",
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
        "--ws-max-in",
        type=positive_int,
        default=64 * 1024,
        metavar="BYTES",
        help="largest WebSocket frame a client may send (default 65536; closed with 1009)",
    )
    serve_cmd.add_argument(
        "--ws-max-out",
        type=positive_int,
        default=1 << 20,
        metavar="BYTES",
        help="largest event or result sent over a connection (default 1048576)",
    )
    serve_cmd.add_argument(
        "--ws-buffer",
        type=positive_int,
        default=4 << 20,
        metavar="BYTES",
        help="bytes waiting for a slow client before its connection is closed with 4008 "
        "(default 4194304)",
    )
    add_inspector_arguments(serve_cmd)
    serve_cmd.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an exact origin browsers may call from (repeatable; default: no CORS)",
    )
    add_log_level_argument(serve_cmd)
    serve_cmd.add_argument(
        "--access-log", action="store_true", help="log one line per HTTP request"
    )
    serve_cmd.set_defaults(run=_serve)


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    """`--token` or `--unauthenticated` (never both): with neither, `$PAGEKV_TOKEN` must be set,
    as `ServerConfig` enforces."""
    auth = parser.add_mutually_exclusive_group()
    auth.add_argument(
        "--token", help=f"bearer token clients must send (prefer ${TOKEN_ENV}: argv is visible)"
    )
    auth.add_argument(
        "--unauthenticated",
        action="store_true",
        help="serve without any authentication, for development on this machine: only "
        "requests to its own host names (see --allowed-hosts) are served, and pages of other "
        "origins may not change anything",
    )
    parser.add_argument(
        "--allowed-hosts",
        type=host_list,
        metavar="HOST,...",
        help="names the Host header may carry besides the loopback ones and the server's own "
        "address; * allows any (default: these only with --unauthenticated, any with a token)",
    )


def host_list(text: str) -> tuple[str, ...]:
    """`--allowed-hosts`: names separated by commas (`ServerConfig` checks each)."""
    return tuple(name.strip() for name in text.split(","))


def exposure_warning(command: str, host: str, unauthenticated: bool) -> str | None:
    """The line that says an unauthenticated server listens beyond this machine."""
    if not unauthenticated or is_loopback(configured_name(host)):
        return None
    return (
        f"pagekv {command}: WARNING: --unauthenticated on {host}, not a loopback address: "
        "anyone who can reach it can call every action and read every actor. Serve on "
        f"127.0.0.1 or set a token (--token or ${TOKEN_ENV})."
    )


def add_inspector_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inspect-max-bytes",
        type=positive_int,
        default=DEFAULT_INSPECT_MAX_BYTES,
        help="most bytes of values in one inspector answer, and in any value a query reads "
        f"or makes (default {DEFAULT_INSPECT_MAX_BYTES}; 413 past it)",
    )
    parser.add_argument(
        "--inspect-temp-bytes",
        type=positive_int,
        default=DEFAULT_INSPECT_TEMP_BYTES,
        help="most bytes of temp files on disk one inspector query may write as it sorts "
        f"(default {DEFAULT_INSPECT_TEMP_BYTES}; 403 query_refused past it)",
    )
    parser.add_argument(
        "--inspect-concurrency",
        type=positive_int,
        default=DEFAULT_INSPECT_CONCURRENCY,
        help="inspector reads run at once on threads of their own; actors never wait behind "
        f"them (default {DEFAULT_INSPECT_CONCURRENCY})",
    )


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="least level logged, pagekv's and the HTTP server's (default info)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text: time, level, logger, message, a traceback on the lines after; json: one "
        "JSON object per record, for log shippers (default text)",
    )
