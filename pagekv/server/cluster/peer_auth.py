"""Servers of one store proving to each other that they are servers of it: a shared cluster
secret, with which a forwarded call and its answer are each signed (HMAC-SHA256).

A forwarder sends no token (the server's own is taken off every request once checked,
`BearerAuth`) nor any other credential of its own: whatever listens at an owner's address (a
process that bound the port of a killed owner, say) learns no token from it. Instead the
request carries `X-Pagekv-Proof: <timestamp> <nonce> <mac>` over the `X-Pagekv-Forwarded`
value (the sender, the registry it means and its lease end), the method, the path and query,
the timestamp and a fresh nonce. The receiving server (`PeerAuth`) serves a forwarded call
only with a valid proof, a timestamp within `PROOF_WINDOW_S` of its clock and a nonce it has
not seen in that window (a replay changes nothing); it then trusts the sender's authentication
of the client in place of a token. Its answer carries `X-Pagekv-Proof: <registry> <mac>` over
the request's nonce, its registry id and the status, and the forwarder relays an answer only
with a valid one: an answer without it came from a process that does not hold the secret,
which cannot have served the call.

What the proof cannot do is keep the rest of a call from such a process: it is sent before
the answer proves anything, so its body and end-to-end headers (cookies; an app's own
`Authorization` under `--unauthenticated`, where the server has no token) reach it. Servers
on a network others can listen on or bind addresses in should reach each other over https.

An actor's `ctx.client` call or socket to an actor another server owns (`OwnerCalls`) is
signed the same way, without a forwarding header (it is served as a client's, routed afresh
there), through `PeerTransport` and `socket_proof`; so is the check of a process's own advertise
URL at start.

The proof says "holds the cluster secret", not "is the registry the lease named": a server
restarted at the owner's address serves the calls meant for the registry that died there
(`Placement._route`), so an answer from it is the actor's answer too. The secret is never
logged nor shown.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import httpx
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagekv.protocol import ErrorCode
from pagekv.server.config import ConfigError
from pagekv.server.http_errors import HttpError
from pagekv.server.request_io import error_answer

CLUSTER_SECRET_ENV = "PAGEKV_CLUSTER_SECRET"
SECRET_FILE = "cluster-secret"
"""The secret generated into a `file:` store's directory (mode 0600) when none is given."""
FORWARDED_HEADER = "x-pagekv-forwarded"
PROOF_HEADER = "x-pagekv-proof"
PEER_SCOPE_KEY = "pagekv.peer"
"""Set in the scope of a forwarded call whose proof holds (its nonce): `BearerAuth` lets it
through without a token."""
PROOF_WINDOW_S = 30.0
MEMBER_PATH: Final = "/cluster/member"
_PROCESS_SECRET = secrets.token_hex(32)
log = logging.getLogger("pagekv.server")


class ProofError(ValueError):
    """A forwarded call, or its answer, without a valid proof of the cluster secret."""


def stored_secret(kv_url: str) -> str | None:
    """The secret of a `file:` store (read from, or generated once into, its directory, which
    must exist: open the store first); None for other stores. Several processes starting at
    once agree: the file appears whole or not at all (a link of a complete file)."""
    parts = urlsplit(kv_url)
    if parts.scheme != "file":
        return None
    directory = Path(
        parts.netloc + parts.path if parts.netloc not in ("", "localhost") else parts.path
    )
    path = directory / SECRET_FILE
    if not path.exists():
        draft = directory / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another's came first: it is everyone's
                os.link(draft, path)
        finally:
            draft.unlink()
    if path.stat().st_mode & 0o077:
        raise ConfigError(
            f"{path} is readable by other users: chmod 600 it (it authenticates the servers "
            "of the store to each other)"
        )
    return path.read_text().strip()


