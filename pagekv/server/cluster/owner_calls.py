"""`ctx.client` across servers: the calls an actor makes to actors another server owns.

A server sets its registry's `remote` to an `OwnerCalls`: a call of `ctx.client` that finds its
actor owned by another registry of the store (`OwnedElsewhere`, raised before anything ran)
goes to that registry's server over HTTP, signed with the cluster secret rather than with a
token (`peer_auth.PeerTransport`: an answer of a process that is no server of the store is never
taken), through the same client users have (`HttpClient`, whose retries cover a hand-off under
way), and a connection goes there over a WebSocket, signed and checked alike
(`peer_auth.socket_proof`). The owner serves it as any call, so it is routed afresh there if the
actor moved meanwhile.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import httpx

from pagekv.actor.directory.leases import Owner
from pagekv.actor.realtime.client_connection import ActorConnection
from pagekv.client.http import HttpClient, ServerUnreachable, raise_error
from pagekv.client.websocket import RemoteConnection
from pagekv.server.cluster.peer_auth import ClusterKey, PeerTransport, socket_proof
from pagekv.server.config import ServerConfig

log = logging.getLogger("pagekv.server")


def _unnamed(error: ServerUnreachable, owner: Owner, name: str, key: str) -> ServerUnreachable:
    """`error` without the peer's address (an actor's code may pass its message on to its own
    client, and no internal address may reach one); the address goes to the log."""
    log.warning("ctx.client call to %s/%s at %s: %s", name, key, owner.address, error)
    ran = (
        "it did not run"
        if isinstance(error.__cause__, httpx.ConnectError | httpx.ConnectTimeout)
        else "it may have run"
    )
    return ServerUnreachable(f"cannot reach the server that runs actor {name}/{key}; {ran}")


class OwnerCalls:
    def __init__(self, config: ServerConfig) -> None:
        self._key = ClusterKey(config.cluster_secret)
        self._timeout = config.forward_timeout_s
        self._clients: dict[tuple[str, str], HttpClient] = {}

    def _handle(self, owner: Owner, name: str, key: str, create: bool, input: Any) -> Any:
        assert owner.address is not None, "the registry forwards only to owners with an address"
        client = self._clients.get((owner.address, owner.registry))
        if client is None:
            transport = PeerTransport(self._key, owner.registry)
            client = HttpClient(owner.address, timeout=self._timeout, transport=transport)
            self._clients[(owner.address, owner.registry)] = client
        return client.get_or_create(name, key, input=input) if create else client.get(name, key)

    async def call(
        self,
        owner: Owner,
        name: str,
        key: str,
        action: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        create: bool,
        input: Any,
    ) -> Any:
        try:
            handle = self._handle(owner, name, key, create, input)
            return await handle.call(action, *args, **kwargs)
        except ServerUnreachable as e:
            raise _unnamed(e, owner, name, key) from e

    async def send(
        self, owner: Owner, name: str, key: str, queue: str, body: Any, *, create: bool, input: Any
    ) -> int:
        try:
            return await self._handle(owner, name, key, create, input).send(queue, body)
        except ServerUnreachable as e:
            raise _unnamed(e, owner, name, key) from e

    def connection(
        self,
        owner: Owner,
        name: str,
        key: str,
        params: Any,
        *,
        create: bool,
        input: Any,
        sink: ActorConnection,
    ) -> ActorConnection:
        """A WebSocket connection to the owner's server, delivering into `sink`."""
        assert owner.address is not None, "the registry forwards only to owners with an address"
        return RemoteConnection(
            owner.address,
            None,
            name,
            key,
            params,
            create=create,
            input=input,
            raise_error=raise_error,
            sink=sink,
            prove=partial(socket_proof, self._key, owner.registry),
        )

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
