"""The gateway: actions, create, destroy and queue messages for actors addressed by name and key.

    POST   /actors/{name}/actions/{action}?key=K[&mode=M]  {"args", "kwargs", "input"}
    POST   /actors/{name}/queues/{queue}?key=K[&mode=M]    {"body", "input"}
    POST   /actors/{name}?key=K                            {"input"}
    DELETE /actors/{name}?key=K

`mode` is `get_or_create` (the default) or `get` (404 if the actor does not exist).

The key travels in the query string (any text, percent-encoded) so it never collides with the
path. `key` and `mode` are the only routing parameters; anything else is refused, and only the
body's `args`/`kwargs` reach the action. Unknown actor types and actions, arguments that do not
bind to the action, and messages the queue refuses are refused (by the registry) before anything
is created or woken. Every answer is `{"result": ...}` (or `{"id": ...}` for a queued message),
every failure an `{"error": {code, message, written}}` from `http_errors.py`: `written` says whether
the call committed anything (true), nothing (false: a retry is safe), or a commit's outcome is
unknown (null).

Every failed call is one record on the `pagekv.server` logger (only emitted: configuring handlers
is the application's business), naming the actor, the operation, the error's type and code and the
request's id (`process/logs.py`), never the arguments: ERROR for a 5xx, with the exception's
message and its traceback when the action's own code raised it (`action_error`: the operator's only
way to the line that failed), INFO for a 4xx (the caller's fault: one line, no message, which may
hold what the client sent) and for a forwarded call refused as `not_owner` (a hand-off, which its
sender routes again). The record carries them as `extra` fields too (`actor`, `actor_key`,
`operation`, `action`, `queue`, `error_type`, `error_code`, `status`, `written`, `request_id`, and
`error_message` for an `action_error`). The client's answer is the same either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagekv.actor import OwnedElsewhere, call_chain
from pagekv.actor.directory.leases import Forwarded
from pagekv.actor.request_writes import Writes, tracking_writes
from pagekv.protocol import ErrorCode
from pagekv.server.app_state import Runtime, runtime
from pagekv.server.http_errors import HttpError, classify
from pagekv.server.process.logs import REQUEST_ID
from pagekv.server.request_io import answer, decode_body, query_params, read_fields, read_raw_body

MODES = ("get_or_create", "get")
_ROUTING = {"key": True, "mode": False}
_ACTION_FIELDS = frozenset({"args", "kwargs", "input"})
_SEND_FIELDS = frozenset({"body", "input"})
_CREATE_FIELDS = frozenset({"input"})

_MESSAGE_CHARS = 500
log = logging.getLogger("pagekv.server")


def log_failure(
    operation: str, target: str | None, name: str, key: str, error: Exception, failure: HttpError
) -> HttpError:
    """`failure`, the answer to a failed `operation` ("action", "send", "create", "destroy") of
    `target` (the action or the queue), once it is logged (see the module's docstring); a
    WebSocket's failed action frame is logged here too."""
    user_code = failure.code == ErrorCode.ACTION_ERROR
    written = failure.writes.state() if failure.writes is not None else None
    what = operation if target is None else f"{operation} {_shown(target)}"
    level = logging.ERROR if failure.status >= 500 else logging.INFO
    error_message = _message(error) if user_code else None
    request_id = REQUEST_ID.get()
    log.log(
        logging.INFO if failure.code == ErrorCode.NOT_OWNER else level,
        "%s of actor %s key %s failed: %s (%d %s, written=%s, request_id=%s)",
        what,
        _shown(name),
        _shown(key),
        type(error).__name__
        if error_message is None
        else f"{type(error).__name__}: {error_message}",
        failure.status,
        failure.code,
        "unknown" if written is None else str(written).lower(),
        request_id,
        exc_info=error if user_code else None,
        extra={
            "actor": name,
            "actor_key": key,
            "operation": operation,
            "action": target if operation == "action" else None,
            "queue": target if operation == "send" else None,
            "error_type": type(error).__name__,
            "error_code": str(failure.code),
            "error_message": error_message,
            "status": failure.status,
            "written": written,
            "request_id": request_id,
        },
    )
    return failure


def _message(error: Exception) -> str:
    """An exception's text on one line (escaped like `_shown`, without its quotes), cut: the
    traceback after it holds the whole of it."""
    text = repr(str(error))[1:-1]
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."


def _shown(text: str) -> str:
    """A name from the request in a log line: quoted and escaped (no line breaks), and cut."""
    return repr(text if len(text) <= 80 else text[:80] + "...")


def _create_flag(params: dict[str, str], body: dict[str, Any]) -> bool:
    mode = params.get("mode", "get_or_create")
    if mode not in MODES:
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, f"mode must be one of {list(MODES)}, got {mode!r}"
        )
    if mode == "get" and "input" in body:
        raise HttpError(400, ErrorCode.INVALID_BODY, "input is only used with mode=get_or_create")
    return mode == "get_or_create"