class ClusterKey:
    """Signs and checks proofs with the cluster secret (None: a secret of this process's own,
    so that servers in one process forward to each other and no other process's do), and
    remembers the nonces of the calls accepted within `PROOF_WINDOW_S`."""

    def __init__(self, secret: str | None) -> None:
        self._key = (secret or _PROCESS_SECRET).encode()
        self._seen: dict[str, float] = {}

    def _mac(self, *fields: str) -> str:
        message = "\n".join(fields).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def sign_request(
        self, to: str, forwarding: str, method: str, target: str, body: bytes = b""
    ) -> tuple[str, str]:
        """The proof header's value for a call to the registry `to`, and its nonce (to check
        the answer by). The proof covers the receiver and the body, so that one captured
        (by a process at a dead owner's address, or on the wire) opens nothing at another
        server and carries no other body."""
        stamp, nonce = repr(time.time()), secrets.token_hex(16)
        mac = self._mac("request", to, forwarding, method, target, _digest(body), stamp, nonce)
        return f"{stamp} {nonce} {mac}", nonce

    def check_request(
        self,
        proof: str | None,
        me: str,
        forwarding: str,
        method: str,
        target: str,
        body: bytes = b"",
    ) -> str:
        """The nonce of a call to the registry `me` whose proof holds; else `ProofError`
        saying why (a proof signed for another registry does not match)."""
        parts = (proof or "").split(" ")
        if len(parts) != 3:
            raise ProofError("it carries no proof of the cluster secret")
        stamp, nonce, mac = parts
        expected = self._mac("request", me, forwarding, method, target, _digest(body), *parts[:2])
        if not hmac.compare_digest(mac, expected):
            raise ProofError(
                "its proof does not match this server's cluster secret, this server or its body"
            )
        now = time.time()
        if not abs(now - float(stamp)) <= PROOF_WINDOW_S:
            raise ProofError(f"its proof is more than {PROOF_WINDOW_S:g} s old or ahead")
        while self._seen and next(iter(self._seen.values())) < now:
            del self._seen[next(iter(self._seen))]
        if nonce in self._seen:
            raise ProofError("its proof was used before (a replay)")
        self._seen[nonce] = now + 2 * PROOF_WINDOW_S
        return nonce

    def sign_answer(self, nonce: str, registry: str, status: int) -> str:
        return f"{registry} {self._mac('answer', nonce, registry, str(status))}"

    def check_answer(self, proof: str | None, nonce: str, status: int) -> str:
        """The id of the registry that answered the call `nonce`; `ProofError` if the answer's
        proof does not hold."""
        registry, _, mac = (proof or "").partition(" ")
        if not registry or not hmac.compare_digest(
            mac, self._mac("answer", nonce, registry, str(status))
        ):
            raise ProofError("its answer carries no valid proof of the cluster secret")
        return registry


ANY_SERVER: Final = "*"
"""The receiver a proof names when it asks only `GET /cluster/member` (which registry
answers at an address): any server of the store may answer that, and it changes nothing."""


