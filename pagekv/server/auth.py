"""Bearer-token authentication and explicitly scoped CORS, as ASGI middleware.

Every route needs `Authorization: Bearer <token>` except `/health` (which reveals nothing but
liveness), `/favicon.ico`, and the web inspector's page and static assets (`/` and `/ui/...`: they
hold no data; `/ui/auth.json` says whether a token is needed; the page asks for it and sends it
with every data request, `routes/inspector_page.py`). The token is compared in constant time and
only ever read from that header: a token in the query string or a cookie authenticates nothing.
Once checked, the header is taken off the request: the token is this server's credential, so no
handler sees it and no call forwarded to another server carries it; a forwarded call's proof of the
cluster secret stands for the client's authentication (`cluster/peer_auth.py`). CORS answers exist
only for origins configured by name, only on the browser-facing prefixes (the gateway and the
inspector), and without `Access-Control-Allow-Credentials` (a bearer token is not an ambient
credential), so no arbitrary Origin is ever reflected.
"""

from __future__ import annotations

import hmac

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from pagekv.protocol import ErrorCode
from pagekv.server.cluster.peer_auth import PEER_SCOPE_KEY
from pagekv.server.http_errors import HttpError
from pagekv.server.request_io import error_answer

OPEN_PATHS = frozenset({"/health", "/", "/favicon.ico"})
OPEN_PREFIXES = ("/ui/",)
CORS_PREFIXES = ("/actors/", "/inspect/")


def header_token(scope: Scope) -> bytes | None:
    """The bearer token the request's `Authorization` header offers: None without the header,
    and `b""` (which matches no token) for one no token can be read from: two headers, or
    another scheme."""
    values = [v for k, v in scope["headers"] if k == b"authorization"]
    if not values:
        return None
    scheme, _, given = values[0].partition(b" ")
    return given.strip() if len(values) == 1 and scheme.lower() == b"bearer" else b""


def token_matches(given: bytes, expected: bytes) -> bool:
    """In constant time, so the time taken says nothing about the token."""
    return hmac.compare_digest(given, expected)


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    def _authorized(self, scope: Scope) -> bool:
        given = header_token(scope)
        return given is not None and token_matches(given, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in OPEN_PATHS
            or scope["path"].startswith(OPEN_PREFIXES)
            or PEER_SCOPE_KEY in scope  # a forwarded call whose sender proved itself
        ):
            await self.app(scope, receive, send)
            return
        if self._authorized(scope):
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            await self.app(scope, receive, send)
            return
        error = HttpError(
            401,
            ErrorCode.UNAUTHORIZED,
            "missing or wrong token: send Authorization: Bearer <token>",
        )
        await error_answer(Request(scope), error)(scope, receive, send)


class ScopedCors:
    """Starlette's CORS middleware for the browser-facing prefixes only, for listed origins."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type", "accept"],
            allow_credentials=False,
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CORS_PREFIXES):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)
