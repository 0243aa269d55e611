"""`handle.workflow`: reading and steering an actor's workflow from outside the actor."""

from __future__ import annotations

from typing import Any, Protocol

from pagekv.actor.definition import ActorDefinition
from pagekv.actor.errors import ActorError
from pagekv.actor.queue import prepare_message
from pagekv.actor.workflow.history import describe
from pagekv.actor.workflow.runner import Runner, WorkflowStatus


class WorkflowInstance(Protocol):
    """A live instance as the handle sees it: the runner of its workflow, if it has one."""

    @property
    def workflow(self) -> Runner | None: ...


class HandleRegistry(Protocol):
    """What the handle needs from the registry it reaches its actor through: the actor's
    definition (to refuse an actor without a workflow before waking it), its live instance (woken
    or created), and the registry's way of sending it a message. The handle depends on this and
    not on `Registry`, which creates handles, so imports run one way."""

    def definition(self, name: str) -> ActorDefinition: ...

    async def instance(
        self, name: str, key: str, *, create: bool, input: Any
    ) -> WorkflowInstance: ...

    async def send(
        self, name: str, key: str, queue: str, body: Any, *, create: bool, input: Any
    ) -> int: ...


class WorkflowHandle:
    """Like `ActorHandle`, re-resolves (and wakes) the actor on every call."""

    def __init__(
        self, registry: HandleRegistry, name: str, key: str, *, create: bool, input: Any
    ) -> None:
        self._registry = registry
        self._address = (name, key)
        self._create = create
        self._input = input

    async def _runner(self) -> Runner:
        """The workflow's runner, the actor woken (or created) for it; an actor without a
        workflow is refused before the wake, so asking changes nothing."""
        name = self._address[0]
        if self._registry.definition(name).workflow_fn is None:
            raise ActorError(f"actor {name!r} has no workflow")
        instance = await self._registry.instance(
            *self._address, create=self._create, input=self._input
        )
        assert instance.workflow is not None, "a started workflow actor has its runner"
        return instance.workflow

    async def status(self) -> WorkflowStatus:
        """The workflow's state, output (once completed) and error (once failed)."""
        return await (await self._runner()).status()

    async def history(self) -> dict[str, Any] | None:
        """The recorded history as inspectors show it (see `describe`)."""
        runner = await self._runner()
        return await runner.db.locked(describe, internal=True)

    async def send(self, queue: str, body: Any) -> int:
        """A message for `wf.queue.next`; returns its id. Checked before the actor is woken."""
        prepare_message(queue, body)
        await self._runner()  # an actor without a workflow is refused first
        return await self._registry.send(
            *self._address, queue, body, create=self._create, input=self._input
        )

    async def wake(self) -> None:
        """Make sure the actor is awake and its workflow running (no-op if it is)."""
        (await self._runner()).instance.start_run()

    async def cancel(self) -> None:
        await (await self._runner()).cancel()

    async def replay(self, location: str | None = None) -> None:
        """Run again from the entry at `location` (or from the start); see `Runner.replay`."""
        await (await self._runner()).replay(location)
