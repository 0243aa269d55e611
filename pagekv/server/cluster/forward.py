"""Forwarding a call to the server whose registry owns the actor, so that every call of an actor
runs on its one awake instance, wherever the call arrived.

The receiving server sends the request on as it came: method, path, query, body bytes and every
end-to-end header (the owner checks the same body limit, and encodes its answer as the client
asked), with `X-Pagekv-Forwarded: <sender> <owner> <lease end>` naming the sending registry, the
owner it meant and the end of the owner's lease as the sender read it. Not sent on: the
hop-by-hop headers (RFC 9110 §7.6.1), `Host`, `Content-Length` and `Expect` (of this
connection) and the `X-Pagekv-*` a client sent (only servers set those). The server's token
is not among them (`BearerAuth` took it off the request): the call is signed with the cluster
secret instead, and an answer is relayed only if it proves it came from a server of the store
(`peer_auth.py`), so a process that is not one learns no token and fools no client.
The owner relays nothing further: a forwarded call is served there or refused with 503
`not_owner` and `X-Pagekv-Refused: not_owner`, never forwarded again, so calls cannot loop. One
that arrives after that lease end is refused too: its sender may have given up on it
(`owner_timeout`) and the client retried, so running it late could apply it twice. The client
gets the owner's answer as it arrives (status, end-to-end headers, repeats kept, and the body,
streamed with bounded memory, however long it is or lasts); only `Date` is this server's.

`route` runs a call locally unless the registry says another registry owns the actor
(`OwnedElsewhere`, raised before anything was woken or written), and then forwards it. An owner
that cannot be reached (nothing was sent) or that refuses (`not_owner`: it just let the actor
go) is routed again after a short pause, since the lease entry moves on; past
`forward_wait_s`, the answer is a retryable 503 `owner_unreachable` with `written: false`. A
refusal is known by its header alone, which the owner sets on its refusals and removes from the
answers of raw HTTP handlers: a handler's answer, whatever its body, is relayed, once. An owner
that took the request but did not begin its answer in time (before its lease ran out, and
within `forward_timeout_s`, which covers a short answer's body too) makes a 503 `owner_timeout`
whose `written` is unknown: the call may have run there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import httpcore
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from pagekv.actor import NotOwner, OwnedElsewhere, Registry
from pagekv.actor.directory.leases import Forwarded, Owner
from pagekv.actor.request_writes import Writes
from pagekv.protocol import ErrorCode
from pagekv.server.cluster.peer_auth import (
    FORWARDED_HEADER,
    PROOF_HEADER,
    ClusterKey,
    ProofError,
    call_target,
)
from pagekv.server.config import ServerConfig
from pagekv.server.http_errors import HttpError
from pagekv.server.request_io import error_answer

REFUSED_HEADER = "x-pagekv-refused"
"""On a server's refusal of a forwarded call (`not_owner`), and nowhere else."""
OWN_HEADER_PREFIX = b"x-pagekv-"
"""Headers the servers set for each other: never taken from a client or a raw handler."""
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_WHOLE_BYTES = 64 * 1024
"""An answer of known length up to this is relayed in one piece (see `_relay`)."""
_FIRST_PAUSE_S = 0.02
_LONGEST_PAUSE_S = 0.25
log = logging.getLogger("pagekv.server")


@dataclass(frozen=True)
class _Unreached:
    """The owner could not be reached, or refused the call: nothing was written."""

    why: str


