"""The HTTP protocol uvicorn runs: httptools' parser, with a deadline for each request's headers.

uvicorn times out an idle keep-alive connection, but any byte a client sends cancels that, so a
client that trickles its headers one byte at a time holds a connection (and a file descriptor)
for as long as it likes; 200 of them starve the server. Here every request's headers must be
complete within `header_timeout_s` of its first byte (or of the connection's opening, for the
first request): past it the client gets a 408 and the connection is closed; and they may hold at
most `max_header_bytes` (431 beyond). The body's own deadline is the app's (`codec.read_body`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from asyncio import TimerHandle
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("pagekv.server")
_LINGER_S = 1.0


class _HeaderDeadline(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: TimerHandle | None = None
        self._header_bytes = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """The bytes of a request's headers count against `max_header_bytes` before they are
        parsed: httptools buffers them without a bound (it took a 100 MiB header), and headers
        that arrive whole in one chunk must count too (a 70 KB header in one write passed)."""
        if self._refused:
            return  # lingering after a refusal: read and drop
        if self._deadline is not None:  # in a request's headers
            end = data.find(b"\r\n\r\n")
            if self._header_bytes + (len(data) if end < 0 else end + 4) > self.max_header_bytes:
                self._disarm()
                message = f"the request headers exceed {self.max_header_bytes} bytes"
                self._refuse(431, "Request Header Fields Too Large", "headers_too_large", message)
                return
        super().data_received(data)
        if self._deadline is not None:  # still in the headers, or in the next request's
            self._header_bytes += len(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._header_bytes = 0
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        message = f"the request headers did not arrive within {self.header_timeout_s:g} s"
        self._refuse(408, "Request Timeout", "request_timeout", message)

    def _refuse(self, status: int, reason: str, code: str, message: str) -> None:
        """Answer an error before any request reached the app, and close the connection.

        The close lingers (`_LINGER_S`): the answer is sent and the sending side shut, and what
        the client still sends is read and dropped until then. Closed at once with unread data,
        the connection would be reset, and the client could lose the answer before reading it.
        """
        if self.transport.is_closing() or self._refused:
            return
        self._refused = True
        log.debug("closing a connection: %s", message)
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)


def http_protocol(header_timeout_s: float, max_header_bytes: int) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with that header deadline and cap."""
    attributes = {"header_timeout_s": header_timeout_s, "max_header_bytes": max_header_bytes}
    return type("HeaderDeadlineProtocol", (_HeaderDeadline,), attributes)
