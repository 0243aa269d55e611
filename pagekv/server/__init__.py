"""Serving actors over HTTP: the gateway, the inspector API, `/metrics` and `/health` (ASGI).

    app.py, config.py, runtime.py   the ASGI app, what it is configured with, what its routes read
    auth.py, guard.py               what every request passes first: token, CORS, Host and Origin
    codec.py, http_errors.py        reading requests and writing answers, errors as answers
    metrics.py                      `/metrics` and the meters behind it
    routes/                         the URLs: gateway, raw HTTP, sockets, inspector and its page
    cluster/                        several servers on one store: advertise, prove, forward, call
    process/                        `pagekv serve` as processes: launch, uvicorn, workers, logs

The names below load their module on first use: the ASGI stack takes ~0.2 s to import, and
`pagekv inspect` needs only the wire format (`pagekv.protocol`).
"""

import importlib

_EXPORTS = {
    "DEFAULT_MAX_BODY_BYTES": "pagekv.protocol",
    "DEFAULT_PORT": "pagekv.protocol",
    "TOKEN_ENV": "pagekv.protocol",
    "ErrorCode": "pagekv.protocol",
    "AppNotFound": "pagekv.server.process.loader",
    "load_registry": "pagekv.server.process.loader",
    "ConfigError": "pagekv.server.config",
    "ServerConfig": "pagekv.server.config",
    "create_app": "pagekv.server.app",
    "create_store_app": "pagekv.server.app",
    "serve": "pagekv.server.process.uvicorn_run",
    "store_server": "pagekv.server.process.uvicorn_run",
    "uvicorn_server": "pagekv.server.process.uvicorn_run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