class Forwarder:
    """The HTTP client one server forwards calls with (its connections are pooled per owner).
    Idle connections are dropped after `forward_keepalive_s`, before the owner's server would
    close them (uvicorn: 5 s), and an owner that stops drains for longer than that first
    (`app.drain`), so a call is not sent on a connection the owner is closing, where it could not
    tell whether the call arrived."""

    def __init__(self, config: ServerConfig, registry: Registry) -> None:
        self._config = config
        self._registry = registry
        self.key = ClusterKey(config.cluster_secret)
        self._http = httpcore.AsyncConnectionPool(
            max_connections=config.max_connections,
            max_keepalive_connections=100,
            keepalive_expiry=config.forward_keepalive_s,
        )
        self._timeouts = {  # the answer's beginning is awaited under forward_timeout_s
            "connect": config.forward_connect_s,
            "read": None,
            "write": config.forward_timeout_s,
            "pool": config.forward_connect_s,
        }

    async def aclose(self) -> None:
        await self._http.aclose()

    async def route(
        self,
        request: Request,
        body: bytes,
        serve: Callable[[Forwarded | None], Awaitable[Response]],
    ) -> Response:
        """`serve` the call here, or forward it to its actor's owner (see the module)."""
        via = forwarded(request)
        if via is not None:
            return await _served_or_refused(request, via, serve)
        deadline = time.monotonic() + self._config.forward_wait_s
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return await serve(None)
            except OwnedElsewhere as e:
                aid, owner = e.actor_id, e.owner
            outcome = await self._send(request, body, aid, owner)
            if isinstance(outcome, Response):
                self._registry.counters["forwarded"] += 1
                return outcome
            self._registry.placement.forget_owner(aid)
            if time.monotonic() + pause > deadline:
                lease = max(0.0, owner.until - time.time())
                log.warning(
                    "forward to %s: the owner of %s %s for %g s (lease %.1f s more)",
                    owner.address,
                    aid,
                    outcome.why,
                    self._config.forward_wait_s,
                    lease,
                )
                raise HttpError(
                    503,
                    ErrorCode.OWNER_UNREACHABLE,
                    f"the actor is owned by another server of this store under a lease of "
                    f"{lease:.1f} s more, which {outcome.why} for "
                    f"{self._config.forward_wait_s:g} s; nothing was written, retry",
                    writes=Writes(),
                )
            await anyio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)

    async def _send(
        self, request: Request, body: bytes, aid: str, owner: Owner
    ) -> Response | _Unreached:
        assert owner.address is not None, "the registry forwards only to owners with an address"
        headers = outgoing_headers(request, owner.address, body)
        forwarding = f"{self._registry.id} {owner.registry} {owner.until!r}"
        proof, nonce = self.key.sign_request(
            owner.registry, forwarding, request.method, call_target(request.scope), body
        )
        headers.append((FORWARDED_HEADER.encode(), forwarding.encode()))
        headers.append((PROOF_HEADER.encode(), proof.encode()))
        target = request.scope["raw_path"] or request.scope["path"].encode()
        if request.scope["query_string"]:
            target += b"?" + request.scope["query_string"]
        sent = self._http.handle_async_request(
            httpcore.Request(
                request.method,
                owner.address.rstrip("/").encode() + target,
                headers=headers,
                content=body,
                extensions={"timeout": self._timeouts},
            )
        )
        try:
            with anyio.fail_after(self._config.forward_timeout_s):
                response = await self._unless_lease_lost(sent, aid, owner)
                if not self._proven(response, nonce, owner):
                    await response.aclose()
                    return _Unreached("answered without proof that it is a server of this store")
                if _refused(response):
                    await response.aclose()
                    return _Unreached("refused the call as not its owner any more")
                return await _relay(response, owner.address)
        except (httpcore.ConnectError, httpcore.ConnectTimeout, httpcore.PoolTimeout) as e:
            log.debug("forward to %s: not reached: %r", owner.address, e)
            return _Unreached("could not be reached")
        except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError) as e:
            raise _no_answer(owner, repr(e)) from e
        except TimeoutError as e:
            why = f"none began within {self._config.forward_timeout_s:g} s"
            raise _no_answer(owner, why) from e
        except _LeaseLost as e:
            raise _no_answer(owner, str(e)) from e

    def _proven(self, response: httpcore.Response, nonce: str, owner: Owner) -> bool:
        """Whether the answer to the call `nonce` came from a server of the store: nothing
        of one that did not is relayed (`peer_auth.py`)."""
        proofs = [v for k, v in response.headers if k.lower() == PROOF_HEADER.encode()]
        try:
            self.key.check_answer(
                proofs[0].decode("latin-1") if proofs else None, nonce, response.status
            )
        except ProofError as e:
            log.warning(
                "forward to %s: answer not relayed: %s (a process that is no server of this "
                "store listens there, or one with another --cluster-secret)",
                owner.address,
                e,
            )
            return False
        return True

    async def _unless_lease_lost(
        self, sent: Awaitable[httpcore.Response], aid: str, owner: Owner
    ) -> httpcore.Response:
        """The owner's answer, unless its lease on the actor runs out (or passes to another
        instance) first: an owner that stopped (SIGSTOP, a stalled machine) may have accepted
        the connection and never answer, and a wait longer than its lease helps nobody, since
        the actor is served elsewhere after it (`_LeaseLost`)."""
        answer: httpcore.Response | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def send() -> None:
                nonlocal answer, failure
                try:
                    answer = await sent
                except Exception as e:
                    failure = e
                tg.cancel_scope.cancel()

            tg.start_soon(send)
            await self._watch(aid, owner)
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if answer is None:
            raise _LeaseLost("its lease on the actor ran out meanwhile")
        return answer

    async def _watch(self, aid: str, owner: Owner) -> None:
        """Return once `owner` no longer holds a live lease on `aid`."""
        ownership, interval = self._registry.ownership, min(1.0, self._registry.lease / 4)
        while True:
            await anyio.sleep(max(interval, owner.until - time.time()))
            now = time.time()
            held = await anyio.to_thread.run_sync(ownership.owner, aid, now)
            if held is None or held.registry != owner.registry:
                return
            if owner.generation >= 0 and held.generation != owner.generation:
                return  # (-1: a registry sent the actor to wake there, whatever generation)
            owner = held


class _LeaseLost(Exception):
    """The owner's lease ran out while a forwarded call waited for its answer."""


