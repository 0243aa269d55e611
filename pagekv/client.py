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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from pagekv.actor import (
    ActionNotFound,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    InvalidArguments,
    UnknownActor,
)
from pagekv.server.protocol import CBOR, JSON, ErrorCode, decode, encode

_ACTOR_ERRORS: dict[str, type[Exception]] = {
    ErrorCode.UNKNOWN_ACTOR: UnknownActor,
    ErrorCode.UNKNOWN_ACTION: ActionNotFound,
    ErrorCode.ACTOR_NOT_FOUND: ActorNotFound,
    ErrorCode.ACTOR_EXISTS: ActorExists,
    ErrorCode.ACTOR_TAKEN_OVER: ActorTakenOver,
    ErrorCode.ACTOR_STOPPED: ActorStopped,
    ErrorCode.INVALID_ARGUMENTS: InvalidArguments,
}


class RemoteError(Exception):
    """The server answered with an error other than the runtime's own (see `ErrorCode`)."""

    def __init__(self, status: int, code: str, message: str, limit: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.limit = limit


class ServerUnreachable(ConnectionError):
    """The server could not be reached (nothing was sent), or its answer never came (the call
    may have run: read before you retry a write); names the URL."""


def _path(*parts: str) -> str:
    """A URL path of `parts`, each escaped whole: a name with `#`, `%` or `/` in it still
    reaches the server as that name (which then answers for it, e.g. with `ActionNotFound`)."""
    return "".join("/" + quote(part, safe="") for part in parts)


class HttpClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"accept": CBOR, "content-type": CBOR}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )

    async def request(
        self, method: str, path: str, params: dict[str, str], body: dict[str, Any] | None = None
    ) -> Any:
        """One request; returns the decoded answer or raises the error it carries."""
        content = encode(body, CBOR) if body is not None else None
        try:
            response = await self._http.request(method, path, params=params, content=content)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ServerUnreachable(
                f"cannot reach the pagekv server at {self._http.base_url}: {e or type(e).__name__}"
                "; nothing was sent"
            ) from e
        except httpx.TransportError as e:
            raise ServerUnreachable(
                f"no answer from the pagekv server at {self._http.base_url} "
                f"({type(e).__name__}: {e}); the call may have run"
            ) from e
        media_type = response.headers.get("content-type", "").split(";")[0]
        payload = (
            decode(response.content, media_type)
            if response.content and media_type in (CBOR, JSON)
            else None
        )
        if response.is_success:
            return payload
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        code = error.get("code", "unknown")
        message = error.get("message", response.text)
        kind = _ACTOR_ERRORS.get(code)
        if kind is not None:
            raise kind(message)
        raise RemoteError(response.status_code, code, message, error.get("limit"))

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


class ActorHandle:
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

    def __getattr__(self, action: str) -> Callable[..., Awaitable[Any]]:
        if action.startswith("_"):
            raise AttributeError(action)

        async def invoke(*args: Any, **kwargs: Any) -> Any:
            return await self.call(action, *args, **kwargs)

        return invoke
