"""Serving actors over HTTP: the gateway, the inspector API, `/metrics` and `/health` (ASGI).

The names below load their module on first use: the ASGI stack takes ~0.2 s to import, and
`pagekv inspect` needs only the wire format (`protocol`).
"""

import importlib

_EXPORTS = {
    "DEFAULT_MAX_BODY_BYTES": "protocol",
    "DEFAULT_PORT": "protocol",
    "TOKEN_ENV": "protocol",
    "ErrorCode": "protocol",
    "AppNotFound": "loader",
    "load_registry": "loader",
    "ConfigError": "config",
    "ServerConfig": "config",
    "create_app": "app",
    "create_store_app": "app",
    "serve": "run",
    "store_server": "run",
    "uvicorn_server": "run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
