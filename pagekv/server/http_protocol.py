"""The HTTP protocol uvicorn runs: httptools' parser, with a deadline for each request's headers.

uvicorn times out an idle keep-alive connection, but any byte a client sends cancels that, so a
client that trickles its headers one byte at a time holds a connection (and a file descriptor)
for as long as it likes; 200 of them starve the server. Here every request's headers must be
complete within `header_timeout_s` of its first byte (or of the connection's opening, for the
first request): past it the client gets a 408 and the connection is closed. The body's own
deadline is the app's (`codec.read_body`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from asyncio import TimerHandle
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("pagekv.server")


class _HeaderDeadline(HttpToolsProtocol):
    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.debug(
            "closing a connection whose request headers took over %s s", self.header_timeout_s
        )
        message = f"the request headers did not arrive within {self.header_timeout_s:g} s"
        body = json.dumps({"error": {"code": "request_timeout", "message": message}}).encode()
        head = (
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def http_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with that header deadline."""
    return type(
        "HeaderDeadlineProtocol", (_HeaderDeadline,), {"header_timeout_s": header_timeout_s}
    )
