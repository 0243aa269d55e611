"""What the workflow's machinery needs from what runs it, as protocols: the runner (and its
journal and mailbox) from the instance it is the run handler of (`RunHost`), a `wf` scope from
the execution it is part of (`ScopeHost`, the runner's `Execution`). The runner depends on
these and not on `ActorInstance`, which creates it, and `wf` not on the runner, which creates
it, so imports run one way (instance -> runner -> `wf` -> this)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Protocol

from pagekv.actor.context import ActorContext
from pagekv.actor.queue import Message
from pagekv.actor.workflow.history import Entry, History
from pagekv.actor.workflow.step import RollbackFn


class RunActor(Protocol):
    """The actor as a `wf` scope sees it: its id, and the context its steps are given."""

    @property
    def actor_id(self) -> str: ...

    @property
    def ctx(self) -> ActorContext: ...


class RunHost(RunActor, Protocol):
    """What the runner needs from its instance besides: the wake time the instance publishes
    (announced before a deadline commits, refreshed after), a way to say it waits (so the actor
    may sleep meanwhile), and starting or holding off the run handler it is."""

    async def announce_wake(self, due: float) -> None: ...

    async def refresh_wake(self) -> None: ...

    def waiting(self) -> AbstractContextManager[None]: ...

    def start_run(self) -> None: ...

    def run_held(self) -> AbstractAsyncContextManager[None]: ...


class ScopeHost(Protocol):
    """What a `wf` scope needs from the execution it is part of: the history it replays and
    records into, the mode of this execution, and the operations that write, wait or receive
    for it."""

    checkpointed: bool
    """A rollback checkpoint was passed: a failure from here on rolls back."""

    @property
    def instance(self) -> RunActor: ...

    @property
    def history(self) -> History: ...

    @property
    def rollback_mode(self) -> bool: ...

    def transaction(self) -> AbstractAsyncContextManager[list[Entry]]: ...

    async def flush(self) -> None: ...

    async def wait(self, deadline: float | None) -> None: ...

    def register_rollback(self, entry: Entry, handler: RollbackFn) -> None: ...

    async def receive(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message]: ...

    def messages(self, entry: Entry) -> list[Message]: ...

    async def return_messages(self, gone: Sequence[Entry], kept: Sequence[Entry]) -> None: ...