def _arguments(body: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = body.get("args", [])
    kwargs = body.get("kwargs", {})
    if not isinstance(args, list):
        raise HttpError(400, ErrorCode.INVALID_BODY, "args must be an array")
    if not isinstance(kwargs, dict) or not all(
        isinstance(k, str) and k.isidentifier() for k in kwargs
    ):
        raise HttpError(
            400, ErrorCode.INVALID_BODY, "kwargs must be an object keyed by argument names"
        )
    return tuple(args), kwargs


async def _request(
    request: Request, fields: frozenset[str]
) -> tuple[Runtime, str, dict[str, str], bytes, dict[str, Any]]:
    rt = runtime(request)
    params = query_params(request, _ROUTING)
    raw = await read_raw_body(request, rt.config)
    body = read_fields(decode_body(request, raw, rt.config), fields)
    return rt, params["key"], params, raw, body


def _chain(request: Request) -> tuple[call_chain.Frame, ...]:
    """The call chain of the action that made this call (`Pagekv-Call-Chain`, which `HttpClient`
    sends from actor code): a call that re-enters one of its transactions is refused
    (`CallCycle`) rather than deadlocked. A malformed header is a 400."""
    try:
        return call_chain.decode(request.headers.get(call_chain.HEADER, ""))
    except ValueError as e:
        raise HttpError(400, ErrorCode.INVALID_PARAMETER, str(e)) from e


@contextmanager
def failures(operation: str, target: str | None, name: str, key: str) -> Iterator[Writes]:
    """Around the registry call of a route: what it writes, and any failure as its answer
    (logged, see `log_failure`), except `OwnedElsewhere`, which routes it to the owner."""
    with tracking_writes() as writes:
        try:
            yield writes
        except OwnedElsewhere:
            raise
        except Exception as e:
            failure = classify(e, in_action=True, writes=writes)
            raise log_failure(operation, target, name, key, e, failure) from e


async def call_action(request: Request) -> Response:
    rt, key, params, raw, body = await _request(request, _ACTION_FIELDS)
    name, action = request.path_params["name"], request.path_params["action"]
    create = _create_flag(params, body)
    args, kwargs = _arguments(body)
    chain = _chain(request)

    async def serve(via: Forwarded | None) -> Response:
        with failures("action", action, name, key) as writes, call_chain.continuing(chain):
            started = time.perf_counter()
            result = await rt.registry.call(
                name, key, action, args, kwargs, create=create, input=body.get("input"), via=via
            )
            rt.latency.observe((name, action), time.perf_counter() - started)
        return answer(request, {"result": result}, writes=writes)

    return await rt.forwarder.route(request, raw, serve)


async def send_message(request: Request) -> Response:
    rt, key, params, raw, body = await _request(request, _SEND_FIELDS)
    name, queue = request.path_params["name"], request.path_params["queue"]
    create = _create_flag(params, body)
    chain = _chain(request)

    async def serve(via: Forwarded | None) -> Response:
        with failures("send", queue, name, key), call_chain.continuing(chain):
            message_id = await rt.registry.send(
                name, key, queue, body.get("body"), create=create, input=body.get("input"), via=via
            )
        return answer(request, {"id": message_id})

    return await rt.forwarder.route(request, raw, serve)


async def create_actor(request: Request) -> Response:
    rt = runtime(request)
    key = query_params(request, {"key": True})["key"]
    raw = await read_raw_body(request, rt.config)
    body = read_fields(decode_body(request, raw, rt.config), _CREATE_FIELDS)
    name = request.path_params["name"]

    async def serve(via: Forwarded | None) -> Response:
        with failures("create", None, name, key):
            await rt.registry.instance(
                name, key, create=True, must_be_new=True, input=body.get("input"), via=via
            )
        return answer(request, {"result": {"name": name, "key": key}}, status=201)

    return await rt.forwarder.route(request, raw, serve)


async def destroy_actor(request: Request) -> Response:
    rt = runtime(request)
    key = query_params(request, {"key": True})["key"]
    raw = await read_raw_body(request, rt.config)
    name = request.path_params["name"]

    async def serve(via: Forwarded | None) -> Response:
        with failures("destroy", None, name, key):
            await rt.registry.destroy(name, key, via=via)
        return answer(request, {"result": None})

    return await rt.forwarder.route(request, raw, serve)


ROUTES = [
    Route("/actors/{name}/actions/{action}", call_action, methods=["POST"]),
    Route("/actors/{name}/queues/{queue:path}", send_message, methods=["POST"]),
    Route("/actors/{name}", create_actor, methods=["POST"]),
    Route("/actors/{name}", destroy_actor, methods=["DELETE"]),
]
