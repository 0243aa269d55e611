"""The in-process client of a running registry (`Client`, `ActorHandle`), and how it reaches the
actors another registry owns (`RemoteCalls`, which a server provides)."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from pagekv.actor.directory.leases import Owner
from pagekv.actor.errors import OwnedElsewhere
from pagekv.actor.handle_base import CallsByName
from pagekv.actor.realtime.client_connection import LocalConnection, Relay
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.workflow.handle import HandleRegistry, WorkflowHandle, WorkflowInstance


class RemoteCalls(Relay, Protocol):
    """How a registry's client reaches an actor another registry owns (its server forwards):
    calls, queue sends and (`Relay`) connections."""

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
    ) -> Any: ...

    async def send(
        self,
        owner: Owner,
        name: str,
        key: str,
        queue: str,
        body: Any,
        *,
        create: bool,
        input: Any,
    ) -> int: ...


class ClientHost(HandleRegistry, Protocol):
    """What the client needs of its registry (`Registry`, which creates clients): the actors'
    definitions, calls, sends, creates and destroys by (name, key), its connections' hub, and
    the way to actors owned elsewhere, if it has one."""

    remote: RemoteCalls | None
    hub: Hub

    async def instance(
        self, name: str, key: str, *, create: bool, must_be_new: bool = False, input: Any = None
    ) -> WorkflowInstance: ...

    async def call(
        self,
        name: str,
        key: str,
        action: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        create: bool,
        input: Any = None,
    ) -> Any: ...

    async def destroy(self, name: str, key: str) -> None: ...


R = TypeVar("R", bound=ClientHost)


class ActorHandle(CallsByName):
    """Calls actions of one actor by name; re-resolves the actor on every call. An actor that
    another registry owns is reached through `Registry.remote` when the registry has one (a
    server's: `ctx.client` across hosts), else `OwnedElsewhere` is raised."""

    def __init__(self, registry: ClientHost, name: str, key: str, *, create: bool, input: Any):
        self._registry = registry
        self.name = name
        self.key = key
        self._create = create
        self._input = input

    async def call(self, action: str, *args: Any, **kwargs: Any) -> Any:
        registry, create, input = self._registry, self._create, self._input
        try:
            return await registry.call(
                self.name, self.key, action, args, kwargs, create=create, input=input
            )
        except OwnedElsewhere as e:
            if registry.remote is None:
                raise
            return await registry.remote.call(
                e.owner, self.name, self.key, action, args, kwargs, create=create, input=input
            )

    async def send(self, queue: str, body: Any) -> int:
        """Append a message to the actor's queue `queue`; returns the message id."""
        registry, create, input = self._registry, self._create, self._input
        try:
            return await registry.send(self.name, self.key, queue, body, create=create, input=input)
        except OwnedElsewhere as e:
            if registry.remote is None:
                raise
            return await registry.remote.send(
                e.owner, self.name, self.key, queue, body, create=create, input=input
            )

    def connect(self, params: Any = None) -> LocalConnection:
        """A connection to the actor (`async with handle.connect(params) as conn`): actions,
        subscriptions and events (`pagekv.actor.realtime.client_connection`)."""
        return LocalConnection(
            self._registry.hub,
            self.name,
            self.key,
            params,
            create=self._create,
            input=self._input,
            relay=self._registry.remote,
        )

    @property
    def workflow(self) -> WorkflowHandle:
        """The actor's durable workflow (its run handler)."""
        return WorkflowHandle(
            self._registry, self.name, self.key, create=self._create, input=self._input
        )


class Client(Generic[R]):
    """In-process client of a running registry."""

    def __init__(self, registry: R) -> None:
        self.registry = registry

    def get(self, name: str, key: str) -> ActorHandle:
        self.registry.definition(name)
        return ActorHandle(self.registry, name, key, create=False, input=None)

    def get_or_create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        self.registry.definition(name)
        return ActorHandle(self.registry, name, key, create=True, input=input)

    async def create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        await self.registry.instance(name, key, create=True, must_be_new=True, input=input)
        return ActorHandle(self.registry, name, key, create=False, input=None)

    async def destroy(self, name: str, key: str) -> None:
        await self.registry.destroy(name, key)
