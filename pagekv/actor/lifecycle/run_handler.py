"""The actor's run handler (`RunHandler`): its optional long-running `run(ctx)` hook, or its
workflow, running in the background of an awake instance."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio

from pagekv.actor.definition import ActorDefinition
from pagekv.actor.errors import STORAGE_ERRORS, ActorStopped, ActorTakenOver
from pagekv.actor.lifecycle.instance_ports import RunOwner
from pagekv.actor.lifecycle.phase import StopState

log = logging.getLogger("pagekv.actor")


class RunHandler:
    """Starts, holds off, cancels and awaits the run handler of one instance.

    Invariants: it never runs twice at once (`start` is its only way in); it does not start
    while held (`held`), while the instance does not serve, or once a stop was requested; a
    stop cancels it and waits for it to end; while it runs without waiting for a message or a
    deadline, the actor does not go to sleep, and a run handler with work to do (`pending`) cut
    off by a stop or a crash goes on elsewhere without anyone calling the actor
    (`LeaseKeeper.next_run`). A failure of its store or a takeover tears the instance down; a
    failure of its own code too, and it is then not resumed until something wakes the actor.
    """

    def __init__(
        self,
        actor_id: str,
        definition: ActorDefinition,
        stops: StopState,
        spawn: Callable[..., None],
        owner: RunOwner,
    ) -> None:
        self._actor_id = actor_id
        self._definition = definition
        self._stops = stops
        self._spawn = spawn
        self._owner = owner
        self._scope: anyio.CancelScope | None = None
        """Around the running handler; None while none runs. Event loop only, as are the
        fields below."""
        self.active = False
        """The handler runs (from its start to its end, cancelled or not)."""
        self._done = False
        """The run handler returned (the workflow settled) since this instance started it."""
        self._holds = 0
        """Blocks that keep the run handler from starting (`held`)."""
        self._ended = anyio.Event()
        self.waits = 0
        """Tasks waiting for a message or a workflow deadline; a run handler waiting there does
        not block sleep."""

    def _has_run(self) -> bool:
        return "run" in self._definition.hooks or self._definition.workflow_fn is not None

    def start(self) -> None:
        """Start the run handler (a `run` hook or the workflow) unless it is running already, or
        held off (`held`)."""
        if (
            self._has_run()
            and not self.active
            and not self._holds
            and self._owner.serving()
            and self._stops.requested is None
        ):
            self.active, self._done = True, False
            self._ended = anyio.Event()
            # made here, not in the task: a stop between this spawn and the task's first step
            # cancels it too (the task enters it already cancelled)
            self._scope = anyio.CancelScope()
            self._spawn(self._run)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Stop the run handler and keep it from starting until the block ends: what the block
        changes (a workflow cancelled, or rewound for a replay) no run can race."""
        self._holds += 1
        try:
            await self.stop()
            yield
        finally:
            self._holds -= 1

    def pending(self) -> bool:
        """The run handler has work to do now: it is about to start, or it runs and does not
        wait for a message or a deadline, and the instance was not asked to stop (`ctx.sleep()`
        from its own code means it is done for now). Such a run handler, cut off by a stop or a
        crash, must go on elsewhere without anyone calling the actor
        (`LeaseKeeper.next_run`)."""
        return (
            self._has_run() and not self._done and not self.waits and self._stops.requested is None
        )

    def busy(self) -> bool:
        """It runs and does not wait for a message or a deadline: the actor stays awake."""
        return self.active and not self.waits

    def cancel(self) -> None:
        """Cancel the run handler, if it runs, without waiting for it."""
        if self._scope is not None:
            self._scope.cancel()

    async def stop(self) -> None:
        """Cancel the run handler and wait until it has ended."""
        if self.active:
            self.cancel()
            await self._ended.wait()

    async def wait_ended(self) -> None:
        """Wait until the run handler, if it runs, has ended."""
        if self.active:
            await self._ended.wait()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait for a message or a deadline: the actor may sleep meanwhile."""
        self.waits += 1
        try:
            yield
        finally:
            self.waits -= 1

    async def _run(self) -> None:
        """The optional long-running `run(ctx)`; it blocks idle sleep while it runs (unless it
        waits, see `waiting`). Never runs twice at once: `start` is its only way in."""
        scope = self._scope
        assert scope is not None, "start makes the run handler's scope"
        owner = self._owner
        try:
            with scope:
                if not owner.serving() or self._stops.requested is not None:
                    return
                run: Awaitable[Any] = (
                    owner.workflow.run()
                    if owner.workflow is not None
                    else self._definition.hooks["run"](owner.ctx)
                )
                await run
                await owner.ctx.db.save_state()
                self._done = True
        except ActorTakenOver as e:
            log.info("actor %s: run handler ended by a takeover: %s", self._actor_id, e)
            self._stops.request_crash()
        except (*STORAGE_ERRORS, ActorStopped):
            # The store failed under it: its lease runs out, and it resumes elsewhere then.
            log.exception("actor %s: run handler cut off by its store", self._actor_id)
            self._stops.request_crash()
        except Exception:
            log.exception("actor %s: run handler failed; tearing the instance down", self._actor_id)
            self._stops.request_crash()
            self._done = True  # failed by itself: not resumed until something wakes it
            with anyio.CancelScope(shield=True):  # a crash stop publishes nothing
                await owner.run_failed()
        finally:
            self._scope = None
            self.active = False
            self._ended.set()
            owner.last_active = time.monotonic()
        await owner.run_ended()
