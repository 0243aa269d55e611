"""Forwarding a call to the server whose registry owns the actor, so that every call of an actor
runs on its one awake instance, wherever the call arrived.

The receiving server sends the request on as it came (method, path, query, body bytes,
`Content-Type`, `Accept` and `Authorization`: the owner checks the same token and the same body
limit, and encodes its answer as the client asked), with `X-Pagekv-Forwarded: <sender> <owner>
<lease end>` naming the sending registry, the owner it meant and the end of the owner's lease
as the sender read it. The owner relays nothing further: a forwarded call is served there or
refused with 503 `not_owner`, never forwarded again, so calls cannot loop. One that arrives
after that lease end is refused too: its sender may have given up on it (`owner_timeout`) and
the client retried, so running it late could apply it twice. The client gets the owner's answer
byte for byte.

`route` runs a call locally unless the registry says another registry owns the actor
(`OwnedElsewhere`, raised before anything was woken or written), and then forwards it. An owner
that cannot be reached (nothing was sent) or that refuses (`not_owner`: it just let the actor
go) is routed again after a short pause, since the lease entry moves on; past
`forward_wait_s`, the answer is a retryable 503 `owner_unreachable` with `written: false`. An
owner that took the request but sent no answer in time makes a 503 `owner_timeout` whose
`written` is unknown: the call may have run there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import httpcore
from starlette.requests import Request
from starlette.responses import Response

from pagekv.actor import OwnedElsewhere, Registry, call_chain
from pagekv.actor.ownership import Forwarded, Owner
from pagekv.actor.writes import Writes
from pagekv.server.config import ServerConfig
from pagekv.server.errors import HttpError
from pagekv.server.protocol import CBOR, JSON, BodyError, ErrorCode, decode

FORWARDED_HEADER = "x-pagekv-forwarded"
_PASSED_HEADERS = frozenset(
    {b"content-type", b"accept", b"authorization", call_chain.HEADER.encode()}
)
_RELAYED_HEADERS = frozenset({b"content-type", b"retry-after", b"www-authenticate"})
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
        self._http = httpcore.AsyncConnectionPool(
            max_connections=config.max_connections,
            max_keepalive_connections=100,
            keepalive_expiry=config.forward_keepalive_s,
        )
        self._timeouts = {
            "connect": config.forward_connect_s,
            "read": config.forward_timeout_s,
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
            if time.time() > via.until:
                raise HttpError(
                    503,
                    ErrorCode.NOT_OWNER,
                    "this forwarded call arrived after the lease its sender saw had run out "
                    "(this server was stopped or stalled, and its sender may have given up)",
                    writes=Writes(),
                )
            return await serve(via)
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
            self._registry.forget_owner(aid)
            if time.monotonic() + pause > deadline:
                raise HttpError(
                    503,
                    ErrorCode.OWNER_UNREACHABLE,
                    f"the actor is owned by the server at {owner.address} under a lease of "
                    f"{max(0.0, owner.until - time.time()):.1f} s more, which {outcome.why} "
                    f"for {self._config.forward_wait_s:g} s; nothing was written, retry",
                    writes=Writes(),
                )
            await anyio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)

    async def _send(
        self, request: Request, body: bytes, aid: str, owner: Owner
    ) -> Response | _Unreached:
        assert owner.address is not None, "the registry forwards only to owners with an address"
        headers = [(k, v) for k, v in request.scope["headers"] if k in _PASSED_HEADERS]
        until = repr(owner.until)
        forwarding = f"{self._registry.id} {owner.registry} {until}".encode()
        headers.append((FORWARDED_HEADER.encode(), forwarding))
        target = request.scope["raw_path"] or request.scope["path"].encode()
        if request.scope["query_string"]:
            target += b"?" + request.scope["query_string"]
        sent = self._http.request(
            request.method,
            owner.address.rstrip("/").encode() + target,
            headers=headers,
            content=body,
            extensions={"timeout": self._timeouts},
        )
        try:
            response = await self._unless_lease_lost(sent, aid, owner)
        except (httpcore.ConnectError, httpcore.ConnectTimeout, httpcore.PoolTimeout) as e:
            log.debug("forward to %s: not reached: %r", owner.address, e)
            return _Unreached("could not be reached")
        except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError) as e:
            raise _no_answer(owner, repr(e)) from e
        except _LeaseLost as e:
            raise _no_answer(owner, str(e)) from e
        media_type = _header(response, b"content-type")
        if response.status == 503 and _code(response.content, media_type) == ErrorCode.NOT_OWNER:
            return _Unreached("refused the call as not its owner any more")
        relayed = [(k.lower(), v) for k, v in response.headers if k.lower() in _RELAYED_HEADERS]
        answer = Response(response.content, status_code=response.status)
        if request.method == "HEAD":  # no body came, but the owner said how long it is
            answer.raw_headers = [(k, v) for k, v in answer.raw_headers if k != b"content-length"]
            relayed += [
                (k.lower(), v) for k, v in response.headers if k.lower() == b"content-length"
            ]
        answer.raw_headers[:0] = relayed
        return answer

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
    return HttpError(
        503,
        ErrorCode.OWNER_TIMEOUT,
        f"the actor's owner at {owner.address} took the call but sent no answer ({why}); it "
        "may have run there",
        writes=Writes(unknown=True),
    )


def _header(response: httpcore.Response, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in response.headers if k.lower() == name), "")


def _code(content: bytes, content_type: str) -> str | None:
    """The error code of a pagekv error answer, or None."""
    media_type = content_type.split(";")[0]
    if media_type not in (JSON, CBOR):
        return None
    try:
        payload = decode(content, media_type)
    except BodyError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error.get("code") if isinstance(error, dict) else None
