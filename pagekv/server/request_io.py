"""Reading requests and writing answers: bounded bodies, media types, strict query parameters.

Invariants: a body is never read past `max_body_bytes` (a declared or streamed excess is a 413
naming the limit); a query parameter the route does not know, or one given twice, is a 400 that
names it, so nothing unexpected can ride along into an actor call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import anyio
import cbor2
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from pagekv.actor.request_writes import Writes
from pagekv.protocol import CBOR, JSON, BodyError, ErrorCode, decode, encode
from pagekv.server.config import ServerConfig
from pagekv.server.http_errors import HttpError


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit()


async def read_body(request: Request, config: ServerConfig) -> Any:
    """The decoded body; `{}` when it is empty. Raises `HttpError` for every bad body, and
    408 for one that does not arrive whole within `body_timeout_s`."""
    return decode_body(request, await read_raw_body(request, config), config)


async def read_raw_body(request: Request, config: ServerConfig) -> bytes:
    """The body's bytes, read within `max_body_bytes` and `body_timeout_s` (`HttpError`
    past either)."""
    max_bytes = config.max_body_bytes
    too_large = HttpError(
        413,
        ErrorCode.BODY_TOO_LARGE,
        f"request body exceeds the limit of {max_bytes} bytes",
        limit="max_body_bytes",
    )
    declared = request.headers.get("content-length")
    if declared is not None and _is_count(declared) and int(declared) > max_bytes:
        raise too_large
    data = bytearray()
    with anyio.move_on_after(config.body_timeout_s) as reading:
        async for chunk in request.stream():
            data += chunk
            if len(data) > max_bytes:
                raise too_large
    if reading.cancelled_caught:
        raise HttpError(
            408,
            ErrorCode.REQUEST_TIMEOUT,
            f"the request body did not arrive within {config.body_timeout_s:g} s (body_timeout_s)",
        )
    return bytes(data)


def decode_body(request: Request, data: bytes, config: ServerConfig) -> Any:
    """`data` decoded as the request's media type says; `{}` when empty.

    On an unauthenticated server a body must say it is JSON or CBOR, and a request with any
    other `Content-Type` is a 415 even when its body is empty: the media types a browser page
    may send to another site without a preflight (forms, `text/plain`, none) thus never reach
    a route of pagekv's. With a token a cross-site page has no credential to send, so API
    clients keep the lenient reading: an empty body is `{}` whatever its type, and a body
    without a `Content-Type` is JSON."""
    declared = request.headers.get("content-type")
    if not config.unauthenticated:
        if not data:
            return {}
        declared = declared or JSON
    elif declared is None and not data:
        return {}
    media_type = (declared or "").split(";")[0].strip().lower()
    if media_type not in (JSON, CBOR):
        shown = repr(media_type[:100]) if declared is not None else "(none)"
        raise HttpError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"unsupported Content-Type {shown}; send the body as {JSON} or {CBOR}",
        )
    if not data:
        return {}
    try:
        return decode(data, media_type)
    except BodyError as e:
        raise HttpError(400, ErrorCode.MALFORMED_BODY, str(e)) from e


def read_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """A body that must be a map whose keys are all in `allowed` (an empty body is `{}`)."""
    if not isinstance(body, dict):
        kind = "null" if body is None else type(body).__name__
        raise HttpError(400, ErrorCode.INVALID_BODY, f"the body must be an object, not {kind}")
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise HttpError(
            400,
            ErrorCode.INVALID_BODY,
            f"unknown body field(s) {unknown}; allowed: {sorted(allowed)}",
        )
    return body


def answer(
    request: Request, value: Any, status: int = 200, writes: Writes | None = None
) -> Response:
    """`value` encoded as the client asked (`Accept: application/cbor`, else JSON).

    A value the media type cannot hold is a 422, not a 5xx: the call ran, and what it wrote
    (`writes`, reported as `written`) stands, so a client must not retry it as a failure."""
    media_type = CBOR if CBOR in request.headers.get("accept", "") else JSON
    try:
        content = encode(value, media_type)
    except (TypeError, ValueError, RecursionError, cbor2.CBOREncodeError) as e:
        done = "ran, and its writes are committed" if writes and writes.state() else "ran"
        message = f"the call {done}, but its result cannot be sent as {media_type}: {e}"
        error = HttpError(422, ErrorCode.UNENCODABLE_RESULT, message, writes=writes)
        return error_answer(request, error)
    return Response(content, status_code=status, media_type=media_type)


def error_answer(request: HTTPConnection, error: HttpError) -> Response:
    media_type = CBOR if CBOR in request.headers.get("accept", "") else JSON
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    if error.status == 408:  # the rest of the body may still trickle in: drop the connection
        headers["connection"] = "close"
    return Response(
        encode(error.body(), media_type),
        status_code=error.status,
        media_type=media_type,
        headers=headers,
    )


def query_params(request: Request, allowed: Mapping[str, bool]) -> dict[str, str]:
    """The query parameters, each at most once and all known; `allowed` maps name -> required."""
    items = query_items(request)
    counts = Counter(name for name, _ in items)
    known = ", ".join(allowed) or "none"
    unknown = sorted(name for name in counts if name not in allowed)
    if unknown:
        raise HttpError(
            400,
            ErrorCode.INVALID_PARAMETER,
            f"unknown query parameter(s) {unknown}; this route takes: {known}",
        )
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, f"query parameter(s) {repeated} given more than once"
        )
    missing = sorted(name for name, required in allowed.items() if required and name not in counts)
    if missing:
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, f"missing required query parameter(s) {missing}"
        )
    return dict(items)


def query_items(request: Request) -> list[tuple[str, str]]:
    """The query string's pairs, decoded as UTF-8 strictly: Starlette's parse makes invalid
    UTF-8 (`key=%FF`) into U+FFFD, which would address another actor than the one asked."""
    raw: bytes = request.scope.get("query_string", b"")
    try:
        return parse_qsl(raw.decode("ascii"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as e:
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, f"the query string is not valid UTF-8: {e}"
        ) from None


def int_param(params: Mapping[str, str], name: str, *, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not _is_count(raw) or not low <= int(raw) <= high:
        raise HttpError(
            400,
            ErrorCode.INVALID_PARAMETER,
            f"query parameter {name!r} must be an integer from {low} to {high}, got {raw!r}",
        )
    return int(raw)
