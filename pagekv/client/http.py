"""The Python client of a `pagekv serve` server, `HttpClient`: the same shape as the in-process
`pagekv.actor.Client` (a registry's), under a name of its own so that code says which it holds.

    async with HttpClient("http://127.0.0.1:6420", token=...) as client:
        room = client.get_or_create("counter", "room-1", input={"start": 5})
        await room.increment(2)

A handle is an address (name, key, get or get-or-create), never a connection to an instance:
every call is resolved by the server afresh, so a handle outlives sleeps, wakes, takeovers and
even destroy (a `get` handle then raises `ActorNotFound`; a `get_or_create` handle creates the
actor anew). Bodies travel as CBOR so bytes and every other CBOR value round-trip exactly.
Errors the runtime defines come back as the same exception types (`ActorNotFound`,
`ActionNotFound`, `InvalidArguments`, ...); any other failure raises `RemoteError` with the
server's code.

A call the server did not run is sent again, for up to `retry_for` seconds (`RETRY_FOR_S`),
waiting 50-100 ms at first and twice as long each time up to 1 s (each wait jittered, so clients
refused together do not come back together). Only answers that say nothing ran or was written
are retried:

- a 503 with `written: false` and a code documented as nothing-written (`RETRIED_CODES`: a
  failover or hand-off under way, a registry stopping, a store that refused the commit);
- uvicorn's own plain-text 503 beyond `--max-connections`, sent before the app saw the request;
- a connection that could not be opened (`ConnectError`, `ConnectTimeout`): nothing was sent.

Never retried: `owner_timeout` (the owner may have run the call), `written` true or null, any
other error, and a failure after the request went out (a read timeout: the call may have run).
A `Retry-After` in seconds is the least wait; one that reaches past the budget ends the retries
at once. Past the budget the last error is raised, as it would be without retries.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import quote

import anyio
import httpx

from pagekv.actor import (
    ActionNotFound,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    CallCycle,
    InvalidArguments,
    UnknownActor,
    call_chain,
)
from pagekv.actor.directory.leases import LEASE_S
from pagekv.actor.handle_base import CallsByName
from pagekv.client.websocket import RemoteConnection
from pagekv.protocol import CBOR, JSON, ErrorCode, decode, encode

_ACTOR_ERRORS: dict[str, type[Exception]] = {
    ErrorCode.UNKNOWN_ACTOR: UnknownActor,
    ErrorCode.UNKNOWN_ACTION: ActionNotFound,
    ErrorCode.ACTOR_NOT_FOUND: ActorNotFound,
    ErrorCode.ACTOR_EXISTS: ActorExists,
    ErrorCode.ACTOR_TAKEN_OVER: ActorTakenOver,
    ErrorCode.ACTOR_STOPPED: ActorStopped,
    ErrorCode.INVALID_ARGUMENTS: InvalidArguments,
    ErrorCode.CALL_CYCLE: CallCycle,
}

RETRY_FOR_S = 1.5 * LEASE_S
"""How long a call is retried by default: longer than the default lease, so a call refused while
the owner of its actor died is still retried once the lease has run out and another registry
has taken the actor over (a server given a longer `lease_s` wants a longer `retry_for`)."""
RETRIED_CODES = frozenset(
    {
        ErrorCode.ACTOR_TAKEN_OVER,
        ErrorCode.ACTOR_STOPPED,
        ErrorCode.NOT_OWNER,
        ErrorCode.OWNER_UNREACHABLE,
        ErrorCode.STORAGE_UNAVAILABLE,
    }
)
"""The codes of the 503s retried when they say `written: false`. Not `owner_timeout`: the owner
may have run the call, whatever the server that forwarded it knows of its writes."""
_FIRST_WAIT_S = 0.1
_MAX_WAIT_S = 1.0
_UVICORN_REFUSAL = b"Service Unavailable"


class RemoteError(Exception):
    """The server answered with an error other than the runtime's own (see `ErrorCode`)."""

    def __init__(self, status: int, code: str, message: str, limit: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.limit = limit


class ServerUnreachable(ConnectionError):
    """The server could not be reached (nothing was sent; raised once the retries are spent), or
    its answer never came (the call may have run: read before you retry a write); names the
    URL."""


def _media_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";")[0]


