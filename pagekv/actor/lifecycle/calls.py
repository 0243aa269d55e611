"""The calls an instance serves (`Calls`): actions and sends, from the check that the instance
may take them to the proof that their answer is current, and their cut-off by a stop."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio

from pagekv.actor import call_chain
from pagekv.actor.async_db import noting_rollbacks
from pagekv.actor.definition import Hook
from pagekv.actor.errors import STORAGE_ERRORS, ActorStopped, ActorTakenOver, CallCutOff
from pagekv.actor.gate import Gate
from pagekv.actor.lifecycle.instance_ports import CallsOwner, InstanceHost
from pagekv.actor.lifecycle.owner_check import OwnerCheck
from pagekv.actor.lifecycle.phase import NotServing, StopState
from pagekv.actor.lifecycle.run_handler import RunHandler
from pagekv.actor.queue import Outgoing
from pagekv.actor.realtime.connection import calling_connection
from pagekv.actor.request_writes import Writes, note_writes, tracking_writes

log = logging.getLogger("pagekv.actor")


class _Running:
    """A call in flight, as `Calls._cut_off_by_stop` sees it."""

    commits: int | None = None
    """The database's commit count as the call's own code began; None until it does."""


class Calls:
    """Runs the actions and sends of one instance, and counts those in flight (an instance with
    one does not go to sleep) for the stop, which waits for them and cancels what still runs
    when its grace is over.

    Invariants:
    - a call runs only while the instance serves and is current (`_serving`): else it is
      refused with `NotServing`, before its code ran, and the registry wakes a fresh instance;
    - an action's answer only after its commit is durable (the commit returns once the store
      holds it) and only once the actor was still this instance's after the action's code
      ended (`_answer_current`), so no answer comes from stale memory;
    - a takeover or a stop met by a call tears the instance down (a crash), unless it stops
      already;
    - a call cut off by a stop says it wrote nothing only if nothing of it was or can still be
      persisted (`_cut_off_by_stop`).
    """

    def __init__(
        self,
        owner: CallsOwner,
        registry: InstanceHost,
        gate: Gate,
        stops: StopState,
        run: RunHandler,
        owner_check: OwnerCheck,
    ) -> None:
        self._owner = owner
        self._actor_id = owner.actor_id
        self._stop_grace = owner.definition.stop_grace
        self._registry = registry
        self._gate = gate
        self._stops = stops
        self._run = run
        self._owner_check = owner_check
        self.active = 0
        """Calls (and sends) in flight. Event loop only, as are the fields below."""
        self._scopes: set[anyio.CancelScope] = set()
        """A scope around the user code of each call in flight."""
        self._idle = anyio.Event()
        """Set when `active` falls to 0, then replaced."""

    async def call(
        self, fn: Hook, args: tuple[Any, ...], kwargs: dict[str, Any], *, answered: bool = True
    ) -> Any:
        """Run action `fn`, which `ActorDefinition.resolve` found and bound to the arguments
        (callers resolve first, so a call that cannot run is refused before the wake). An
        `answered` call's answer is proven current (`_answer_current`); a scheduled one has
        nobody to answer."""
        async with self._serving():
            ctx = self._owner.ctx
            self._registry.counters["actions"] += 1
            ended: float | None = None
            commits = ctx.db.database.commits
            with tracking_writes() as writes:
                try:
                    with (
                        self._cut_off_by_stop(writes) as running,
                        call_chain.entering(self._actor_id) as frame,
                    ):
                        async with self._gate.shared(frame):
                            with ctx.queue.redeliver_on_failure():
                                try:
                                    running.commits = ctx.db.database.commits
                                    result = await fn(ctx, *args, **kwargs)
                                except Exception:
                                    ended = time.monotonic()
                                    await self._keep_state()
                                    raise
                                ended = time.monotonic()
                                await self._registry.hub.save(ctx)  # the state too
                except ActorTakenOver as e:
                    if self._wrote_nothing(writes, commits):  # the fence refused it all
                        self._owner_check.count_takeover()
                        raise NotServing(f"actor {self._actor_id}: {e}") from e
                    raise
                except (ActorStopped, *STORAGE_ERRORS):
                    raise
                except Exception:
                    if ended is not None and answered:
                        await self._answer_current(ended, writes, commits)
                    raise
            if answered:
                await self._answer_current(ended, writes, commits)
            return result

    async def send(self, message: Outgoing) -> int:
        """Append `message` to the actor's queue, as a call would: refused (`NotServing`) if
        the instance stopped or was taken over elsewhere since its last check, and the instance
        does not go to sleep under it."""
        async with self._serving():
            return await self._owner.ctx.queue.append(message)

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        """Around a call or a send: refused (`NotServing`: the registry wakes a fresh instance)
        unless the instance serves and is current; while it runs the instance is active, so it
        does not go to sleep; a takeover or stop met inside tears the instance down."""
        owner = self._owner
        if not owner.serving():
            raise NotServing(f"actor {self._actor_id} is {owner.phase.value}")
        await self._owner_check.check_current()
        if not owner.serving():  # it began to stop while the check above waited
            raise NotServing(f"actor {self._actor_id} is {owner.phase.value}")
        self.active += 1
        outer = calling_connection.set(None)  # a connection is `ctx.conn` in its actor alone
        try:
            yield
        except (ActorTakenOver, ActorStopped) as e:
            if self._stops.stopping is None:
                self._stops.request_crash()
            if isinstance(e, ActorTakenOver):
                self._owner_check.count_takeover()
            raise
        finally:
            calling_connection.reset(outer)
            self.active -= 1
            owner.last_active = time.monotonic()
            if self.active == 0:
                self._idle.set()
                self._idle = anyio.Event()
            requested = self._stops.requested
            if requested is not None and self.active == 0 and not self._run.active:
                self._registry.spawn(owner.stop, requested)

    async def _keep_state(self) -> None:
        """After an action raised: commit the state it changed outside a transaction now, as
        SQL it ran outside one is committed, so the failed call's answer can say it wrote. (Left
        in memory, the change was committed later by whichever call saved next.) A failure here
        is logged: the action's own error is the answer."""
        db = self._owner.ctx.db
        if db.database.is_dead:
            return
        try:
            await db.save_state()
        except Exception:
            log.exception("actor %s: state of a failed action not saved", self._actor_id)

    def _wrote_nothing(self, writes: Writes, commits: int) -> bool:
        """Nothing of the call can have landed: it committed nothing, and neither did anything
        else on this instance while it ran (another call's commit saves the shared state, with
        this call's changes to it)."""
        return writes.state() is False and self._owner.ctx.db.database.commits == commits

    async def _answer_current(self, ended: float, writes: Writes, commits: int) -> None:
        """Acknowledge a call only if the actor was still this instance's after the call's code
        ended (`OwnerCheck.owned_since`). Else the answer may come from stale memory: a no-op
        write (`state["v"] = 1` when memory holds 1 and the store 2) or a read. A call that
        wrote nothing runs again on a fresh instance (`NotServing`); one whose writes may have
        landed is refused with `ActorTakenOver`, as running it again could apply them twice."""
        if await self._owner_check.owned_since(ended):
            return
        if not self._wrote_nothing(writes, commits):
            raise ActorTakenOver(
                f"actor {self._actor_id} was taken over elsewhere while this call ran, "
                "after writes of this instance committed; its answer may be stale"
            )
        raise NotServing(f"actor {self._actor_id} was taken over elsewhere")

    # -- the stop's side --------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Wait until no call is in flight."""
        while self.active:
            await self._idle.wait()

    def cancel(self) -> int:
        """Cancel the user code of every call in flight; returns how many."""
        for scope in self._scopes:
            scope.cancel()
        return len(self._scopes)

    @contextmanager
    def _cut_off_by_stop(self, writes: Writes) -> Iterator[_Running]:
        """Around a call's user code: a stop that waited `stop_grace` for it cancels it here
        (`cancel`), and the call fails with `CallCutOff` (an `ActorStopped`). `writes`: what the
        call committed so far; the caller sets `commits` of what this yields as the call's own
        code begins.

        Invariant: the failure says nothing was written (`written: false`, which a client
        retries) only if nothing of the call was or can still be persisted. A transaction it
        had open was rolled back by then, its state restored with it; but its changes to the
        state outside a transaction are in the one state cell that every call shares, and a
        cell cannot tell whose change is whose: the stop's save (or a commit of another call
        that ran meanwhile) writes them. So once its code began, a call cut off while the state
        holds unsaved changes, or after anything committed on this instance since its code
        began, reports its writes as unknown (`Writes.unknown`: `written: null`, never retried
        blindly). A call cut off before its code began (waiting at the gate) wrote nothing."""
        running = _Running()
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope, noting_rollbacks() as rolled_back:
                yield running
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            began = running.commits is not None
            may_stand = running.commits is not None and self._unsaved_since(running.commits)
            if may_stand:
                note_writes(committed=False, unknown=True)
            what = "" if began else " before its code began"
            if rolled_back:
                what += "; a transaction it had open was rolled back"
            if writes.committed:
                what += "; writes of it had committed"
            elif may_stand:
                what += (
                    "; changes it made to the state outside a transaction may be saved (the "
                    "stop saves the state), so it may have written"
                )
            raise CallCutOff(
                f"actor {self._actor_id} stopped ({self._stops.stopping}) while this call ran: "
                f"it was cancelled after the stop waited stop_grace ({self._stop_grace:g} s) "
                f"for it{what}"
            )

    def _unsaved_since(self, commits: int) -> bool:
        """Whether a state change made by a call that began when the database had made
        `commits` commits may be, or may have been, persisted by another than the call: the
        state holds changes not yet saved (the stop saves them), or something committed since
        (each commit saves the state as it is)."""
        db = self._owner.ctx.db
        if db.database.commits != commits:
            return True
        try:
            return db.state.changed() is not None
        except Exception:  # a state that does not encode: whether a save writes it is unknown
            return True