def _asks_who(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == MEMBER_PATH


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def call_target(scope: Scope) -> str:
    """What a proof names of a request's address: its path (as decoded, which sender and
    receiver see alike) and raw query string."""
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{scope['path']}?{query}" if query else scope["path"]


class PeerAuth:
    """Lets a forwarded call (one with `X-Pagekv-Forwarded`), or one with a proof (a server's
    `ctx.client` call or socket), through only with a valid proof, and signs every answer to
    it; any other is refused (HTTP 403, WebSocket close 1008) before anything runs. Invariant:
    every answer this server sends to a call it accepted from a server carries the answer
    proof, so that server can tell it from a squatter's."""

    def __init__(self, app: ASGIApp, key: ClusterKey, max_body_bytes: int) -> None:
        self.app = app
        self._key = key
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        own = (FORWARDED_HEADER.encode(), PROOF_HEADER.encode())
        given = [(k, v) for k, v in scope.get("headers", ()) if k in own]
        if not given:
            await self.app(scope, receive, send)
            return
        forwarding = [v for k, v in given if k == own[0]]
        proof = [v for k, v in given if k == own[1]]
        registry = getattr(scope["app"].state, "registry", None)
        registry_id: str = registry.id if registry is not None else ""
        body, replay = b"", receive
        if scope["type"] == "http":
            read = await _read_body(receive, self._max_body)
            if read is None:
                await self._too_large(scope, receive, send, proof)
                return
            body, replay = read
        try:
            if len(forwarding) > 1 or len(proof) > 1:
                raise ProofError("it carries a forwarding or proof header more than once")
            nonce = self._key.check_request(
                proof[0].decode("latin-1") if proof else None,
                ANY_SERVER if _asks_who(scope) else registry_id,
                forwarding[0].decode("latin-1") if forwarding else "",
                scope.get("method", "GET"),
                call_target(scope),
                body,
            )
        except ValueError as e:  # a ProofError, or a timestamp that is no number
            await self._refuse(scope, replay, send, str(e))
            return

        async def signed(message: Message) -> None:
            kind = message["type"]
            if kind in ("http.response.start", "websocket.accept"):
                status = message.get("status", 101)
                proof = self._key.sign_answer(nonce, registry_id, status).encode()
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (PROOF_HEADER.encode(), proof)],
                }
            await send(message)

        scope[PEER_SCOPE_KEY] = nonce
        await self.app(scope, replay, signed)

    async def _too_large(
        self, scope: Scope, receive: Receive, send: Send, proof: list[bytes]
    ) -> None:
        """A 413, as the route would answer, signed for the call's nonce so that its
        forwarder relays it: the proof covers the body, so it cannot be checked, but a 413 says
        only that nothing was written."""
        registry = getattr(scope["app"].state, "registry", None)
        nonce = (
            proof[0].decode("latin-1").split(" ")[1] if proof and proof[0].count(b" ") == 2 else ""
        )
        error = HttpError(
            413,
            ErrorCode.BODY_TOO_LARGE,
            f"request body exceeds the limit of {self._max_body} bytes",
            limit="max_body_bytes",
        )
        signature = self._key.sign_answer(nonce, registry.id if registry else "", 413).encode()

        async def signed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (PROOF_HEADER.encode(), signature)]
                message = {**message, "headers": headers}
            await send(message)

        await error_answer(Request(scope), error)(scope, receive, signed)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, why: str) -> None:
        message = (
            f"a forwarded call refused: {why}; every server of the store needs the same "
            f"--cluster-secret (${CLUSTER_SECRET_ENV})"
        )
        log.warning("%s", message)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "unproven forward"})
            return
        error = HttpError(403, ErrorCode.UNAUTHORIZED, message)
        await error_answer(Request(scope), error)(scope, receive, send)


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, Receive] | None:
    """A request's whole body (None past `limit` bytes), and a `receive` that hands it to the
    app again: a proof covers the body, so it is read before anything runs."""
    pieces: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(pieces), _replaying([], message, receive)
        piece = message.get("body", b"")
        size += len(piece)
        if size > limit:
            return None
        pieces.append(piece)
        more = message.get("more_body", False)
    body = b"".join(pieces)
    return body, _replaying(
        [{"type": "http.request", "body": body, "more_body": False}], None, receive
    )


def _replaying(first: list[Message], last: Message | None, receive: Receive) -> Receive:
    queued = [*first, *([last] if last is not None else [])]

    async def replay() -> Message:
        return queued.pop(0) if queued else await receive()

    return replay


class UnprovenAnswer(httpx.ConnectError):
    """An answer without the proof of a server of the store: taken for none (`PeerTransport`)."""


def socket_proof(
    key: ClusterKey, to: str, target: str
) -> tuple[dict[str, str], Callable[[Mapping[str, str]], None]]:
    """A `RemoteConnection`'s `Prove` for `ctx.client`'s sockets to the server of registry
    `to`: its handshake signed, and the answer's proof checked (`ProofError`)."""
    proof, nonce = key.sign_request(to, "", "GET", target)

    def check(headers: Mapping[str, str]) -> None:
        key.check_answer(headers.get(PROOF_HEADER), nonce, 101)

    return {PROOF_HEADER: proof}, check


class PeerTransport(httpx.AsyncBaseTransport):
    """The transport of `ctx.client`'s calls to the server owning another actor (registry
    `to`): each request signed with the cluster secret for that registry and its body, with no
    token, and an answer without the proof of a server
    of the store taken for an answer never received (`UnprovenAnswer`, an `httpx.ConnectError`,
    which the client retries, then reports as `ServerUnreachable`): a process squatting the
    owner's address ran nothing of the call, learns no token and fools no actor."""

    def __init__(self, key: ClusterKey, to: str) -> None:
        self._key = key
        self._to = to
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        query = request.url.query.decode("latin-1")
        target = f"{request.url.path}?{query}" if query else request.url.path
        body = await request.aread()
        proof, nonce = self._key.sign_request(self._to, "", request.method, target, body)
        request.headers[PROOF_HEADER] = proof
        response = await self._inner.handle_async_request(request)
        try:
            self._key.check_answer(response.headers.get(PROOF_HEADER), nonce, response.status_code)
        except ProofError as e:
            await response.aclose()
            log.warning("call to %s: answer not taken: %s", request.url.netloc.decode(), e)
            raise UnprovenAnswer(f"no server of this store answered: {e}") from None
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
