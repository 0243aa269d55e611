"""`pagekv ui --kv URL`: the inspector's web page over a store, without a server of actors.

It reads what `pagekv inspect` reads (the registry's index and read-only snapshots), so it is
safe beside live servers of the same store and changes nothing in it: the workflow buttons,
which only an actor's owner can act on, answer `read_only`, and there is no `/metrics` (no
actor runs here). The same token rule as `pagekv serve` holds: a token unless
`--unauthenticated`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio

from pagekv.cli.args import add_store_argument, port
from pagekv.cli.serve import (
    add_auth_arguments,
    add_inspector_arguments,
    add_log_level_argument,
    exposure_warning,
)
from pagekv.kv import redact_url
from pagekv.protocol import DEFAULT_PORT, TOKEN_ENV
from pagekv.server.cluster.advertise import http_url
from pagekv.server.config import ConfigError, ServerConfig
from pagekv.server.process.logs import announce
from pagekv.server.process.serve_process import StartupError, configure_logging, listen, open_store
from pagekv.server.process.uvicorn_run import store_server

DEFAULT_UI_PORT = DEFAULT_PORT + 1
"""Next to `pagekv serve`'s, so both run on one machine with their defaults."""


def _ui(args: argparse.Namespace) -> int:
    try:
        config = ServerConfig(
            token=args.token if args.token is not None else os.environ.get(TOKEN_ENV),
            unauthenticated=args.unauthenticated,
            allowed_hosts=args.allowed_hosts,
            listen_host=args.host,
            inspect_max_bytes=args.inspect_max_bytes,
            inspect_temp_bytes=args.inspect_temp_bytes,
            inspect_concurrency=args.inspect_concurrency,
        )
    except ConfigError as e:
        print(f"pagekv ui: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    try:
        store = open_store(args.kv, create=False)
        try:
            public = listen(args.host, args.port)
        except StartupError:
            store.close()
            raise
    except StartupError as e:
        print(f"pagekv ui: {e}", file=sys.stderr)
        return 1
    auth = "unauthenticated" if config.unauthenticated else "token required"
    address = http_url(args.host, public.getsockname()[1])
    label = redact_url(args.kv)
    announce(f"pagekv ui: read-only inspector of {label} at {address}/ ({auth})", args.log_format)
    warning = exposure_warning("ui", args.host, config.unauthenticated)
    if warning is not None:
        announce(warning, args.log_format)
    server = store_server(
        kv=store,
        config=config,
        label=label,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
    )
    try:
        anyio.run(lambda: server.serve(sockets=[public]))
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
    return 0


def add_ui_command(commands: Any, summary: str) -> None:
    ui = commands.add_parser(
        "ui",
        help=summary,
        description=(
            "Serve the inspector's web page over the store, read-only: no actor runs and "
            "nothing is written, so it is safe beside running servers. A token is required "
            f"(--token or ${TOKEN_ENV}) unless --unauthenticated is given."
        ),
    )
    add_store_argument(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=port, default=str(DEFAULT_UI_PORT), help=f"default {DEFAULT_UI_PORT}"
    )
    add_auth_arguments(ui)
    add_inspector_arguments(ui)
    add_log_level_argument(ui)
    ui.set_defaults(run=_ui)
