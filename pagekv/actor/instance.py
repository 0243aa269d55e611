"""One live actor instance: start (takeover, migrations, hooks), actions, sleep, destroy, crash.

Lifecycle: STARTING -> RUNNING -> STOPPING -> STOPPED. Hooks run in the order
`on_migrate` (in a transaction) -> [new actor: `create_state`, `on_create`] -> `create_vars` ->
`on_wake` -> `run` (in the background). Every start opens the database, which is a takeover: an
instance of the same actor elsewhere dies on its next write and is torn down with
`ActorTakenOver`.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, Literal, Protocol, TypeVar, assert_never, cast

import anyio
import apsw
import cbor2

from pagekv.actor import call_chain
from pagekv.actor.async_db import ActorDb, noting_rollbacks
from pagekv.actor.blocking import Workers
from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition, Hook
from pagekv.actor.directory.leases import Lease, Ownership
from pagekv.actor.errors import (
    STORAGE_ERRORS,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    CallCutOff,
)
from pagekv.actor.gate import Gate
from pagekv.actor.queue import Outgoing, Queue
from pagekv.actor.realtime.connection import Connection, calling_connection
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.request_writes import Writes, note_writes, tracking_writes
from pagekv.actor.schedule import WORKFLOW_WAKE, Schedule, next_due
from pagekv.actor.state import StateCell
from pagekv.actor.tables.schema import encode_state, load, mark_initialized, migrate
from pagekv.actor.user_kv import UserKv
from pagekv.actor.workflow.runner import Runner
from pagekv.kv import ActorKv, FenceMismatch, KvError
from pagekv.vfs import DatabaseDead, open_database

T = TypeVar("T")
log = logging.getLogger("pagekv.actor")
FRESHNESS_S = 0.05
"""A call first checks that no other instance took the actor over (one KV read) unless this
instance checked less than this long ago, so a stale instance rarely runs user code at all. The
answer is what must be current: see `ActorInstance._answer_current`."""
Stop = Literal["sleep", "destroy", "crash"]
UNWIND_S = 2.0
"""How long a stop waits for the work it cancelled at the end of `stop_grace` to unwind (a
transaction to roll back) before it closes the database without it (`ActorInstance._stop`)."""


class NotServing(ActorStopped):
    """The instance stopped before this call reached user code; a fresh one can take it."""


class _Running:
    """A call in flight, as `_cut_off_by_stop` sees it."""

    commits: int | None = None
    """The database's commit count as the call's own code began; None until it does."""


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class InstanceHost(Protocol):
    """What an instance needs from the registry that hosts it: the instance depends on this and
    not on the registry, which creates and addresses instances (so imports run one way)."""

    lease: float
    """Seconds an instance's lease on its actor runs from each renewal."""
    counters: Counter[str]
    ownership: Ownership
    workers: Workers
    """Where the instance's blocking work runs (its KV requests and SQLite work)."""
    hub: Hub
    """The process's open connections, which outlive instances (hibernation)."""

    def client(self) -> Any:
        """A client of the registry's actors (`ctx.client`)."""

    def holds_sockets(self, aid: str) -> bool:
        """Whether an instance of `aid` going to sleep keeps its lease, for the sockets this
        process holds (`realtime/holds.py`)."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the background; its failure is logged."""

    async def forget(self, instance: Any, *, how: str, destroyed: bool) -> None:
        """The instance stopped (`how`); `destroyed`: its data is gone."""


