"""The client side of a `pagekv serve` server: `HttpClient` (calls over HTTP, with retries of
calls that did not run) and its actors' connections over WebSocket."""

from pagekv.client.http import (
    RETRIED_CODES,
    RETRY_FOR_S,
    ActorHandle,
    HttpClient,
    RemoteError,
    ServerUnreachable,
    raise_error,
)
from pagekv.client.websocket import RemoteConnection

__all__ = [
    "RETRIED_CODES",
    "RETRY_FOR_S",
    "ActorHandle",
    "HttpClient",
    "RemoteConnection",
    "RemoteError",
    "ServerUnreachable",
    "raise_error",
]
