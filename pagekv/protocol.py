"""The wire protocol shared by the server and the Python client: paths, media types, error codes
and how bodies are encoded.

Bodies are JSON by default and CBOR when the request says `Content-Type: application/cbor`
(answers are CBOR when `Accept` asks for it). CBOR carries every value an actor can store; JSON
answers render `bytes` as `{"$bytes": "<base64>"}` and a float JSON has no number for as
`{"$float": "NaN"}` (or `"Infinity"`, `"-Infinity"`), and refuse anything else JSON cannot hold.
Dates and times are ISO 8601 text in JSON; in CBOR a date and a datetime with a time zone are
tagged (RFC 8943's tag 1004, RFC 8949's tag 0: cbor2 decodes them as `date` and `datetime`), and
a naive datetime and a `time`, which no CBOR tag holds, are the same text as in JSON. A
dataclass, a plain enum or a msgspec `Struct` is an object of its fields, or the enum's value, in
both: what an action annotated with it is given back (`pagekv.actor.typed_values`).
An error answer is always `{"error": {"code": ..., "message": ...}}` (plus `limit` when a limit
was hit), with a stable `code` from `ErrorCode`.
"""

from __future__ import annotations

import base64
import datetime
import enum
import io
import json
import math
import re
from typing import Any

import cbor2

from pagekv.actor.typed_values import as_builtins, cbor_dumps, is_structured

JSON = "application/json"
CBOR = "application/cbor"
TOKEN_ENV = "PAGEKV_TOKEN"
DEFAULT_PORT = 6420
DEFAULT_MAX_BODY_BYTES = 1 << 20


class ErrorCode(enum.StrEnum):
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    MALFORMED_BODY = "malformed_body"
    INVALID_BODY = "invalid_body"
    INVALID_PARAMETER = "invalid_parameter"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_ACTOR = "unknown_actor"
    UNKNOWN_ACTION = "unknown_action"
    ACTOR_NOT_FOUND = "actor_not_found"
    ACTOR_EXISTS = "actor_exists"
    ACTOR_TAKEN_OVER = "actor_taken_over"
    ACTOR_STOPPED = "actor_stopped"
    NOT_OWNER = "not_owner"
    CALL_CYCLE = "call_cycle"
    """The call re-entered an actor whose transaction on the same call chain waits for it
    (`CallCycle`); refused before it ran. The message names the chain."""
    """A forwarded call reached a registry that does not own the actor (it just went to sleep
    there, was taken over, or the registry is draining): nothing was written; retry."""
    OWNER_UNREACHABLE = "owner_unreachable"
    """Another registry owns the actor under a live lease but could not be reached in time:
    nothing was written; retry (the actor moves once the lease runs out)."""
    OWNER_TIMEOUT = "owner_timeout"
    """The owner got the forwarded call but sent no answer in time: it may have run."""
    STORAGE_UNAVAILABLE = "storage_unavailable"
    KV_LIMIT = "kv_limit"
    QUEUE_FULL = "queue_full"
    MESSAGE_TOO_LARGE = "message_too_large"
    INVALID_QUEUE_NAME = "invalid_queue_name"
    TOO_MANY_SCHEDULES = "too_many_schedules"
    TABLE_NOT_FOUND = "table_not_found"
    QUERY_REFUSED = "query_refused"
    ANSWER_TOO_LARGE = "answer_too_large"
    INSPECTOR_BUSY = "inspector_busy"
    REQUEST_TIMEOUT = "request_timeout"
    HEADERS_TOO_LARGE = "headers_too_large"
    INVALID_QUERY = "invalid_query"
    NO_WORKFLOW = "no_workflow"
    WORKFLOW_CHANGE_REFUSED = "workflow_change_refused"
    READ_ONLY = "read_only"
    """`pagekv ui` only reads the store: changes are made through a server (`pagekv serve`)."""
    ACTION_ERROR = "action_error"
    UNENCODABLE_RESULT = "unencodable_result"
    """The call ran and its writes (`written`) stand; only its result cannot be sent."""
    INTERNAL = "internal_error"
    HOST_NOT_ALLOWED = "host_not_allowed"
    """421: the request's `Host` is not a name of this server (`--allowed-hosts`)."""
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    """403: a page of another origin may not change state on an unauthenticated server."""


class BodyError(ValueError):
    """A body that does not decode as its media type says."""


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.date | datetime.time):  # a datetime is a date
        return value.isoformat()
    if is_structured(value):
        return as_builtins(value)
    try:
        encode(value, CBOR)
    except (TypeError, ValueError, RecursionError, cbor2.CBOREncodeError):  # no hint that fails
        raise TypeError(f"a {type(value).__name__} cannot be sent as JSON or CBOR") from None
    raise TypeError(f"a {type(value).__name__} cannot be sent as JSON; ask for {CBOR}")


def _refuse_constant(name: str) -> Any:
    raise BodyError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A JSON number as a float; one beyond a float's range (`1e999`) would become infinity,
    which no JSON answer can carry back, so it is refused like the `Infinity` literal."""
    value = float(text)
    if not math.isfinite(value):
        raise BodyError(f"number {text[:40]} is out of range for a float")
    return value


def encode(value: Any, media_type: str) -> bytes:
    """Raises TypeError (or `cbor2.CBOREncodeError`) for a value the media type cannot hold."""
    if media_type == CBOR:
        return cbor_dumps(value)
    try:
        return _dumps(value)
    except ValueError:  # a NaN or an infinity somewhere: tag them (a rare, slower pass)
        return _dumps(_tag_floats(value))


def _dumps(value: Any) -> bytes:
    return json.dumps(value, default=_json_default, allow_nan=False, separators=(",", ":")).encode()


def _tag_floats(value: Any) -> Any:
    """`value` with every float JSON cannot hold as `{"$float": ...}`."""
    if isinstance(value, float) and not math.isfinite(value):
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return {"$float": name}
    if isinstance(value, dict):
        return {k: _tag_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tag_floats(v) for v in value]
    return value


_SELF_DESCRIBED = b"\xd9\xd9\xf7"


def decode(data: bytes, media_type: str) -> Any:
    """Decode a body; raises `BodyError` naming what is wrong: also for bytes after the CBOR
    value (as JSON refuses trailing data) and for a JSON string with a lone surrogate, which
    is no text (`"\\ud800"`: it could be neither stored nor sent back)."""
    try:
        if media_type == CBOR:
            # the self-describe tag (RFC 8949 §3.4.6) marks a body as CBOR and means nothing
            # more; cbor2 would decode what it wraps as immutable (frozendict, tuples)
            stream = io.BytesIO(data[3:] if data.startswith(_SELF_DESCRIBED) else data)
            value = cbor2.CBORDecoder(stream).decode()
            left = len(stream.getbuffer()) - stream.tell()
            if left:
                raise BodyError(f"malformed CBOR body: {left} bytes after the value")
            return value
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
        if _SURROGATE_ESCAPE.search(data):  # a pair is fine: only then look at every string
            _refuse_lone_surrogates(value)
        return value
    except BodyError:
        raise
    except (ValueError, RecursionError, cbor2.CBORDecodeError) as e:
        kind = "CBOR" if media_type == CBOR else "JSON"
        raise BodyError(f"malformed {kind} body: {e}") from e


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise BodyError(
                "malformed JSON body: a string holds a lone surrogate (\\ud800-\\udfff), "
                "which is not text"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key)
            _refuse_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _refuse_lone_surrogates(item)
