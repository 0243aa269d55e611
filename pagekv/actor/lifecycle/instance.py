"""One live actor instance (`ActorInstance`): it starts, serves calls, and stops, coordinating
the parts that do each (`startup`, `calls`, `owner_check`, `lease_keeper`,
`schedule_dispatch`, `run_handler`, `stopping`).

Lifecycle: STARTING -> RUNNING -> STOPPING -> STOPPED. Hooks run in the order
`on_migrate` (in a transaction) -> [new actor: `create_state`, `on_create`] -> `create_vars` ->
`on_wake` -> `run` (in the background). Every start opens the database, which is a takeover: an
instance of the same actor elsewhere dies on its next write and is torn down with
`ActorTakenOver`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import anyio

from pagekv.actor.async_db import ActorDb
from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition, Hook
from pagekv.actor.errors import ActorTakenOver
from pagekv.actor.gate import Gate
from pagekv.actor.lifecycle.calls import Calls
from pagekv.actor.lifecycle.instance_ports import InstanceHost
from pagekv.actor.lifecycle.lease_keeper import LeaseKeeper
from pagekv.actor.lifecycle.owner_check import OwnerCheck
from pagekv.actor.lifecycle.phase import Phase, Stop, StopState
from pagekv.actor.lifecycle.run_handler import RunHandler
from pagekv.actor.lifecycle.schedule_dispatch import ScheduleDispatcher
from pagekv.actor.lifecycle.startup import Startup
from pagekv.actor.lifecycle.stopping import Stopper
from pagekv.actor.queue import Outgoing, Queue
from pagekv.actor.realtime.connection import Connection
from pagekv.actor.schedule import Schedule
from pagekv.actor.state import StateCell
from pagekv.actor.tables.sql import encode_state
from pagekv.actor.user_kv import UserKv
from pagekv.actor.workflow.runner import Runner
from pagekv.kv import ActorKv

log = logging.getLogger("pagekv.actor")


class ActorInstance:
    """The one live instance of an actor in this process: it owns the actor's open database
    from its start (a takeover) until its stop, and serves the actor's calls meanwhile.

    Invariants:
    - one live instance per actor per process: the registry creates one under the actor's lock
      and addresses calls to it until it stops (`Placement.locked_instance`); a second one anywhere
      is a takeover, which fences this one off (`owner_check`: a write after a takeover fails);
    - an action's answer only after its commit is durable, and only once the actor was still
      this instance's after the action's code ended, so no answer comes from stale memory;
      calls run only while RUNNING and current, and a takeover or a stop met inside tears the
      instance down (`Calls`);
    - a stop waits for the calls and the running transaction, bounded by `stop_grace` and
      `UNWIND_S` (`Stopper`);
    - the lease entry is published before any hook runs and kept until the stop
      (`LeaseKeeper`).

    Why it has more than twenty members: it is the one object the registry, `ctx`, `ctx.queue`,
    `ctx.schedule`, its calls, the schedule dispatcher and the workflow runner hold (their
    protocols in `ports.py`, `workflow/hosts.py` and `instance_ports.py` say what each uses);
    the members that serve them are one-line hand-offs to the part that does the work.
    """

    def __init__(
        self,
        registry: InstanceHost,
        definition: ActorDefinition,
        actor_id: str,
        key: str,
        kv: ActorKv,
    ) -> None:
        self.registry = registry
        self.definition = definition
        self.actor_id = actor_id
        self.key = key
        self.kv = kv
        self.phase = Phase.STARTING
        """Event loop only, as are the fields below."""
        self.last_active = time.monotonic()
        """When the instance last did something: its idle clock (`idle_for`)."""
        self.stops = StopState()
        self.created = False
        """This instance created the actor (its database held none)."""
        self.workflow: Runner | None = None
        self.gate = Gate(actor_id)
        self.stopped = anyio.Event()
        """Set once a stop is done, or a start failed."""
        self.startup = Startup(actor_id, definition, key, registry)
        self.run = RunHandler(actor_id, definition, self.stops, registry.spawn, self)
        self.schedules = ScheduleDispatcher(self, self.stops)
        self.ctx: ActorContext
        self.lease: LeaseKeeper
        self.owner_check: OwnerCheck
        self.calls: Calls
        self._stopper: Stopper
        """`ctx` and the four parts above are made by the start, once the database opened."""

    # -- start ------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The generation this instance took the actor over with (its database's); -1 if its
        database never opened."""
        ctx = getattr(self, "ctx", None)
        return -1 if ctx is None else ctx.db.database.generation

    async def start(self, input: Any, *, create: bool = True) -> None:
        """Open (take over) the database and run the start hooks; tear down on any failure.

        An actor whose database holds none (never created, or destroyed meanwhile) is created,
        unless `create` is false: then `ActorNotFound`, before anything is written."""
        definition = self.definition
        database = await self.startup.open(self.kv)
        cell = StateCell(None, None)
        db = ActorDb(database, cell, self.gate, self.registry.workers)
        self.ctx = ActorContext(
            actor_id=self.actor_id,
            name=definition.name,
            key=self.key,
            db=db,
            kv=UserKv(self.kv, database.generation, self.registry.workers),
            log=logging.LoggerAdapter(log, {"actor_id": self.actor_id}),
            schedule=Schedule(self),
            queue=Queue(self),
            _cell=cell,
            _instance=self,
            input=input,
        )
        try:
            loaded = await self.startup.load(db, create=create)
            self.created = not loaded.initialized
            cell.restore((loaded.state, encode_state(loaded.state) if loaded.initialized else None))
            self.lease = LeaseKeeper(
                actor_id=self.actor_id,
                name=definition.name,
                key=self.key,
                db=db,
                ownership=self.registry.ownership,
                workers=self.registry.workers,
                lease=self.registry.lease,
                next_due=loaded.due,
                run_pending=self.run.pending,
            )
            self.owner_check = await self._take_lease()  # before any hook runs
            self.calls = Calls(
                self, self.registry, self.gate, self.stops, self.run, self.owner_check
            )
            self._stopper = Stopper(
                instance=self,
                actor_id=self.actor_id,
                definition=definition,
                kv=self.kv,
                ctx=self.ctx,
                registry=self.registry,
                calls=self.calls,
                run=self.run,
                lease=self.lease,
                close=self._close,
            )
            await self.startup.run_hooks(self, cell, loaded, input)
        except BaseException:
            with anyio.CancelScope(shield=True):
                try:
                    await self._close()
                finally:
                    self.stopped.set()
            raise
        self.phase = Phase.RUNNING
        self.last_active = time.monotonic()
        if definition.workflow_fn is not None:
            self.workflow = Runner(self, definition.workflow_fn)
        self.start_run()

    async def _take_lease(self) -> OwnerCheck:
        """Publish the lease, then refuse to start if another registry woke the actor since
        this instance's takeover (two calls for an actor nobody owned, arriving at two
        registries at once), both in one worker hop. The loser's hooks never run, and it steps
        aside for the winner, whose lease entry the registry then finds (`ActorTakenOver`).
        Returns the check of its ownership from then on, which this takeover proved as of the
        moment it began."""
        started = time.monotonic()
        generation = await self.lease.publish_first(self.kv.generation)
        if generation != self.generation:
            raise ActorTakenOver(f"actor {self.actor_id} was woken elsewhere at the same time")
        return OwnerCheck(
            self.actor_id,
            self.kv,
            self.ctx.db,
            self.registry.workers,
            self.registry.counters,
            checked_at=started,
            on_taken_over=self.stops.request_crash,
        )

    # -- run handler (`RunHandler`; the workflow runner's `RunHost`) -----------------------

    def start_run(self) -> None:
        """Start the run handler unless it runs, is held off, or may not run now."""
        self.run.start()

    def run_held(self) -> AbstractAsyncContextManager[None]:
        """Stop the run handler and keep it from starting until the block ends."""
        return self.run.held()

    async def run_failed(self) -> None:
        await self.lease.publish_logged(self.lease.next_run(time.time()))

    async def run_ended(self) -> None:
        if self.stops.requested is not None and self.calls.active == 0:
            await self.stop(self.stops.requested)

    # -- calls (`Calls`) ------------------------------------------------------------------

    async def call(
        self, fn: Hook, args: tuple[Any, ...], kwargs: dict[str, Any], *, answered: bool = True
    ) -> Any:
        """Run action `fn` (`Calls.call`)."""
        return await self.calls.call(fn, args, kwargs, answered=answered)

    async def send(self, message: Outgoing) -> int:
        """Append `message` to the actor's queue (`Calls.send`)."""
        return await self.calls.send(message)

    def serving(self) -> bool:
        """Running, not torn down by a failure, and its database alive (it may have died in a
        background dispatch): new calls may use this instance, else they get a fresh one."""
        return (
            self.phase is Phase.RUNNING
            and self.stops.requested != "crash"
            and not self.ctx.db.database.is_dead
        )

    # -- what `ctx` and its parts ask for (`ports.py`) -------------------------------------

    def request_sleep(self) -> None:
        self.stops.request_sleep()
        self.run.cancel()

    def request_destroy(self) -> None:
        self.stops.request_destroy()
        self.run.cancel()

    def connections(self) -> list[Connection]:
        return self.registry.hub.connections(self.actor_id)

    def broadcast(self, event: str, args: tuple[Any, ...]) -> int:
        return self.registry.hub.broadcast(self.actor_id, event, args)

    def client(self) -> Any:
        return self.registry.client()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait for a message or a deadline: the actor may sleep meanwhile."""
        try:
            with self.run.waiting():
                yield
        finally:
            self.last_active = time.monotonic()

    async def announce_wake(self, due: float) -> None:
        """Before committing a schedule row due at `due` (`LeaseKeeper.announce`)."""
        await self.lease.announce(due)

    async def refresh_wake(self) -> None:
        """After a schedule committed (`LeaseKeeper.refresh`)."""
        await self.lease.refresh()

    # -- housekeeping (the registry's rounds) -----------------------------------------------

    async def dispatch_due(self) -> None:
        """Run every due schedule (at least once), then move the wake time on; not while a
        dispatch is under way or the instance does not run."""
        if self.schedules.dispatching or self.phase is not Phase.RUNNING:
            return
        try:
            await self.schedules.dispatch()
        finally:
            self.last_active = time.monotonic()

    async def renew_lease(self) -> None:
        """The registry's housekeeping renews the lease with this. A renewal that comes after
        the lease ran out (the process was stopped, or its event loop stalled, that long) first
        proves this instance still owns the actor (one generation read): one taken over
        meanwhile finds out here and is torn down, rather than believe it owns the actor until
        a call shows otherwise. On time, no registry that routes takes a leased actor, so no
        read is needed."""
        if not self.lease.late() or await self.owner_check.owned_recently():
            await self.lease.publish_wake()
        elif self.calls.active == 0 and not self.run.active:
            await self.stop("crash")

    def lease_lapsing(self, now: float) -> bool:
        """The lease entry must move on and no write of it is under way
        (`LeaseKeeper.lapsing`). Only an instance that serves or goes to sleep renews (it may
        still finish a due schedule): one torn down by a crash leaves its lease to run out, so
        the actor is woken elsewhere, and a destroyed one must not write its entry back."""
        return (
            self.stops.stopping in (None, "sleep")
            and self.stop_reason() != "crash"
            and self.lease.lapsing(now)
        )

    def sleepy(self) -> bool:
        """Idle for its `sleep_timeout`: time to go to sleep."""
        idle = self.idle_for()
        return idle is not None and idle >= self.definition.sleep_timeout

    async def sleep_if_idle(self) -> None:
        """Go to sleep if still idle now: the check and the start of the stop happen in one
        step of the event loop, so nothing can begin in between (a run handler taking a
        message it would then lose to the sleep's cancellation)."""
        if self.sleepy():
            await self.stop("sleep")

    def idle_for(self) -> float | None:
        """Seconds idle, or None while an action, a due or running dispatch or the run handler
        (unless it waits for a message or a deadline) keeps it awake."""
        next_due = self.lease.next_due
        due = next_due is not None and next_due <= time.time()
        if (
            self.phase is not Phase.RUNNING
            or self.calls.active
            or self.run.busy()
            or self.schedules.dispatching
            or due
        ):
            return None
        return time.monotonic() - self.last_active

    # -- stop -------------------------------------------------------------------------------

    def stop_reason(self) -> Stop:
        """How to stop now: as requested, else a crash if the database died, else a sleep."""
        if self.stops.requested is None and self.ctx.db.database.is_dead:
            return "crash"
        return self.stops.requested or "sleep"

    async def stop(self, how: Stop) -> Stop:
        """Sleep, destroy or tear down after a crash (`Stopper`); idempotent. Returns how the
        instance stopped: another way than `how` if it was stopping already (this call waited
        for it). `stopped` is set only once all of it is done, the drop and the index of a
        destroy too, so a wake that waited for it never meets a destroy half done."""
        if self.phase in (Phase.STOPPING, Phase.STOPPED):
            await self.stopped.wait()
            return self.stops.stopping or "crash"
        self.phase = Phase.STOPPING
        self.stops.stopping = how
        try:
            await self._stopper.run(how)
        finally:
            self.stopped.set()
        return how

    async def _close(self) -> None:
        """Close the database."""
        self.phase = Phase.STOPPED
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            await ctx.db.close()
