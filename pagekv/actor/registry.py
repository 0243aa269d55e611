"""The registry: the actors a process serves, addressed by (name, key).

Which actors exist is recorded in a registry namespace of the same KV store, so several
registries (processes, hosts) sharing a store agree on it; each actor's data lives in its own
namespace, `actor_id = name/quoted-key`. Who owns an awake actor, and when a sleeping one
wakes, is its lease entry there (`directory/leases.py`).

The registry holds the definitions, starts and stops serving (`run`, `drain`), and is where
calls, sends, creates and destroys enter; which instance serves them, woken here or owned by
another registry, is its placement's (`placement.py`), and what runs on a clock (idle sleep,
lease renewals, due wakes) its housekeeping's (`housekeeping.py`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskGroup

from pagekv.actor import call_chain
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.directory.leases import LEASE_S, Forwarded, Member, Ownership
from pagekv.actor.directory.records import REGISTRY_NAMESPACE, actor_id, records_of
from pagekv.actor.errors import ActorStopped, ActorTakenOver, UnknownActor
from pagekv.actor.housekeeping import Housekeeping
from pagekv.actor.lifecycle.instance import ActorInstance
from pagekv.actor.lifecycle.phase import NotServing
from pagekv.actor.local_client import Client, RemoteCalls
from pagekv.actor.placement import CALL_ATTEMPTS, Placement
from pagekv.actor.queue import prepare_message
from pagekv.actor.realtime.connection import ConnectionLimits
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.realtime.socket_leases import Holds
from pagekv.actor.worker_threads import THREADS, Workers, never_waits
from pagekv.kv import DEFAULT_URL, ActorKv, KvStore, open_kv

log = logging.getLogger("pagekv.actor")


class Registry:
    """Serves `actors` on the store `kv`. `lease` (seconds) bounds how long an actor whose
    owner died stays unavailable (and how late its schedules run) before another registry of
    the store takes it over; see `LEASE_S`. `address` is where other registries reach this one
    to forward calls for the actors it owns (a server's URL); see `placement.py`. `threads`
    bounds the worker threads all its actors' blocking work shares (`worker_threads.py`).

    Invariants: it serves (`running`) only inside `run()`; the store, its registry namespace,
    the workers, the directory and the kept leases are those of the current run (set as it
    begins); a registry that drains wakes no actor and refuses forwarded calls. Fields are
    touched on the event loop only, but for `store`, `index` and `workers`, which are read
    from worker threads too and never replaced while a run lasts."""

    def __init__(
        self,
        actors: Iterable[ActorDefinition],
        kv: str | KvStore = DEFAULT_URL,
        *,
        lease: float = LEASE_S,
        address: str | None = None,
        threads: int = THREADS,
        connection_limits: ConnectionLimits | None = None,
    ) -> None:
        if lease <= 0:
            raise ValueError(f"lease must be > 0 seconds, got {lease}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._threads = threads
        self.lease = lease
        self.address = address
        """Where other registries of the store forward calls for the actors this one owns."""
        self.id = uuid.uuid4().hex
        """This registry's identity in the store's ownership entries; new on every start."""
        self.definitions: dict[str, ActorDefinition] = {}
        for definition in actors:
            if definition.name in self.definitions:
                raise ValueError(f"two actors are named {definition.name!r}")
            self.definitions[definition.name] = definition
        self._kv = kv
        self.store: KvStore
        self.ownership: Ownership
        self.workers: Workers
        self.index: ActorKv
        """The store's registry namespace: actor records and leases (`directory/`)."""
        self.holds: Holds
        """Leases kept for sleeping actors whose sockets this process holds (`socket_leases.py`)."""
        self._tg: TaskGroup | None = None
        self.draining = False
        """Stopping: forwarded calls are refused (`NotOwner`) so their senders take over."""
        self.hub = Hub(self, connection_limits or ConnectionLimits())
        """Open connections, awake or hibernating (`hub.py`)."""
        self.remote: RemoteCalls | None = None
        """How `ctx.client` reaches actors another registry owns (set by a server)."""
        self.counters: Counter[str] = Counter()
        """Wakes, sleeps, destroys, crashes, takeovers, actions, calls owned elsewhere, and
        startup phase times."""
        self.placement = Placement(self)
        """Which instance serves each actor, here or elsewhere (`placement.py`)."""
        self.housekeeping = Housekeeping(self, self.placement)
        """The background loop (`housekeeping.py`)."""

    @asynccontextmanager
    async def run(self) -> AsyncIterator[Client[Registry]]:
        """Serve the actors while the block runs; put every live instance to sleep at the end,
        which releases their leases, so the next call for each is served elsewhere at once."""
        self.id = uuid.uuid4().hex
        self.draining = False
        self.store = open_kv(self._kv) if isinstance(self._kv, str) else self._kv
        self.workers = Workers(threads=self._threads, inline=never_waits(self.store))
        self.index = await self.workers.run(self.store.namespace, REGISTRY_NAMESPACE)
        self.ownership = Ownership(self.index, self.id, self.address)
        self.holds = Holds(self.ownership, self.workers, self.lease)
        try:
            await self.workers.upkeep(self.ownership.join, time.time() + self.lease)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self.housekeeping.run)
                try:
                    yield Client(self)
                finally:
                    self.draining = True
                    self.hub.shutdown()
                    with anyio.CancelScope(shield=True):
                        await self.housekeeping.release_holds()
                        await self._stop_all()
                        # again: the leases of instances asleep as the stop began
                        await self.housekeeping.release_holds()
                        await self._leave()
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            if isinstance(self._kv, str):
                self.store.close()

    async def _leave(self) -> None:
        try:
            await self.workers.upkeep(self.ownership.leave)
        except Exception:
            log.exception("registry %s: member entry not removed; it expires", self.id)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the background; its failure is logged, never the registry's. It
        waits for nobody: its call chain starts empty, whoever spawned it."""
        assert self._tg is not None, "the registry is not running"

        async def guarded() -> None:
            call_chain.detached()
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__qualname__", fn))

        self._tg.start_soon(guarded)

    @property
    def running(self) -> bool:
        """Serving: inside `run()` and its background loop alive."""
        return self._tg is not None

    async def peers(self) -> list[Member]:
        """The other registries of the store with a live member lease."""
        members = await self.workers.upkeep(self.ownership.members, time.time())
        return [m for m in members if m.id != self.id]

    def holds_sockets(self, aid: str) -> bool:
        """Whether an instance of `aid` going to sleep keeps its lease (`socket_leases.py`): it has
        connections open here, and other registries could otherwise wake it (this one has an
        address to be forwarded to) while this one still serves."""
        return (
            self.address is not None
            and self.running
            and not self.draining
            and bool(self.hub.connections(aid))
        )

    # -- addressing -------------------------------------------------------------------------

    def definition(self, name: str) -> ActorDefinition:
        try:
            return self.definitions[name]
        except KeyError:
            known = ", ".join(sorted(self.definitions)) or "none"
            raise UnknownActor(f"no actor named {name!r} (known: {known})") from None

    async def exists(self, name: str, key: str) -> bool:
        """Whether the index records the actor (see `directory/records.py`: the data decides
        at a wake)."""
        aid = actor_id(name, key)
        return bool(await self.workers.run(records_of, self.index, aid))

    async def instance(
        self,
        name: str,
        key: str,
        *,
        create: bool,
        must_be_new: bool = False,
        input: Any = None,
        via: Forwarded | None = None,
    ) -> ActorInstance:
        """The live instance of (name, key), woken (taken over) if needed, unless another live
        registry owns it (`Placement.instance`)."""
        return await self.placement.instance(
            self.definition(name), key, create=create, must_be_new=must_be_new, input=input, via=via
        )

    async def drain(self) -> None:
        """Begin a graceful stop while calls still arrive: put every awake actor to sleep now,
        which releases its lease, so the other registries serve the next calls of each at once,
        and from then on send on the calls that would wake an actor here (`Placement`)."""
        self.draining = True
        self.hub.shutdown()
        await self.housekeeping.release_holds()
        until = time.time() + self.lease
        await self.workers.upkeep(partial(self.ownership.join, until, draining=True))
        await self._stop_all()
        await self.housekeeping.release_holds()  # of those asleep as the drain began

    async def _stop_all(self) -> None:
        """Stop every live instance at once: each stops taking calls now, and one busy with a
        long call holds up no other (each waits for its own calls, up to its `stop_grace`)."""

        async def stop(instance: ActorInstance) -> None:
            try:
                await instance.stop(instance.stop_reason())
            except Exception:
                log.exception("actor %s: stopping failed", instance.actor_id)

        async with anyio.create_task_group() as tg:
            for instance in self.placement.live():
                tg.start_soon(stop, instance)

    async def forget(self, instance: ActorInstance, *, how: str, destroyed: bool) -> None:
        """The instance stopped (`how`): it serves no more here; `destroyed`: its data is gone,
        and so are its records."""
        self.placement.forget(instance)
        self.hub.stopped(instance.actor_id, how)
        if how == "sleep" and instance.lease.holding:
            self.holds.keep(
                instance.actor_id,
                instance.definition.name,
                instance.key,
                instance.generation,
                instance.lease.released_due,
                instance.lease.published,
            )
        self.counters[{"sleep": "sleeps", "destroy": "destroys"}.get(how, "crashes")] += 1
        self.housekeeping.count_stop()
        if destroyed:
            await self.workers.run(self.placement.erase, instance.actor_id, instance.generation)

    def live(self) -> list[ActorInstance]:
        return self.placement.live()

    def metrics(self) -> dict[str, float]:
        """Counters since the registry started, plus the numbers of live actors and of open
        connections."""
        return {
            **self.counters,
            "live": len(self.placement.live()),
            "connections": self.hub.count(),
        }

    def client(self) -> Client[Registry]:
        return Client(self)

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
        via: Forwarded | None = None,
    ) -> Any:
        """Call an action, waking (or creating) the actor; an unknown action, or arguments
        that do not bind to it, are refused before the actor is woken or created."""
        fn, args, kwargs = self.definition(name).resolve(action, args, kwargs)
        return await self.invoke(name, key, fn, args, kwargs, create=create, input=input, via=via)

    async def invoke(
        self,
        name: str,
        key: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        create: bool,
        input: Any = None,
        via: Forwarded | None = None,
    ) -> Any:
        """Run `fn(ctx, *args, **kwargs)` on the actor as a call runs an action (woken or
        created if needed, run again on a fresh instance if the one found stopped first)."""
        kwargs = kwargs or {}
        for _ in range(CALL_ATTEMPTS - 1):
            instance = await self.instance(name, key, create=create, input=input, via=via)
            try:
                return await instance.call(fn, args, kwargs)
            except NotServing:
                continue
        instance = await self.instance(name, key, create=create, input=input, via=via)
        return await instance.call(fn, args, kwargs)

    async def destroy(self, name: str, key: str, *, via: Forwarded | None = None) -> None:
        """Destroy an actor, under its lock: a wake or create of it in this registry waits, and
        finds it destroyed. An instance that was already stopping another way (going to sleep)
        is woken again to be destroyed, and one taken over elsewhere meanwhile is taken back,
        up to `CALL_ATTEMPTS` times."""
        definition = self.definition(name)
        aid = actor_id(name, key)
        self.ownership.check_fits(aid)
        async with self.placement.exclusive(aid):
            for attempt in range(CALL_ATTEMPTS):
                instance = await self.placement.locked_instance(
                    definition, key, create=False, must_be_new=False, input=None, via=via
                )
                try:
                    if await instance.stop("destroy") == "destroy":
                        return
                except ActorTakenOver:
                    if attempt == CALL_ATTEMPTS - 1:
                        raise
        raise ActorStopped(f"actor {aid} kept stopping another way; not destroyed")

    async def send(
        self,
        name: str,
        key: str,
        queue: str,
        body: Any,
        *,
        create: bool,
        input: Any = None,
        via: Forwarded | None = None,
    ) -> int:
        """Enqueue a message for an actor, waking it if it sleeps; a message the queue refuses
        is refused before the actor is woken or created. An instance found taken over by
        another process hands the message to a fresh one, as a call does."""
        message = prepare_message(queue, body)
        for attempt in range(CALL_ATTEMPTS):
            instance = await self.instance(name, key, create=create, input=input, via=via)
            try:
                return await instance.send(message)
            except NotServing:
                continue
            except ActorTakenOver:  # the append is one commit, refused by the fence: retry
                if attempt == CALL_ATTEMPTS - 1:
                    raise
        raise ActorStopped(f"actor {actor_id(name, key)} kept stopping; message not sent")
