"""How a server's records reach its operator: the request id every record of a request carries,
and the two formats of `--log-format` (`text` for a terminal, `json` for log shippers).

The request id is the client's `X-Request-Id` when it is a short token (a proxy's id, so both
logs name the same request), else a fresh one. It is only logged, never sent back: the answers
stay what they were. Nothing here reads a request's other headers, so no token or
`Authorization` value can reach a record.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

LOG_FORMATS: Final = ("text", "json")
REQUEST_ID: ContextVar[str | None] = ContextVar("pagekv_request_id", default=None)
"""The id of the HTTP request or WebSocket connection being served (None outside one)."""
_CLIENT_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RECORD_FIELDS: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
"""The attributes every `LogRecord` has: what is left of a record's are its `extra` fields."""


class RequestIds:
    """ASGI middleware: sets `REQUEST_ID` for everything that serves one request or socket."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        token = REQUEST_ID.set(_request_id(scope))
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_ID.reset(token)


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _CLIENT_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex[:16]


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: `time` (UTC, ISO 8601), `level`, `logger`,
    `message`, `request_id` inside a request, each other `extra` field of the record, and
    `traceback` when the record has one. Values JSON cannot hold are written as their `str`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _RECORD_FIELDS and key not in entry
        )
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def announce(text: str, log_format: str) -> None:
    """`text` on stderr whatever the log level (the banner saying where a server listens): as
    it is, or as one `JsonFormatter` object, so that a `json` log holds nothing else."""
    if log_format == "json":
        record = logging.makeLogRecord(
            {"name": "pagekv.server", "levelno": logging.INFO, "levelname": "INFO", "msg": text}
        )
        text = JsonFormatter().format(record)
    print(text, file=sys.stderr, flush=True)


def configure_logging(level: str, log_format: str = "text") -> None:
    """One format for pagekv's records and uvicorn's (which then adds no handlers of its own),
    on stderr: `text` is time, level, logger, message (a traceback on the lines after it);
    `json` is `JsonFormatter`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {list(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if level != "debug":  # a line per request it makes: the address check, each forwarded call
        logging.getLogger("httpx").setLevel(logging.WARNING)