class ActorInstance:
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
        self.active = 0
        self.last_active = time.monotonic()
        self.metrics: dict[str, float] = {}
        self._requested: Stop | None = None
        self._run_scope: anyio.CancelScope | None = None
        self._run_active = False
        self._run_done = False
        """The run handler returned (the workflow settled) since this instance started it."""
        self._run_holds = 0
        """Blocks that keep the run handler from starting (`run_held`)."""
        self._run_ended = anyio.Event()
        self.waits = 0
        """Tasks waiting for a message or a workflow deadline; a run handler waiting there does
        not block sleep."""
        self.workflow: Runner | None = None
        self.created = False
        """This instance created the actor (its database held none)."""
        self._checked_at = time.monotonic()
        """When this instance last knew it was current (its takeover at start, then checks)."""
        self._checking: anyio.Event | None = None
        """Set when the generation check under way ends; None while none is."""
        self._taken_over = False
        """A generation check found another instance's takeover."""
        self._takeover_counted = False
        self.next_due: float | None = None
        self._published: Lease | None = None
        """What the lease entry holds, once this instance wrote it."""
        self._lease = registry.lease
        """Seconds its lease on the actor runs from each renewal while this instance holds it;
        0 once it gives the lease up to sleep (see `_lease_target`)."""
        self._publishing = anyio.Lock()
        self.holding = False
        """It went to sleep keeping its lease, for the sockets this process holds
        (`realtime/holds.py`)."""
        self.released_due: float | None = None
        """The next run it published as it went to sleep."""
        self._stopping: Stop | None = None
        """How `stop` is stopping this instance, once it began."""
        self._dispatching = False
        self._calls: set[anyio.CancelScope] = set()
        """A scope around the user code of each call in flight (`_cut_off_by_stop`)."""
        self.gate = Gate(actor_id)
        self._idle = anyio.Event()
        self.stopped = anyio.Event()
        self.ctx: ActorContext

    # -- start ------------------------------------------------------------------------------

    async def _timed(self, phase: str, work: Awaitable[T], *, user: bool = False) -> T:
        started = time.perf_counter()
        result = await work
        ms = (time.perf_counter() - started) * 1000
        self.metrics[f"{'user' if user else 'internal'}.{phase}_ms"] = ms
        log.debug("perf %s: %s duration_ms=%.2f", "user" if user else "internal", phase, ms)
        return result

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
        try:
            database = await self._timed(
                "open_database", self.registry.workers.run(open_database, self.kv)
            )
        except DatabaseDead as e:
            if _fenced_off(e):  # what it wrote as it opened (recovery) was fenced off
                raise ActorTakenOver(f"actor {self.actor_id} was woken elsewhere meanwhile") from e
            raise
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
            loaded = await self._timed(
                "migrate_and_load", db.run(partial(load, create=create), internal=True)
            )
            if loaded is None:
                raise ActorNotFound(f"no actor {definition.name!r} with key {self.key!r}")
            initialized, self.next_due = loaded.initialized, loaded.due
            self.created = not initialized
            cell.restore((loaded.state, encode_state(loaded.state) if initialized else None))
            await self._publish_lease()  # before any hook runs (`_lease_target`)
            hooks = definition.hooks
            hooked = any(h in hooks for h in ("on_migrate", "create_state", "on_create"))
            if loaded.fresh and hooked:  # the hooks find the internal tables
                await db.run(migrate, internal=True)
            if "on_migrate" in hooks:
                async with db.transaction():
                    await self._timed("on_migrate", hooks["on_migrate"](self.ctx), user=True)
            if not initialized:
                await self._create(input, fresh=loaded.fresh and not hooked)
            gone = await self.registry.hub.restore(self)
            if "create_vars" in hooks:
                self.ctx.vars = await self._timed(
                    "create_vars", hooks["create_vars"](self.ctx), user=True
                )
            if "on_wake" in hooks:
                await self._timed("on_wake", hooks["on_wake"](self.ctx), user=True)
                await db.save_state()
            await self.registry.hub.reap(self, gone)
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

    async def _publish_lease(self) -> None:
        """Publish the lease, then refuse to start if another registry woke the actor since
        this instance's takeover (two calls for an actor nobody owned, arriving at two
        registries at once), both in one worker hop. The loser's hooks never run, and it steps
        aside for the winner, whose lease entry the registry then finds (`ActorTakenOver`)."""
        started = time.monotonic()
        generation = await self._publish(
            self._next_run(time.time()), then=self.kv.generation, upkeep=False
        )
        if generation != self.generation:
            raise ActorTakenOver(f"actor {self.actor_id} was woken elsewhere at the same time")
        self._checked_at = started

    async def _create(self, input: Any, *, fresh: bool) -> None:
        """Run the create hooks and record the creation with the first state; `fresh`: the
        internal tables are created in that same commit.

        `on_create` runs in one transaction with the record of the creation, so its SQL is
        there exactly once: a crash or a failed commit before the record rolls it back with the
        rest, and the next wake runs the hook again on a database without it."""
        hooks, ctx = self.definition.hooks, self.ctx
        if "create_state" in hooks:
            ctx.state = await self._timed(
                "create_state", hooks["create_state"](ctx, input), user=True
            )
        else:
            ctx.state = self.definition.initial_state()
        name, key = self.definition.name, self.key
        if "on_create" in hooks:

            def mark_created(connection: apsw.Connection) -> None:
                mark_initialized(connection, name, key, encode_state(ctx.state))

            async with ctx.db.transaction(before_commit=mark_created):
                await self._timed("on_create", hooks["on_create"](ctx, input), user=True)
            return
        data = encode_state(ctx.state)
        mark = partial(mark_initialized, name=name, key=key, data=data, fresh=fresh)
        await ctx.db.run(mark, internal=True)
        ctx._cell.mark_saved(data)

    def start_run(self) -> None:
        """Start the run handler (a `run` hook or the workflow) unless it is running already, or
        held off (`run_held`)."""
        if (
            self._has_run()
            and not self._run_active
            and not self._run_holds
            and self.serving()
            and self._requested is None
        ):
            self._run_active, self._run_done = True, False
            self._run_ended = anyio.Event()
            # made here, not in the task: a stop between this spawn and the task's first step
            # cancels it too (the task enters it already cancelled)
            self._run_scope = anyio.CancelScope()
            self.registry.spawn(self._run_handler)

    @asynccontextmanager
    async def run_held(self) -> AsyncIterator[None]:
        """Stop the run handler and keep it from starting until the block ends: what the block
        changes (a workflow cancelled, or rewound for a replay) no run can race."""
        self._run_holds += 1
        try:
            await self.stop_run()
            yield
        finally:
            self._run_holds -= 1

    def _has_run(self) -> bool:
        return "run" in self.definition.hooks or self.definition.workflow_fn is not None

    def _run_pending(self) -> bool:
        """The run handler has work to do now: it is about to start, or it runs and does not
        wait for a message or a deadline, and the instance was not asked to stop (`ctx.sleep()`
        from its own code means it is done for now). Such a run handler, cut off by a stop or a
        crash, must go on elsewhere without anyone calling the actor (`_next_run`)."""
        return self._has_run() and not self._run_done and not self.waits and self._requested is None

    async def stop_run(self) -> None:
        """Cancel the run handler and wait until it has ended."""
        if self._run_active:
            if self._run_scope is not None:
                self._run_scope.cancel()
            await self._run_ended.wait()

    async def _run_handler(self) -> None:
        """The optional long-running `run(ctx)`; it blocks idle sleep while it runs (unless it
        waits, see `waiting`). Never runs twice at once: `start_run` is its only way in."""
        scope = self._run_scope
        assert scope is not None, "start_run makes the run handler's scope"
        try:
            with scope:
                if not self.serving() or self._requested is not None:
                    return
                if self.workflow is not None:
                    await self.workflow.run()
                else:
                    await self.definition.hooks["run"](self.ctx)
                await self.ctx.db.save_state()
                self._run_done = True
        except ActorTakenOver as e:
            log.info("actor %s: run handler ended by a takeover: %s", self.actor_id, e)
            self._requested = "crash"
        except (*STORAGE_ERRORS, ActorStopped):
            # The store failed under it: its lease runs out, and it resumes elsewhere then.
            log.exception("actor %s: run handler cut off by its store", self.actor_id)
            self._requested = "crash"
        except Exception:
            log.exception("actor %s: run handler failed; tearing the instance down", self.actor_id)
            self._requested = "crash"
            self._run_done = True  # failed by itself: not resumed until something wakes it
            with anyio.CancelScope(shield=True):  # a crash stop publishes nothing
                await self._publish_logged(self._next_run(time.time()))
        finally:
            self._run_scope = None
            self._run_active = False
            self._run_ended.set()
            self.last_active = time.monotonic()
        if self._requested is not None and self.active == 0:
            await self.stop(self._requested)

    # -- actions ----------------------------------------------------------------------------

    async def call(
        self, fn: Hook, args: tuple[Any, ...], kwargs: dict[str, Any], *, answered: bool = True
    ) -> Any:
        """Run action `fn`, which `ActorDefinition.resolve` found and bound to the arguments
        (callers resolve first, so a call that cannot run is refused before the wake). An
        `answered` call's answer is proven current (`_answer_current`); a scheduled one has
        nobody to answer."""
        async with self._serving():
            self.registry.counters["actions"] += 1
            ended: float | None = None
            commits = self.ctx.db.database.commits
            with tracking_writes() as writes:
                try:
                    with (
                        self._cut_off_by_stop(writes) as running,
                        call_chain.entering(self.actor_id) as frame,
                    ):
                        async with self.gate.shared(frame):
                            with self.ctx.queue.redeliver_on_failure():
                                try:
                                    running.commits = self.ctx.db.database.commits
                                    result = await fn(self.ctx, *args, **kwargs)
                                except Exception:
                                    ended = time.monotonic()
                                    await self._keep_state()
                                    raise
                                ended = time.monotonic()
                                await self.registry.hub.save(self.ctx)  # the state too
                except ActorTakenOver as e:
                    if self._wrote_nothing(writes, commits):  # the fence refused it all
                        self._count_takeover()
                        raise NotServing(f"actor {self.actor_id}: {e}") from e
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

    @contextmanager
    def _cut_off_by_stop(self, writes: Writes) -> Iterator[_Running]:
        """Around a call's user code: a stop that waited `stop_grace` for it cancels it here
        (`_cut_off`), and the call fails with `CallCutOff` (an `ActorStopped`). `writes`: what the
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
        self._calls.add(scope)
        try:
            with scope, noting_rollbacks() as rolled_back:
                yield running
        finally:
            self._calls.discard(scope)
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
                f"actor {self.actor_id} stopped ({self._stopping}) while this call ran: it was "
                f"cancelled after the stop waited stop_grace ({self.definition.stop_grace:g} s) "
                f"for it{what}"
            )

    def _unsaved_since(self, commits: int) -> bool:
        """Whether a state change made by a call that began when the database had made
        `commits` commits may be, or may have been, persisted by another than the call: the
        state holds changes not yet saved (the stop saves them), or something committed since
        (each commit saves the state as it is)."""
        if self.ctx.db.database.commits != commits:
            return True
        try:
            return self.ctx.db.state.changed() is not None
        except Exception:  # a state that does not encode: whether a save writes it is unknown
            return True

    async def send(self, message: Outgoing) -> int:
        """Append `message` to this instance's queue, as a call would: refused (`NotServing`)
        if the instance stopped or was taken over elsewhere since its last check, and the
        instance does not go to sleep under it."""
        async with self._serving():
            return await self.ctx.queue.append(message)

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        """Around a call or a send: refused (`NotServing`: the registry wakes a fresh instance)
        unless the instance serves and is current; while it runs the instance is active, so it
        does not go to sleep; a takeover or stop met inside tears the instance down."""
        if not self.serving():
            raise NotServing(f"actor {self.actor_id} is {self.phase.value}")
        await self._check_current()
        if not self.serving():  # it began to stop while the check above waited
            raise NotServing(f"actor {self.actor_id} is {self.phase.value}")
        self.active += 1
        outer = calling_connection.set(None)  # a connection is `ctx.conn` in its actor alone
        try:
            yield
        except (ActorTakenOver, ActorStopped) as e:
            if self._stopping is None:
                self._requested = "crash"
            if isinstance(e, ActorTakenOver):
                self._count_takeover()
            raise
        finally:
            calling_connection.reset(outer)
            self.active -= 1
            self.last_active = time.monotonic()
            if self.active == 0:
                self._idle.set()
                self._idle = anyio.Event()
            if self._requested is not None and self.active == 0 and not self._run_active:
                self.registry.spawn(self.stop, self._requested)

    async def _keep_state(self) -> None:
        """After an action raised: commit the state it changed outside a transaction now, as
        SQL it ran outside one is committed, so the failed call's answer can say it wrote. (Left
        in memory, the change was committed later by whichever call saved next.) A failure here
        is logged: the action's own error is the answer."""
        if self.ctx.db.database.is_dead:
            return
        try:
            await self.ctx.db.save_state()
        except Exception:
            log.exception("actor %s: state of a failed action not saved", self.actor_id)

    def _wrote_nothing(self, writes: Writes, commits: int) -> bool:
        """Nothing of the call can have landed: it committed nothing, and neither did anything
        else on this instance while it ran (another call's commit saves the shared state, with
        this call's changes to it)."""
        return writes.state() is False and self.ctx.db.database.commits == commits

    async def _answer_current(self, ended: float, writes: Writes, commits: int) -> None:
        """Acknowledge a call only if the actor was still this instance's after the call's code
        ended (`_owned_since`). Else the answer may come from stale memory: a no-op write
        (`state["v"] = 1` when memory holds 1 and the store 2) or a read. A call that wrote
        nothing runs again on a fresh instance (`NotServing`); one whose writes may have landed
        is refused with `ActorTakenOver`, as running it again could apply them twice."""
        if await self._owned_since(ended):
            return
        if not self._wrote_nothing(writes, commits):
            raise ActorTakenOver(
                f"actor {self.actor_id} was taken over elsewhere while this call ran, "
                "after writes of this instance committed; its answer may be stale"
            )
        raise NotServing(f"actor {self.actor_id} was taken over elsewhere")

    async def _check_current(self) -> None:
        """Refuse the call before it runs (`NotServing`: the registry wakes a fresh instance,
        which takes the actor back) unless this instance was known to own the actor less than
        `FRESHNESS_S` ago."""
        if not await self._owned_since(time.monotonic() - FRESHNESS_S):
            raise NotServing(f"actor {self.actor_id} was taken over elsewhere")

    async def _owned_since(self, since: float) -> bool:
        """Whether this instance owned the actor at some moment after `since`: a commit since
        then passed the fence, or a generation read begun since then says so (one KV read,
        shared by the calls that wait for it). False once a takeover was found, which tears the
        instance down (counted once)."""
        while max(self._checked_at, self.ctx.db.proven_at) < since:
            if self._taken_over:
                return False
            if self._checking is not None:
                await self._checking.wait()
                continue
            self._checking = checking = anyio.Event()
            started = time.monotonic()
            try:
                generation = await self.registry.workers.run(self.kv.generation)
            finally:
                self._checking = None
                checking.set()
            if generation != self.ctx.db.database.generation:
                self._taken_over, self._requested = True, "crash"
                self._count_takeover()
                return False
            self._checked_at = max(self._checked_at, started)
        return True

    def _count_takeover(self) -> None:
        """Count this instance as taken over (`takeovers`): once, however many of its calls
        meet the takeover."""
        if not self._takeover_counted:
            self._takeover_counted = True
            self.registry.counters["takeovers"] += 1

    def serving(self) -> bool:
        """Running, not torn down by a failure, and its database alive (it may have died in a
        background dispatch): new calls may use this instance, else they get a fresh one."""
        return (
            self.phase is Phase.RUNNING
            and self._requested != "crash"
            and not self.ctx.db.database.is_dead
        )

    def stop_reason(self) -> Stop:
        """How to stop now: as requested, else a crash if the database died, else a sleep."""
        if self._requested is None and self.ctx.db.database.is_dead:
            return "crash"
        return self._requested or "sleep"

    def request_sleep(self) -> None:
        self._requested = self._requested or "sleep"
        if self._run_scope is not None:
            self._run_scope.cancel()

    def request_destroy(self) -> None:
        if self._requested != "crash":
            self._requested = "destroy"
        if self._run_scope is not None:
            self._run_scope.cancel()

    def connections(self) -> list[Connection]:
        return self.registry.hub.connections(self.actor_id)

    def broadcast(self, event: str, args: tuple[Any, ...]) -> int:
        return self.registry.hub.broadcast(self.actor_id, event, args)

    def client(self) -> Any:
        return self.registry.client()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait for a message or a deadline: the actor may sleep meanwhile."""
        self.waits += 1
        try:
            yield
        finally:
            self.waits -= 1
            self.last_active = time.monotonic()

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
        busy_run = self._run_active and not self.waits
        due = self.next_due is not None and self.next_due <= time.time()
        if self.phase is not Phase.RUNNING or self.active or busy_run or self._dispatching or due:
            return None
        return time.monotonic() - self.last_active

    # -- schedules --------------------------------------------------------------------------

    def _lease_target(self, next_run: float | None, now: float) -> Lease:
        """The lease entry to publish at `now` (`ownership.py`, which every registry of the
        store reads) for a next run at `next_run`: the one published already if it still does
        (no write), else a fresh one.

        Invariants, while this instance holds a lease (from its takeover, before any hook runs,
        until it goes to sleep):
        - `until` lies in [now + lease / 2, now + lease]: the registry's housekeeping renews it
          (`lease_lapsing`) with half of it still to go, so other registries forward calls here
          rather than take the actor over. Only an event loop stalled that long, or clocks that
          disagree by as much, let another registry find it run out;
        - with a run pending, `due` is `max(next_run, until)`: never due while the lease is
          live, so no other registry's poll takes the actor from a healthy owner (it would run
          a due schedule a second time); and if this process dies, the actor is woken on time
          for its schedule or at most one lease after the death, whichever is later. Schedules
          stay at least once across crashes: one cut short by the crash runs again.
        Without a lease (going to sleep), `due` is exactly `next_run` and there is no owner;
        gone to sleep with its sockets held here (`holding`), it keeps the lease, and `due` is
        exactly `next_run` all the same, since only this registry's poll may wake it then
        (`holds.py`).
        """
        lease = self._lease
        if not lease:
            return Lease(next_run, None)
        kept = self._published.until if self._published is not None else None
        until = kept if kept is not None and now + lease / 2 <= kept <= now + lease else now + lease
        if self.holding:
            return Lease(next_run, until)
        return Lease(None if next_run is None else max(next_run, until), until)

    async def _publish(
        self,
        next_run: float | None,
        *,
        then: Callable[[], T] | None = None,
        upkeep: bool = True,
    ) -> T | None:
        """Write the lease entry for `next_run` unless it is there already, then run `then` in the
        same worker hop and return its result; on the registry's upkeep threads unless `upkeep` is
        False (a wake, which a call waits for, shares the actors' pool). One write at a time, so
        what `_published` says is what the index holds; None while that is unknown (before the first
        write, and after one that failed: it may have landed), which makes the next write read the
        entries first (`Ownership.publish`)."""
        async with self._publishing:
            target = self._lease_target(next_run, time.time())
            previous = self._published
            hop = self.registry.workers.upkeep if upkeep else self.registry.workers.run
            if target == previous:
                return None if then is None else await hop(then)
            ownership, definition, generation = (
                self.registry.ownership,
                self.definition,
                self.generation,
            )

            def write() -> T | None:
                ownership.publish(
                    self.actor_id, generation, definition.name, self.key, target, previous
                )
                return None if then is None else then()

            try:
                result = await hop(write)
            except BaseException:
                self._published = None
                raise
            self._published = target
            return result

    def _next_run(self, now: float, run_pending: bool | None = None) -> float | None:
        """When the actor must run next: its next schedule, or `now` while its run handler has
        work (`_run_pending`, or `run_pending` as it was before a stop), so that a workflow or
        a busy run handler cut off by a graceful stop resumes on the next registry at once, and
        after a crash within one lease (`_lease_target`)."""
        pending = self._run_pending() if run_pending is None else run_pending
        if pending:
            return now if self.next_due is None else min(self.next_due, now)
        return self.next_due

    async def announce_wake(self, due: float) -> None:
        """Before committing a schedule row due at `due`: make sure its lease entry covers it
        should this instance die (see `_lease_target`). Written ahead of the commit, so a crash in
        between can only cause an early (harmless) wake, never a missed one; `refresh_wake` sets
        the time after the commit."""
        next_run = self._next_run(time.time())
        await self._publish(due if next_run is None else min(due, next_run))

    async def refresh_wake(self) -> None:
        """Record the next due schedule here and in the actor's durable lease entry."""
        rows = await self.ctx.db.locked(
            lambda c: c.execute("SELECT min(due) FROM _pagekv_schedule").fetchall(), internal=True
        )
        self.next_due = cast(float | None, rows[0][0])
        await self.publish_wake()

    async def publish_wake(self) -> None:
        """Write the lease entry for `_next_run` unless it is there already."""
        await self._publish(self._next_run(time.time()))

    async def renew_lease(self) -> None:
        """The registry's housekeeping renews the lease with this. A renewal that comes after
        the lease ran out (the process was stopped, or its event loop stalled, that long) first
        proves this instance still owns the actor (one generation read): one taken over
        meanwhile finds out here and is torn down, rather than believe it owns the actor until
        a call shows otherwise. On time, no registry that routes takes a leased actor, so no
        read is needed."""
        published = self._published
        late = published is None or published.until is None or published.until <= time.time()
        if not late or await self._owned_since(time.monotonic() - FRESHNESS_S):
            await self.publish_wake()
        elif self.active == 0 and not self._run_active:
            await self.stop("crash")

    def lease_lapsing(self, now: float) -> bool:
        """The lease entry must move on (its lease runs short, or the next run changed) and no
        write of it is under way. Only an instance that serves or goes to sleep renews (it may
        still finish a due schedule): one torn down by a crash leaves its lease to run out, so
        the actor is woken elsewhere, and a destroyed one must not write its entry back."""
        return (
            self._stopping in (None, "sleep")
            and self.stop_reason() != "crash"
            and not self._publishing.locked()
            and self._lease_target(self._next_run(now), now) != self._published
        )

    async def _release_wake(self, run_pending: bool) -> None:
        """Going to sleep: give the lease up, so the next call is served wherever it arrives,
        and publish exactly the time the actor must run next (`_next_run`, with the run handler
        as it was before the stop), so the actor is woken on time rather than a lease late.
        With connections open here, keep the lease instead, which the registry then renews
        (`holds.py`): the actor must wake where its sockets are."""
        self.holding = self.registry.holds_sockets(self.actor_id)
        if not self.holding:
            self._lease = 0.0
        self.released_due = self._next_run(time.time(), run_pending)
        await self._publish_logged(self.released_due)

    @property
    def published(self) -> Lease | None:
        """What its lease entry holds, once written; None while that is unknown."""
        return self._published

    async def _publish_logged(self, next_run: float | None) -> None:
        """`_publish`, with a store error logged, not raised: the lease left behind still wakes
        the actor, at most one lease late."""
        try:
            await self._publish(next_run)
        except KvError:
            log.exception("actor %s: lease entry not written; woken a lease late", self.actor_id)

    async def dispatch_due(self) -> None:
        """Run every due schedule (at least once), then move the wake time on."""
        if self._dispatching or self.phase is not Phase.RUNNING:
            return
        self._dispatching = True
        try:
            now = time.time()
            due = await self.ctx.db.locked(
                lambda c: cast(
                    list[tuple[str, float, str, bytes, float | None]],
                    c.execute(
                        "SELECT id, due, action, args, every FROM _pagekv_schedule WHERE due <= ? "
                        "ORDER BY due, id",
                        (now,),
                    ).fetchall(),
                ),
                internal=True,
            )
            for event_id, when, action, args, every in due:
                if not await self.ctx.db.locked(
                    partial(_still_scheduled, event_id=event_id, due=when), internal=True
                ):
                    continue  # cancelled (or moved) by an event of this same round
                try:
                    if action == WORKFLOW_WAKE:
                        self.start_run()
                    else:
                        call_args = tuple(cbor2.loads(args))
                        fn = self.definition.resolve(action, call_args, {})
                        await self.call(fn, call_args, {}, answered=False)
                except (ActorTakenOver, ActorStopped):
                    raise
                except STORAGE_ERRORS as e:
                    log.warning("actor %s: scheduled %s stays due: %s", self.actor_id, action, e)
                    return
                except Exception:
                    log.exception("actor %s: scheduled %s failed", self.actor_id, action)
                await self.ctx.db.locked(
                    partial(_settle, event_id=event_id, due=when, every=every), internal=True
                )
            await self.refresh_wake()
        except (ActorTakenOver, ActorStopped) as e:
            log.info("actor %s: dispatch ended by the instance stopping: %s", self.actor_id, e)
            self._requested = "crash" if isinstance(e, ActorTakenOver) else self._requested
        finally:
            self._dispatching = False
            self.last_active = time.monotonic()

    # -- stop -------------------------------------------------------------------------------

    async def stop(self, how: Stop) -> Stop:
        """Sleep, destroy or tear down after a crash; idempotent. Returns how the instance
        stopped: another way than `how` if it was stopping already (this call waited for it).
        `stopped` is set only once all of it is done, the drop and the index of a destroy too,
        so a wake that waited for it never meets a destroy half done."""
        if self.phase in (Phase.STOPPING, Phase.STOPPED):
            await self.stopped.wait()
            return self._stopping or "crash"
        self.phase = Phase.STOPPING
        self._stopping = how
        try:
            await self._stop(how)
        finally:
            self.stopped.set()
        return how

    async def _stop(self, how: Stop) -> None:
        """The stop spends at most `stop_grace` on user code, from its start: it waits that
        long for the calls in flight and the run handler (cancelled at once), then cancels what
        is left of them and runs the stop hook with what is left of the time.

        Invariant: nothing acknowledged is lost, nothing half-written is saved. A call is
        acknowledged only once its state was saved, so the stop's own save may only add to that;
        a transaction cancelled here rolls back, state and SQL, before it releases the database
        lock, so the save after it writes no part of it. Should the cancelled work not unwind
        within `UNWIND_S` (user code shielded from cancellation, a store that does not answer),
        the hook and the save are skipped, keeping the last committed state, since what memory
        then holds may be a transaction's unfinished work: the stop never waits on its lock."""
        with anyio.CancelScope(shield=True):
            destroyed = False
            run_pending = self._run_pending()  # before `stop_run` cancels its waits
            deadline = anyio.current_time() + self.definition.stop_grace
            try:
                with anyio.move_on_at(deadline):
                    await self.stop_run()
                    while self.active:
                        await self._idle.wait()
                if await self._cut_off():
                    await self._stop_hooks(how, deadline)
                if how == "sleep":
                    await self._release_wake(run_pending)
            finally:
                try:
                    await self._close()
                    if how == "destroy":
                        generation = self.ctx.db.database.generation
                        await self.registry.workers.run(partial(self.kv.drop, fence=generation))
                        destroyed = True
                except FenceMismatch as e:
                    raise ActorTakenOver(
                        f"actor {self.actor_id} was taken over elsewhere; not destroyed: {e}"
                    ) from e
                finally:
                    await self.registry.forget(self, how=how, destroyed=destroyed)

    async def _cut_off(self) -> bool:
        """Cancel the calls and the run handler still running once the stop's grace is over,
        and wait for them to unwind (a transaction rolls back as it does); True once none is
        left, False if some still runs after `UNWIND_S`."""
        if not self.active and not self._run_active:
            return True
        log.warning(
            "actor %s: cancelling %d call(s)%s still running after stop_grace (%g s)",
            self.actor_id,
            len(self._calls),
            " and its run handler" if self._run_active else "",
            self.definition.stop_grace,
        )
        for scope in self._calls:
            scope.cancel()
        if self._run_scope is not None:
            self._run_scope.cancel()
        with anyio.move_on_after(UNWIND_S):
            if self._run_active:
                await self._run_ended.wait()
            while self.active:
                await self._idle.wait()
            return True
        log.error(
            "actor %s: work still running %g s after it was cancelled; stopping without the "
            "stop hook or a save (the last committed state stands)",
            self.actor_id,
            UNWIND_S,
        )
        return False

    async def _stop_hooks(self, how: Stop, deadline: float) -> None:
        """Run the stop hook until `deadline` (the end of the stop's grace), then save the
        state; a hook that fails or is cut off is logged and skips the save, as a failed action
        keeps only what it committed."""
        hooks, ctx = self.definition.hooks, self.ctx
        match how:
            case "sleep":
                hook: Callable[..., Awaitable[Any]] | None = hooks.get("on_sleep")
            case "destroy":
                hook = hooks.get("on_destroy")
            case "crash":
                return
            case _:
                assert_never(how)
        try:
            if hook is not None:
                with anyio.move_on_at(deadline) as scope:
                    await hook(ctx)
                if scope.cancelled_caught:
                    log.warning(
                        "actor %s: stopping (%s) with its hook cut off at stop_grace (%g s)",
                        self.actor_id,
                        how,
                        self.definition.stop_grace,
                    )
                    return
            await self.registry.hub.save(ctx)  # the state too
        except Exception:
            log.exception("actor %s: stopping (%s) despite a failed hook", self.actor_id, how)

    async def _close(self) -> None:
        """Close the database."""
        self.phase = Phase.STOPPED
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            await ctx.db.close()


def _fenced_off(error: BaseException) -> bool:
    """Whether a database died of a takeover elsewhere: a `FenceMismatch`, or a
    `DatabaseDead` that says it was fenced, anywhere in `error`'s chain."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, FenceMismatch) or (
            isinstance(current, DatabaseDead) and current.fenced
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def _still_scheduled(connection: Any, event_id: str, due: float) -> bool:
    rows = connection.execute(
        "SELECT 1 FROM _pagekv_schedule WHERE id = ? AND due = ?", (event_id, due)
    ).fetchall()
    return bool(rows)


def _settle(connection: Any, event_id: str, due: float, every: float | None) -> None:
    """After a dispatch: drop a one-shot event, or move a recurring one to its next time."""
    if every is None:
        connection.execute("DELETE FROM _pagekv_schedule WHERE id = ? AND due = ?", (event_id, due))
    else:
        connection.execute(
            "UPDATE _pagekv_schedule SET due = ? WHERE id = ? AND due = ?",
            (next_due(due, every, time.time()), event_id, due),
        )