def _payload(response: httpx.Response) -> Any:
    """The decoded body; None for an empty one, or one neither CBOR nor JSON."""
    media_type = _media_type(response)
    if response.content and media_type in (CBOR, JSON):
        return decode(response.content, media_type)
    return None


def _error_of(response: httpx.Response) -> dict[str, Any]:
    """The `error` map of a failed answer; empty when the body has none."""
    payload = _payload(response)
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else {}


def _did_not_run(response: httpx.Response, error: dict[str, Any]) -> bool:
    """Whether a failed answer says the call did not run (or wrote nothing), so that sending it
    again is safe. uvicorn's refusal beyond `--max-connections` (`limit_concurrency`) replaces
    the app's answer, so it has no pagekv body: it is recognised exactly, plain text and all, so
    that a 503 of a proxy in front, which may have forwarded the call, is not taken for it."""
    if response.status_code != 503:
        return False
    if _media_type(response) == "text/plain" and response.content == _UVICORN_REFUSAL:
        return True
    return error.get("code") in RETRIED_CODES and error.get("written") is False


def _retry_after(response: httpx.Response) -> float | None:
    """The answer's `Retry-After` in seconds; None without one, or for a date (not sent by
    pagekv; the client's own backoff applies)."""
    value = response.headers.get("retry-after", "").strip()
    return float(value) if value.isascii() and value.isdigit() else None


def _path(*parts: str) -> str:
    """A URL path of `parts`, each escaped whole: a name with `#`, `%` or `/` in it still
    reaches the server as that name (which then answers for it, e.g. with `ActionNotFound`)."""
    return "".join("/" + quote(part, safe="") for part in parts)


def raise_error(error: dict[str, Any], status: int = 0, text: str = "") -> NoReturn:
    """Raise the exception of a pagekv error answer: the runtime's own type where it has one,
    else `RemoteError`."""
    code = error.get("code", "unknown")
    message = error.get("message", text)
    kind = _ACTOR_ERRORS.get(code)
    if kind is not None:
        raise kind(message)
    raise RemoteError(status, code, message, error.get("limit"))


class HttpClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retry_for: float = RETRY_FOR_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`retry_for`: the seconds a call the server did not run is retried for (0: never; see
        the module's docstring). `timeout` is httpx's, for each attempt."""
        if not retry_for >= 0:
            raise ValueError(f"retry_for must be >= 0 seconds, got {retry_for}")
        self.retry_for = retry_for
        self.retries = 0
        """How many times a call was sent again, over this client's life."""
        # The retries' clock and sleep, which a test may replace to see the waits asked for.
        self._clock: Callable[[], float] = time.monotonic
        self._sleep: Callable[[float], Awaitable[None]] = anyio.sleep
        headers = {"accept": CBOR, "content-type": CBOR}
        self._token = token
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )

    async def request(
        self, method: str, path: str, params: dict[str, str], body: dict[str, Any] | None = None
    ) -> Any:
        """One call, sent again while its answer says it did not run and `retry_for` lasts;
        returns the decoded answer or raises the error the last attempt carries.

        A loop of its own, not stamina's or tenacity's: its budget runs on a clock a test can
        replace, its last wait is cut so the last attempt comes at the budget's end, and a
        `Retry-After` is a least wait that ends the retries if it reaches past the budget;
        stamina does none of that, and tenacity would take this loop as four callbacks."""
        content = encode(body, CBOR) if body is not None else None
        chain = call_chain.current()  # made from an action: its server refuses a cycle
        headers = {call_chain.HEADER: call_chain.encode(chain)} if chain else None
        give_up_at = self._clock() + self.retry_for
        retried = 0
        while True:
            try:
                response = await self._http.request(
                    method, path, params=params, content=content, headers=headers
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if await self._wait_to_retry(retried, None, give_up_at):
                    retried += 1
                    continue
                raise ServerUnreachable(
                    f"cannot reach the pagekv server at {self._http.base_url}: "
                    f"{e or type(e).__name__}; nothing was sent"
                ) from e
            except httpx.TransportError as e:
                raise ServerUnreachable(
                    f"no answer from the pagekv server at {self._http.base_url} "
                    f"({type(e).__name__}: {e}); the call may have run"
                ) from e
            if response.is_success:
                return _payload(response)
            error = _error_of(response)
            if _did_not_run(response, error) and await self._wait_to_retry(
                retried, _retry_after(response), give_up_at
            ):
                retried += 1
                continue
            raise_error(error, response.status_code, response.text)

    async def _wait_to_retry(
        self, retried: int, retry_after: float | None, give_up_at: float
    ) -> bool:
        """Wait before sending a call again for the `retried + 1`-th time, and count it; False,
        without waiting, once the budget is spent or the server asks for a longer wait than is
        left of it. The last wait is cut to what is left, so the last attempt is at the end."""
        left = give_up_at - self._clock()
        if left <= 0 or (retry_after is not None and retry_after > left):
            return False
        # The exponent is bounded: 2**n of a long budget's retries would overflow a float.
        longest = min(_MAX_WAIT_S, _FIRST_WAIT_S * 2 ** min(retried, 10))
        wait = max(random.uniform(longest / 2, longest), retry_after or 0.0)
        self.retries += 1
        await self._sleep(min(wait, left))
        return True

    def get(self, name: str, key: str) -> ActorHandle:
        """A handle to an existing actor (calls raise `ActorNotFound` if it does not exist)."""
        return ActorHandle(self, name, key, create=False, input=None)

    def get_or_create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        """A handle whose calls create the actor (with `input`) if it does not exist."""
        return ActorHandle(self, name, key, create=True, input=input)

    async def create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        """Create a new actor (`ActorExists` if it exists) and return a `get` handle to it."""
        await self.request("POST", _path("actors", name), {"key": key}, {"input": input})
        return self.get(name, key)

    async def destroy(self, name: str, key: str) -> None:
        await self.request("DELETE", _path("actors", name), {"key": key})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class ActorHandle(CallsByName):
    """Calls actions of one actor by name over HTTP; resolved by the server on every call."""

    def __init__(
        self, client: HttpClient, name: str, key: str, *, create: bool, input: Any
    ) -> None:
        self._client = client
        self.name = name
        self.key = key
        self._create = create
        self._input = input

    def _address(self) -> tuple[dict[str, str], dict[str, Any]]:
        params = {"key": self.key, "mode": "get_or_create" if self._create else "get"}
        return params, {"input": self._input} if self._create else {}

    async def call(self, action: str, *args: Any, **kwargs: Any) -> Any:
        params, body = self._address()
        answer = await self._client.request(
            "POST",
            _path("actors", self.name, "actions", action),
            params,
            {**body, "args": list(args), "kwargs": kwargs},
        )
        return answer["result"]

    async def send(self, queue: str, body: Any) -> int:
        """Append a message to the actor's queue `queue`; returns the message id."""
        params, fields = self._address()
        answer = await self._client.request(
            "POST",
            _path("actors", self.name, "queues", queue),
            params,
            {**fields, "body": body},
        )
        return answer["id"]

    def connect(self, params: Any = None) -> RemoteConnection:
        """A WebSocket connection to the actor (`async with handle.connect(params) as conn`),
        which reconnects by itself (`pagekv.client.websocket`)."""
        client = self._client
        return RemoteConnection(
            str(client._http.base_url),
            client._token,
            self.name,
            self.key,
            params,
            create=self._create,
            input=self._input,
            raise_error=raise_error,
        )
