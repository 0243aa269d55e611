"""What a workflow handle needs from the registry it reaches its actor through, as protocols:
the handle depends on these and not on `Registry`, which creates handles, so imports run one way
(registry -> handle -> this)."""

from __future__ import annotations

from typing import Any, Protocol

from pagekv.actor.definition import ActorDefinition
from pagekv.actor.workflow.runner import Runner


class WorkflowInstance(Protocol):
    """A live instance as the handle sees it: the runner of its workflow, if it has one."""

    @property
    def workflow(self) -> Runner | None: ...


class HandleRegistry(Protocol):
    """The actor's definition (to refuse an actor without a workflow before waking it), its live
    instance (woken or created), and the registry's way of sending it a message."""

    def definition(self, name: str) -> ActorDefinition: ...

    async def instance(
        self, name: str, key: str, *, create: bool, input: Any
    ) -> WorkflowInstance: ...

    async def send(
        self, name: str, key: str, queue: str, body: Any, *, create: bool, input: Any
    ) -> int: ...
