"""Raw HTTP: `/actors/{name}/request/{path}?key=K[&mode=M]`, any method, served by the actor's
`on_request(ctx, request) -> Response` (Starlette's request and response).

The handler sees the request as addressed to the actor: its path is what follows `/request`
(`/` at least), its query string without `key` and `mode`, its end-to-end headers (neither the
hop-by-hop ones nor the servers' own `X-Pagekv-*`), its body read whole first (under the
server's body limit, so a call forwarded to the actor's owner carries it), all the same
whichever server the client called. Its answer reaches the client the same way too, less any
`X-Pagekv-*` header (the servers' own: a forwarded call's refusal is known by one), relayed
once, as it streams. Auth, the actor limits and the forwarding to the owner are the gateway's;
a handler that returns anything but a `Response` is a 500 naming what it returned, and one that
raises Starlette's `HTTPException` answers with its status. The query string reaches it as sent
(minus `key` and `mode`), so a signature over it still holds. A streaming response's body is
produced after the call has returned, outside the actor: it must not touch `ctx` (state,
database) while it streams.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from pagekv.actor.directory.leases import Forwarded
from pagekv.protocol import ErrorCode
from pagekv.server.app_state import runtime
from pagekv.server.cluster.forward import end_to_end, without_own_headers
from pagekv.server.http_errors import HttpError
from pagekv.server.request_io import query_items, read_raw_body
from pagekv.server.routes.gateway import MODES, failures

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_ROUTING = ("key", "mode")


def _routing(request: Request) -> tuple[str, bool, bytes]:
    """The key, whether to create, and the query string the handler sees (the rest)."""
    items = query_items(request)
    routing = [(k, v) for k, v in items if k in _ROUTING]
    names = [k for k, _ in routing]
    if names.count("key") != 1 or names.count("mode") > 1:
        raise HttpError(
            400,
            ErrorCode.INVALID_PARAMETER,
            "give the query parameter 'key' once ('mode' at most once)",
        )
    found = dict(routing)
    mode = found.get("mode", "get_or_create")
    if mode not in MODES:
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, f"mode must be one of {list(MODES)}, got {mode!r}"
        )
    raw = request.scope.get("query_string", b"")
    rest = b"&".join(  # the other pairs as sent, not re-encoded (signatures over them hold)
        pair
        for pair in raw.split(b"&")
        if unquote_plus(pair.split(b"=")[0].decode()) not in _ROUTING
    )
    return found["key"], mode == "get_or_create", rest


def _inner(request: Request, body: bytes, path: str, query: bytes) -> Request:
    """The request as the actor's handler sees it (see the module)."""
    prefix = request.url.path[: len(request.url.path) - len(path)].rstrip("/")
    scope = {
        **request.scope,
        "path": "/" + path,
        "raw_path": ("/" + path).encode(),
        "root_path": request.scope.get("root_path", "") + prefix,
        "query_string": query,
        "headers": without_own_headers(end_to_end(request.scope["headers"])),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


async def handle(request: Request) -> Response:
    rt = runtime(request)
    name = request.path_params["name"]
    path = request.path_params.get("path", "")
    key, create, query = _routing(request)
    body = await read_raw_body(request, rt.config)
    hook = rt.registry.definition(name).hooks.get("on_request")
    if hook is None:
        raise HttpError(404, ErrorCode.NOT_FOUND, f"actor {name!r} serves no raw HTTP (on_request)")

    async def serve(via: Forwarded | None) -> Response:
        refused: HTTPException | None = None
        with failures("request", path, name, key):
            try:
                response = await rt.registry.invoke(
                    name, key, hook, (_inner(request, body, path, query),), create=create, via=via
                )
            except HTTPException as e:  # the handler's own answer, as in any Starlette app
                refused = e
        if refused is not None:
            raise refused
        if not isinstance(response, Response):
            raise HttpError(
                500,
                ErrorCode.ACTION_ERROR,
                f"on_request of actor {name!r} must return a starlette Response, "
                f"got {type(response).__name__}",
            )
        response.raw_headers = without_own_headers(response.raw_headers)
        return response

    return await rt.forwarder.route(request, body, serve)


ROUTES = [
    Route("/actors/{name}/request/{path:path}", handle, methods=METHODS),
    Route("/actors/{name}/request", handle, methods=METHODS),
]
