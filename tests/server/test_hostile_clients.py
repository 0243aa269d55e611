"""Slow, broken and hostile clients against a real server on loopback, with raw sockets.

A client that trickles its headers or its body is cut off with a 408 once its deadline passes;
connections beyond `max_connections` get a 503; a client that hangs up mid-body costs one debug
line, not a traceback; bad bytes are a 400 that names them; a trailing slash is a plain 404,
never a redirect built from the client's `Host` header.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlsplit

import anyio
import cbor2
import pytest
from server_helpers import Served, serving

pytestmark = pytest.mark.anyio
GET = b"/actors/ledger/actions/read"


def _connect(served: Served) -> socket.socket:
    address = urlsplit(served.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or 10 s pass)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _request(path: bytes, body: bytes = b"", content_type: bytes = b"application/json") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: %s\r\n"
        b"content-length: %d\r\n\r\n" % (path, content_type, len(body))
    ) + body


async def _exchange(served: Served, data: bytes) -> tuple[int, bytes, bytes]:
    """Send `data` raw; (status, headers, body) of the answer."""

    def run() -> bytes:
        with _connect(served) as sock:
            sock.sendall(data)
            return _read_all(sock)

    answer = await anyio.to_thread.run_sync(run)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, body


async def test_slow_headers_and_bodies_are_cut_off_with_a_408() -> None:
    async with serving(header_timeout_s=0.5, body_timeout_s=0.5, token=None) as served:

        def trickle(first: bytes) -> bytes:
            with _connect(served) as sock:
                sock.sendall(first)
                return _read_all(sock)

        partial_headers = (
            b"POST /actors/ledger/actions/read?key=k HTTP/1.1\r\nhost: localhost\r\nx-sl"
        )
        partial_body = _request(GET + b"?key=k", b'{"args": []}')[:-4]
        for first, what in ((partial_headers, b"headers"), (partial_body, b"body")):
            with anyio.fail_after(5):  # cut off at 0.5 s, not when the client gives up
                answer = await anyio.to_thread.run_sync(trickle, first)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b"request_timeout" in answer and what in answer, answer


async def test_connections_beyond_the_bound_are_answered_503() -> None:
    async with serving(max_connections=4, header_timeout_s=30, token=None) as served:
        held = [_connect(served) for _ in range(4)]
        try:
            for sock in held:  # each holds a connection, headers unfinished
                sock.sendall(b"POST /actors/ledger/actions/read?key=k HTTP/1.1\r\n")
            await anyio.sleep(0.2)
            status, _, _ = await _exchange(served, _request(GET + b"?key=k"))
        finally:
            for sock in held:
                sock.close()
        assert status == 503
        await anyio.sleep(0.2)
        status, _, body = await _exchange(served, _request(GET + b"?key=k"))
        assert status == 200, body


async def test_a_client_hanging_up_mid_body_is_one_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="pagekv.server")
    async with serving(token=None) as served:

        def hang_up() -> None:
            with _connect(served) as sock:
                sock.sendall(_request(GET + b"?key=k", b'{"args": [], "kwargs": {}}')[:-5])

        for _ in range(20):
            await anyio.to_thread.run_sync(hang_up)
        await anyio.sleep(0.3)
        status, _, _ = await _exchange(served, _request(GET + b"?key=k"))
    assert status == 200
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [], [r.getMessage() for r in lines]
    gone = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert len(gone) == 20 and all(r.levelno == logging.DEBUG and not r.exc_info for r in gone)


@pytest.mark.parametrize(
    ("path", "body", "content_type", "named"),
    [
        (GET + b"?key=k", cbor2.dumps({"args": []}) + b"\x00", b"application/cbor", b"after"),
        (GET + b"?key=k", b"null", b"application/json", b"not null"),
        (GET + b"?key=k", b'{"args": ["\\ud800"]}', b"application/json", b"surrogate"),
        (GET + b"?key=%FF", b"", b"application/json", b"UTF-8"),
    ],
    ids=["cbor-trailing-bytes", "json-null", "lone-surrogate", "invalid-utf8-key"],
)
async def test_bad_bytes_are_a_400_naming_them(
    path: bytes, body: bytes, content_type: bytes, named: bytes
) -> None:
    async with serving(token=None) as served:
        status, _, answer = await _exchange(served, _request(path, body, content_type))
        assert status == 400, answer
        assert named in answer, answer
        listed = await _exchange(
            served, b"GET /inspect/actors HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
        )
    assert b'"actors":[]' in listed[2], "a refused request created an actor"


async def test_a_trailing_slash_is_a_404_never_a_redirect() -> None:
    async with serving(token=None, allowed_hosts=("*",)) as served:  # a Host it answers
        request = _request(GET + b"/?key=k").replace(b"host: localhost", b"host: evil.example")
        status, head, _ = await _exchange(served, request)
    assert status == 404 and b"location" not in head.lower() and b"evil" not in head


async def test_headers_over_the_cap_are_a_431_and_a_408_closes_the_connection() -> None:
    async with serving(max_header_bytes=8192, body_timeout_s=0.5, token=None) as served:

        def huge_header() -> bytes:
            with _connect(served) as sock:
                sock.sendall(b"POST /actors/ledger/actions/read?key=k HTTP/1.1\r\nx-big: ")
                try:
                    for _ in range(100):  # 100 KiB, never finished
                        sock.sendall(b"a" * 1024)
                except OSError:  # the server closed the connection: expected
                    pass
                return _read_all(sock)

        def slow_body_kept_alive() -> bytes:
            with _connect(served) as sock:
                request = _request(GET + b"?key=k", b'{"args": []}').replace(
                    b"connection: close", b"connection: keep-alive"
                )
                sock.sendall(request[:-3])
                return _read_all(sock)  # returns once the server closes the connection

        def whole_in_one_write(size: int) -> bytes:
            with _connect(served) as sock:
                head = b"POST /actors/ledger/actions/read?key=k HTTP/1.1\r\nhost: localhost\r\n"
                sock.sendall(head + b"x-big: " + b"a" * size + b"\r\nconnection: close\r\n\r\n")
                return _read_all(sock)

        with anyio.fail_after(5):
            refused = await anyio.to_thread.run_sync(huge_header)
            timed_out = await anyio.to_thread.run_sync(slow_body_kept_alive)
            at_once = await anyio.to_thread.run_sync(whole_in_one_write, 9000)
            under = await anyio.to_thread.run_sync(whole_in_one_write, 7000)
    assert refused.startswith(b"HTTP/1.1 431") and b"8192 bytes" in refused, refused[:300]
    assert at_once.startswith(b"HTTP/1.1 431"), at_once[:300]
    assert not under.startswith(b"HTTP/1.1 431"), under[:300]
    assert timed_out.startswith(b"HTTP/1.1 408") and b"connection: close" in timed_out
