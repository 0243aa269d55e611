"""Keeping other sites' pages off a server: the `Host` check and the `Origin` check.

An unauthenticated server (`pagekv serve --unauthenticated`, for local development) has no
credential that a request from a browser page of another site would lack. Two things keep such
pages out:

- **Host.** A page on a name its attacker re-points at 127.0.0.1 (DNS rebinding) is, to the
  browser, same-origin with whatever listens there, and may read every answer. Its requests
  carry that name as `Host`, so a server that answers only its own names is out of its reach:
  the loopback names (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`), the address it listens
  on, its advertise URL's host (where its peers reach it) and `allowed_hosts`. Anything else is
  a 421 `host_not_allowed` before any route runs, reads included.
- **Origin.** A page of another origin cannot read the answers (no CORS), but it can still
  send a "simple" request (a form, a no-cors `fetch`) or open a WebSocket. Browsers send the
  page's `Origin` with every such request, so a WebSocket, or any request but GET, HEAD and
  OPTIONS, whose `Origin` is neither this server's own (`scheme://` + its `Host`) nor one of
  `cors_origins` is a 403 `origin_not_allowed`. A request without `Origin` is not a browser
  page's and passes, as does one forwarded by another server of the store
  (`X-Pagekv-Forwarded`, which no page can send: the server it reached checked it). Raw HTTP
  routes (`on_request`) are the app's own (a webhook or a payment provider's form may post from
  anywhere): only the Host check applies to them.

With a token the Origin check is off (a cross-site page has no token to send), and the Host
check runs only if `allowed_hosts` is given. An unauthenticated server also refuses a body
that does not say it is JSON or CBOR (`codec.decode_body`).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from pagekv.protocol import ErrorCode
from pagekv.server.cluster.advertise import WILDCARD_HOSTS
from pagekv.server.cluster.forward import FORWARDED_HEADER
from pagekv.server.config import ServerConfig
from pagekv.server.http_errors import HttpError
from pagekv.server.request_io import error_answer
from pagekv.server.routes import raw_http

_HOST = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^\s:/@\[\]]+)(:[0-9]{1,5})?")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(header: str) -> str | None:
    """The name a `Host` header holds, as `configured_name` gives it; None for a value that is
    no host."""
    found = _HOST.fullmatch(header)
    return None if found is None else configured_name(found.group(1))


def configured_name(host: str) -> str:
    """A host name or address as compared: lower case, without brackets or a final dot."""
    return host.strip("[]").rstrip(".").lower()


def is_loopback(name: str) -> bool:
    """Whether `name` (as `host_name` gives it) reaches this machine only: browsers resolve
    `localhost` and `*.localhost` to loopback themselves, so no DNS answer can re-point them."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def own_hosts(config: ServerConfig) -> frozenset[str] | None:
    """The names besides the loopback ones that requests may carry as `Host`; None when any
    may (a server with a token and no `allowed_hosts`, or `*` among them)."""
    if config.allowed_hosts is None and not config.unauthenticated:
        return None
    given = config.allowed_hosts or ()
    if "*" in given:
        return None
    names = {configured_name(h) for h in given}
    if config.listen_host is not None and config.listen_host not in WILDCARD_HOSTS:
        names.add(configured_name(config.listen_host))
    if config.advertise_url is not None:
        names.add(configured_name(urlsplit(config.advertise_url).hostname or ""))
    return frozenset(names)


class HostAndOriginGuard:
    """The two checks of the module, before any other middleware, for HTTP and WebSocket."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.hosts = own_hosts(config)
        self.check_origin = config.unauthenticated
        self.origins = frozenset(config.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        error = self._host_refused(host) or self._origin_refused(scope, host, headers)
        if error is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket" and "websocket.http.response" not in scope.get(
            "extensions", {}
        ):
            await send({"type": "websocket.close", "code": 1008})
        else:
            await error_answer(HTTPConnection(scope), error)(scope, receive, send)

    def _host_refused(self, host: str) -> HttpError | None:
        if self.hosts is None:
            return None
        name = host_name(host)
        if name is not None and (is_loopback(name) or name in self.hosts):
            return None
        shown = repr(host[:100]) if host else "(none)"
        return HttpError(
            421,
            ErrorCode.HOST_NOT_ALLOWED,
            f"this server does not answer to the Host {shown}: it answers to its loopback "
            "names, its own address and the names given to --allowed-hosts",
        )

    def _origin_refused(self, scope: Scope, host: str, headers: Headers) -> HttpError | None:
        origin = headers.get("origin")
        if not self.check_origin or origin is None or not _changes_state(scope):
            return None
        if FORWARDED_HEADER in headers:  # checked where it arrived; no page can set it
            return None
        parts = urlsplit(origin)
        same = parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()
        if same or origin in self.origins:
            return None
        return HttpError(
            403,
            ErrorCode.ORIGIN_NOT_ALLOWED,
            f"a page of the origin {origin[:100]!r} may not call this unauthenticated server: "
            "only its own pages and the origins given to --cors-origin may",
        )


def _changes_state(scope: Scope) -> bool:
    """A WebSocket (its actions change state), or an HTTP method that may, on a route of
    pagekv's own, not a raw HTTP route of the app's."""
    if scope["type"] == "websocket":
        return True
    if scope["method"] in _SAFE_METHODS:
        return False
    return all(route.matches(scope)[0] is Match.NONE for route in raw_http.ROUTES)