def forwarded(request: Request) -> Forwarded | None:
    """The forwarding a request carries, or None; a malformed header is a 400."""
    value = request.headers.get(FORWARDED_HEADER)
    if value is None:
        return None
    parts = value.split(" ")
    until = _number(parts[2]) if len(parts) == 3 and all(parts) else None
    if until is None:
        raise HttpError(
            400,
            ErrorCode.INVALID_PARAMETER,
            f"{FORWARDED_HEADER} must be '<sender registry> <owner registry> <lease end>'",
        )
    return Forwarded(parts[0], parts[1], until)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _no_answer(owner: Owner, why: str) -> HttpError:
    """The client's answer names neither the owner's address nor the error: both go to the
    log, for the operator."""
    log.warning("forward to %s: the owner took the call but sent no answer: %s", owner.address, why)
    return HttpError(
        503,
        ErrorCode.OWNER_TIMEOUT,
        "the actor's owner (another server of this store) took the call but sent no answer; "
        "it may have run there",
        writes=Writes(unknown=True),
    )


def end_to_end(
    headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """`headers` (names lower-cased, order and repeats kept) without the hop-by-hop ones, which
    are about one connection (RFC 9110 §7.6.1: those listed here and those `Connection` names),
    and without those in `dropped`."""
    pairs = [(k.lower(), v) for k, v in headers]
    listed = {t.strip().lower() for k, v in pairs if k == b"connection" for t in v.split(b",")}
    skipped = _HOP_BY_HOP | listed | dropped
    return [(k, v) for k, v in pairs if k not in skipped]


def without_own_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if not k.lower().startswith(OWN_HEADER_PREFIX)]


def outgoing_headers(request: Request, address: str, body: bytes) -> list[tuple[bytes, bytes]]:
    """The headers a call is forwarded with to the server at `address` (see the module), but
    `X-Pagekv-Forwarded`. A body is framed by its length when it has one or the client framed
    it, so that the owner's handler sees what it would see called directly."""
    sent = end_to_end(request.scope["headers"], frozenset({b"host", b"content-length", b"expect"}))
    headers = [(b"host", urlsplit(address).netloc.encode()), *without_own_headers(sent)]
    framed = any(
        k.lower() in (b"content-length", b"transfer-encoding") for k, _ in request.scope["headers"]
    )
    if body or framed:
        headers.append((b"content-length", str(len(body)).encode()))
    return headers


async def _served_or_refused(
    request: Request, via: Forwarded, serve: Callable[[Forwarded | None], Awaitable[Response]]
) -> Response:
    """A forwarded call served here, or refused as `not_owner`, with `REFUSED_HEADER` for its
    sender to route it again: when it came after the lease its sender saw, or when the registry
    refused it (`NotOwner`, raised before anything ran, as the cause of the route's `HttpError`).
    No other answer carries that header, whatever its body."""
    if time.time() > via.until:
        late = HttpError(
            503,
            ErrorCode.NOT_OWNER,
            "this forwarded call arrived after the lease its sender saw had run out "
            "(this server was stopped or stalled, and its sender may have given up)",
            writes=Writes(),
        )
        return _refusal(request, late)
    try:
        return await serve(via)
    except HttpError as e:
        if not isinstance(e.__cause__, NotOwner):
            raise
        return _refusal(request, e)


def _refusal(request: Request, error: HttpError) -> Response:
    answer = error_answer(request, error)
    answer.headers[REFUSED_HEADER] = "not_owner"
    return answer


def _refused(response: httpcore.Response) -> bool:
    """Whether the owner refused the call: by its refusal header, never by the body (which a
    raw handler chooses)."""
    values = [v for k, v in response.headers if k.lower() == REFUSED_HEADER.encode()]
    return response.status == 503 and values == [b"not_owner"]


async def _relay(response: httpcore.Response, address: str) -> Response:
    """The client's answer from the owner's: its status and end-to-end headers (`Date` aside:
    this server dates what it sends), and its body, read whole when its length is known and at
    most `_WHOLE_BYTES` (an action's answer: cheaper than a stream), else streamed."""
    headers = end_to_end(response.headers, frozenset({b"date", PROOF_HEADER.encode()}))
    lengths = [v for k, v in headers if k == b"content-length"]
    if len(lengths) == 1 and lengths[0].isdigit() and int(lengths[0]) <= _WHOLE_BYTES:
        try:
            answer = Response(await response.aread(), status_code=response.status)
        finally:
            await response.aclose()
        answer.raw_headers = headers
        return answer
    return _Relayed(response, headers, address)


class _Relayed(StreamingResponse):
    """The owner's answer (`response`, with `headers`), relayed as it arrives: its body piece
    by piece as the client takes it, so at most a few pieces are held. The owner's response is
    closed however this ends (read whole, the client gone, the owner broken off); one whose body
    broke off ends the client's answer with `AnswerBrokenOff` (its connection is dropped, not
    the body ended as if whole)."""

    def __init__(
        self, response: httpcore.Response, headers: list[tuple[bytes, bytes]], address: str
    ) -> None:
        super().__init__(self._pieces(), status_code=response.status)
        self.raw_headers = headers
        self._response = response
        self._address = address

    async def _pieces(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._response.aiter_stream():
                yield piece
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.TimeoutException) as e:
            raise AnswerBrokenOff(
                f"the owner at {self._address} broke off its answer: {e!r}"
            ) from e

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._response.aclose()


class AnswerBrokenOff(Exception):
    """The owner's answer to a forwarded call broke off after it began (the owner died, or its
    connection failed): the client's answer is cut off too."""
