"""Serving actors over HTTP: the gateway, the inspector API, `/metrics` and `/health` (ASGI)."""

from pagekv.server.app import create_app
from pagekv.server.config import ConfigError, ServerConfig
from pagekv.server.loader import AppNotFound, load_registry
from pagekv.server.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, TOKEN_ENV, ErrorCode
from pagekv.server.run import serve, uvicorn_server

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "TOKEN_ENV",
    "AppNotFound",
    "ConfigError",
    "ErrorCode",
    "ServerConfig",
    "create_app",
    "load_registry",
    "serve",
    "uvicorn_server",
]
