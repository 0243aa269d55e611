"""The registry: actor definitions, live instances, addressing by (name, key), idle sleep, and
ownership: which registry of the store runs each awake actor.

Which actors exist is recorded in a registry namespace of the same KV store, so several
registries (processes, hosts) sharing a store agree on it; each actor's data lives in its own
namespace, `actor_id = name/quoted-key`. Who owns an awake actor, and when a sleeping one
wakes, is its lease entry there (`ownership.py`).

Placement: a call goes to the actor's owner. A registry with an `address` (one that others can
forward calls to: a server's) that receives a call for an actor another live registry owns
raises `OwnedElsewhere` before it wakes or writes anything, and its server forwards the call.
Otherwise the actor wakes where the call arrived: when it sleeps, when its owner's lease ran
out, when the owner cannot be forwarded to (no address), or when this registry has no address
itself (in-process use: nobody could forward to it either, so it takes the actor over, as
every registry did before ownership). A forwarded call (`via`) is never forwarded again: it is
served here or refused with `NotOwner`, and the sender routes it afresh. A registry that drains
(`drain`, a graceful stop begun) wakes no actor: a call that would wake one is sent to another
registry that is not stopping (`_route_away`), and a forwarded one is refused.
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from pagekv.actor import call_chain
from pagekv.actor.blocking import THREADS, Workers, never_waits, release_free_memory
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.directory.leases import LEASE_S, Forwarded, Member, Owner, Ownership, Sleeper
from pagekv.actor.directory.records import (
    REGISTRY_NAMESPACE,
    ActorRecord,
    actor_id,
    delete_records_up_to,
    encode_record,
    record_key,
    records_of,
)
from pagekv.actor.errors import (
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    NotOwner,
    OwnedElsewhere,
    UnknownActor,
)
from pagekv.actor.handles import CallsByName
from pagekv.actor.instance import ActorInstance, NotServing
from pagekv.actor.queue import prepare_message
from pagekv.actor.realtime.client_connection import LocalConnection, Relay
from pagekv.actor.realtime.connection import ConnectionLimits
from pagekv.actor.realtime.holds import Holds
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.workflow.handle import WorkflowHandle
from pagekv.kv import DEFAULT_URL, ActorKv, KvStore, open_kv

_IDLE_CHECK_S = 0.05
_WAKE_POLL_S = 0.5
_CALL_ATTEMPTS = 3
"""Wakes a call may take when an instance stops before the call reaches it (e.g. its run
handler crashed right after the wake)."""
_MAX_OWNERS = 10_000
_TRIM_AFTER_STOPS = 32
_TRIM_EVERY_S = 1.0
"""Memory freed by instances that stopped is given back to the system (`release_free_memory`)
once this many stopped, at most once per `_TRIM_EVERY_S`: RSS then follows the actors awake, not
the number ever woken."""
_AWAIT_OWNER_POLLS = 20
"""Polls, `_IDLE_CHECK_S` apart, for the lease entry of a registry that won a wake."""
log = logging.getLogger("pagekv.actor")


class Registry:
    """Serves `actors` on the store `kv`. `lease` (seconds) bounds how long an actor whose
    owner died stays unavailable (and how late its schedules run) before another registry of
    the store takes it over; see `LEASE_S`. `address` is where other registries reach this one
    to forward calls for the actors it owns (a server's URL); see the module's docstring.
    `threads` bounds the worker threads all its actors' blocking work shares (`workers.py`)."""

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
        self.holds: Holds
        """Leases kept for sleeping actors whose sockets this process holds (`holds.py`)."""
        self._instances: dict[str, ActorInstance] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._owners: dict[str, Owner] = {}
        """Owners `_route` found elsewhere, oldest first (at most `_MAX_OWNERS`)."""
        self._tg: TaskGroup | None = None
        self.draining = False
        """Stopping: forwarded calls are refused (`NotOwner`) so their senders take over."""
        self._stops_since_trim = 0
        self.hub = Hub(self, connection_limits or ConnectionLimits())
        """Open connections, awake or hibernating (`hub.py`)."""
        self.remote: RemoteCalls | None = None
        """How `ctx.client` reaches actors another registry owns (set by a server)."""
        self.counters: Counter[str] = Counter()
        """Wakes, sleeps, destroys, crashes, takeovers, actions, calls owned elsewhere, and
        startup phase times."""

    @asynccontextmanager
    async def run(self) -> AsyncIterator[Client]:
        """Serve the actors while the block runs; put every live instance to sleep at the end,
        which releases their leases, so the next call for each is served elsewhere at once."""
        self.id = uuid.uuid4().hex
        self.draining = False
        self.store = open_kv(self._kv) if isinstance(self._kv, str) else self._kv
        self.workers = Workers(threads=self._threads, inline=never_waits(self.store))
        index = await self.workers.run(self.store.namespace, REGISTRY_NAMESPACE)
        self.ownership = Ownership(index, self.id, self.address)
        self.holds = Holds(self.ownership, self.workers, self.lease)
        self._index = index
        try:
            await self.workers.upkeep(self.ownership.join, time.time() + self.lease)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._housekeeping)
                try:
                    yield Client(self)
                finally:
                    self.draining = True
                    self.hub.shutdown()
                    with anyio.CancelScope(shield=True):
                        await self._release_holds()
                        await self._stop_all()
                        await self._release_holds()  # of instances asleep as the stop began
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

    async def _housekeeping(self) -> None:
        """Put idle instances to sleep, renew leases, dispatch due schedules, wake sleeping
        actors on time, give the memory of stopped ones back to the system.

        A round that fails (the store unreachable for a moment, say) is logged and counted
        (`housekeeping_errors`), and the next round tries again: the loop outlives any error,
        since without it no actor would sleep or wake on time again.
        """
        indexed = False
        last_poll = last_trim = 0.0
        member_until = time.time() + self.lease
        while True:
            await anyio.sleep(_IDLE_CHECK_S)
            poll = time.monotonic() - last_poll >= _WAKE_POLL_S
            if poll:
                last_poll = time.monotonic()
            try:
                now = time.time()
                self._tend_instances(now)
                for aid in self.holds.lapsing(now):
                    self.spawn(self._renew_hold, aid)
                if self._stops_since_trim >= _TRIM_AFTER_STOPS and (
                    time.monotonic() - last_trim >= _TRIM_EVERY_S
                ):
                    self._stops_since_trim, last_trim = 0, time.monotonic()
                    if await self.workers.upkeep(release_free_memory):
                        self.counters["memory_trims"] += 1
                if member_until - now < self.lease / 2:
                    member_until = now + self.lease
                    await self.workers.upkeep(
                        partial(self.ownership.join, member_until, draining=self.draining)
                    )
                if poll:
                    if not indexed:
                        await self.workers.upkeep(self.ownership.index_due_times)
                        indexed = True
                    for sleeper in await self._due_sleepers(time.time()):
                        self.spawn(self._wake, sleeper.name, sleeper.key)
            except Exception:
                self.counters["housekeeping_errors"] += 1
                log.exception("housekeeping failed; the next round tries again")

    async def _due_sleepers(self, now: float) -> list[Sleeper]:
        """The actors not awake here whose wake is due (`Ownership.due_sleepers`)."""
        awake = set(self._instances)
        return await self.workers.upkeep(self.ownership.due_sleepers, now, awake)

    def _tend_instances(self, now: float) -> None:
        """Dispatch the due schedules of live instances, renew their leases, and put idle ones
        to sleep."""
        for instance in list(self._instances.values()):
            if instance.next_due is not None and instance.next_due <= now:
                self.spawn(instance.dispatch_due)
            if instance.lease_lapsing(now):
                self.spawn(instance.renew_lease)
            if instance.sleepy():
                self.spawn(instance.sleep_if_idle)

    def holds_sockets(self, aid: str) -> bool:
        """Whether an instance of `aid` going to sleep keeps its lease (`holds.py`): it has
        connections open here, and other registries could otherwise wake it (this one has an
        address to be forwarded to) while this one still serves."""
        return (
            self.address is not None
            and self.running
            and not self.draining
            and bool(self.hub.connections(aid))
        )

    async def _renew_hold(self, aid: str) -> None:
        """Renew (or release, its connections gone) the lease a sleeping actor keeps for its
        sockets here; close them if the actor was taken over elsewhere meanwhile."""
        async with self._exclusive(aid):
            if aid in self._instances:  # woken here since: its instance holds the lease
                self.holds.drop(aid)
                return
            release = self.draining or not self.hub.connections(aid)
            if not await self.holds.renew(aid, release=release):
                self.hub.stopped(aid, "moved")

    async def _release_holds(self) -> None:
        """The registry stops: release every held lease (its sockets are closed already), so
        the other registries wake those actors at once."""
        async with anyio.create_task_group() as tg:
            for aid in self.holds.held():
                tg.start_soon(self._renew_hold, aid)

    async def _wake(self, name: str, key: str) -> None:
        """Wake an actor the poll found due, if it still is (`Ownership.still_due`)."""
        aid = actor_id(name, key)
        try:
            if await self.workers.upkeep(self.ownership.still_due, aid, time.time()):
                await self.instance(name, key, create=False)
        except ActorNotFound:
            log.info("actor %s/%s was destroyed; its lease entries are removed", name, key)
        except OwnedElsewhere:
            log.debug("actor %s/%s due, but another registry took it first", name, key)
        except Exception:
            log.exception("could not wake actor %s/%s for its schedule", name, key)

    # -- addressing -------------------------------------------------------------------------

    def definition(self, name: str) -> ActorDefinition:
        try:
            return self.definitions[name]
        except KeyError:
            known = ", ".join(sorted(self.definitions)) or "none"
            raise UnknownActor(f"no actor named {name!r} (known: {known})") from None

    async def exists(self, name: str, key: str) -> bool:
        """Whether the index records the actor (see `index.py`: the data decides at a wake)."""
        aid = actor_id(name, key)
        return bool(await self.workers.run(records_of, self._index, aid))

    @asynccontextmanager
    async def _exclusive(self, aid: str) -> AsyncIterator[None]:
        """The actor's lock in this registry: wakes, creates and destroys of one actor run one
        at a time, so in one process they are linearizable (across processes, `index.py`)."""
        lock = self._locks.get(aid)
        if lock is None:
            lock = self._locks[aid] = anyio.Lock(fast_acquire=True)
        try:
            async with lock:
                yield
        finally:
            self._drop_unused_lock(aid)

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
        registry owns it (`OwnedElsewhere`, or `NotOwner` for a forwarded call). One that
        serves is returned without the actor's lock: what the lock orders (wakes, creates,
        destroys) begins by stopping it, and a call that finds it stopping is refused there
        (`NotServing`) and comes back here."""
        definition = self.definition(name)
        aid = actor_id(name, key)
        live = self._instances.get(aid)
        if live is not None and not must_be_new and live.serving():
            return live
        self.ownership.check_fits(aid)
        async with self._exclusive(aid):
            return await self._instance(definition, key, create, must_be_new, input, via)

    async def _instance(
        self,
        definition: ActorDefinition,
        key: str,
        create: bool,
        must_be_new: bool,
        input: Any,
        via: Forwarded | None,
    ) -> ActorInstance:
        """`instance`, the actor's lock held."""
        name, aid = definition.name, actor_id(definition.name, key)
        live = self._instances.get(aid)
        if live is not None:
            if live.serving():
                if must_be_new:  # refused without touching the live instance
                    raise ActorExists(f"actor {name!r} with key {key!r} already exists")
                return live
            await live.stop(live.stop_reason())
        await self._route(aid, via, cached=True)
        for attempt in range(_CALL_ATTEMPTS):
            recorded, namespace = await self.workers.run(self._look_up, aid, create, must_be_new)
            if recorded and must_be_new:
                raise ActorExists(f"actor {name!r} with key {key!r} already exists")
            if namespace is None:
                raise ActorNotFound(f"no actor {name!r} with key {key!r}")
            await self._route(aid, via)  # just before the takeover (`ActorInstance._check_won`)
            instance = ActorInstance(self, definition, aid, key, namespace)
            try:
                await instance.start(input, create=create)
                break
            except ActorNotFound:  # recorded, but destroyed: its destroyer died before the index
                await self.workers.run(self._erase, aid, instance.generation)
                raise
            except ActorTakenOver:  # another registry woke it at the same time
                self.counters["lost_wakes"] += 1
                if attempt == _CALL_ATTEMPTS - 1 or self.address is None:
                    raise
                await self._await_owner(aid, instance.generation)
        self.counters["wakes"] += 1
        for phase, ms in instance.metrics.items():
            # Counter holds any number; typeshed types its values as int only
            self.counters[f"{phase}_total"] += ms  # type: ignore[assignment]
        if instance.created or not recorded:
            await self.workers.run(self._record, instance, recorded)
        self._instances[aid] = instance
        self.holds.drop(aid)
        if must_be_new and not instance.created:  # created elsewhere since the index was read
            raise ActorExists(f"actor {name!r} with key {key!r} already exists")
        return instance

    def _look_up(
        self, aid: str, create: bool, must_be_new: bool
    ) -> tuple[list[ActorRecord], ActorKv | None]:
        """The actor's records, and its namespace unless the records refuse the wake (in one
        worker hop): opening a namespace may create it, which a refused call must not."""
        recorded = records_of(self._index, aid)
        if (recorded and must_be_new) or (not recorded and not create):
            return recorded, None
        return recorded, self.store.namespace(aid)

    async def _await_owner(self, aid: str, generation: int) -> None:
        """After losing a wake to another registry: wait (briefly) for the winner's lease entry,
        which it writes right after its takeover, so that the call is routed to it rather than
        take the actor back. A winner that never writes it died: the call wakes it again."""
        for _ in range(_AWAIT_OWNER_POLLS):
            owner = await self.workers.run(self.ownership.owner, aid, time.time())
            if owner is not None and owner.generation > generation:
                return
            await anyio.sleep(_IDLE_CHECK_S)

    async def _route(self, aid: str, via: Forwarded | None, *, cached: bool = False) -> None:
        """Before a wake here: refuse it if another live registry that can be forwarded to owns
        the actor (see the module's docstring). An owner that advertised this registry's own
        address is a registry that died here (one process listens at an address, and this one
        took it over): its lease is as good as run out.

        `cached`: an owner found less than half a lease ago may be believed without a read
        (`_owners`), as a call forwarded to an owner that let the actor go is refused or
        served there; the forwarder drops it when it fails (`forget_owner`). The check just
        before a takeover always reads."""
        if via is not None and self.draining:
            raise NotOwner(f"actor {aid}: this registry is stopping")
        if self.address is None:
            return
        now = time.time()
        owner = self._owners.get(aid) if cached and via is None else None
        if owner is None or owner.until - now < self.lease / 2:
            owner = await self.workers.run(self.ownership.owner, aid, now)
        if owner is None or owner.address is None or owner.address == self.address:
            self._owners.pop(aid, None)
            if self.draining:  # it would wake here
                await self._route_away(aid)
            return
        if via is not None:
            raise NotOwner(f"actor {aid} is owned by the registry at {owner.address}, not here")
        self._owners.pop(aid, None)
        self._owners[aid] = owner
        if len(self._owners) > _MAX_OWNERS:
            del self._owners[next(iter(self._owners))]
        self.counters["owned_elsewhere"] += 1
        raise OwnedElsewhere(f"actor {aid} is owned by the registry at {owner.address}", aid, owner)

    async def locate(self, name: str, key: str) -> None:
        """Raise `OwnedElsewhere` if another live registry owns the actor and it is not awake
        here: for reads that want the owner's view of it (the inspector's)."""
        aid = actor_id(name, key)
        live = self._instances.get(aid)
        if live is None or not live.serving():
            await self._route(aid, None, cached=True)

    async def drain(self) -> None:
        """Begin a graceful stop while calls still arrive: put every awake actor to sleep now,
        which releases its lease, so the other registries serve the next calls of each at once,
        and from then on send on the calls that would wake an actor here (`_route_away`)."""
        self.draining = True
        self.hub.shutdown()
        await self._release_holds()
        until = time.time() + self.lease
        await self.workers.upkeep(partial(self.ownership.join, until, draining=True))
        await self._stop_all()
        await self._release_holds()  # of instances asleep as the drain began

    async def _stop_all(self) -> None:
        """Stop every live instance at once: each stops taking calls now, and one busy with a
        long call holds up no other (each waits for its own calls, up to its `stop_grace`)."""

        async def stop(instance: ActorInstance) -> None:
            try:
                await instance.stop(instance.stop_reason())
            except Exception:
                log.exception("actor %s: stopping failed", instance.actor_id)

        async with anyio.create_task_group() as tg:
            for instance in list(self._instances.values()):
                tg.start_soon(stop, instance)

    async def _route_away(self, aid: str) -> None:
        """While draining: a call that would wake `aid` here goes to another running registry
        with an address (`OwnedElsewhere`, which wakes it there), chosen by the actor id so
        that one actor's calls agree; with none, it wakes here (and sleeps at the stop)."""
        live = await self.peers()
        peers = sorted((m for m in live if m.address and not m.draining), key=lambda m: m.id)
        if not peers:
            return
        peer = peers[zlib.crc32(aid.encode()) % len(peers)]
        self.counters["owned_elsewhere"] += 1
        raise OwnedElsewhere(
            f"actor {aid}: this registry is stopping; sent to the one at {peer.address}",
            aid,
            Owner(peer.id, peer.address, peer.until, -1),
        )

    def forget_owner(self, aid: str) -> None:
        """A call forwarded to the owner `_route` named did not get through: read it again."""
        self._owners.pop(aid, None)

    def _record(self, instance: ActorInstance, recorded: list[ActorRecord]) -> None:
        """Record an actor this instance created (or found without a record), before it serves
        anything; records of older generations describe data that is gone if it created it."""
        aid, generation = instance.actor_id, instance.generation
        value = encode_record(instance.definition.name, instance.key, generation)
        stale = [record_key(aid, r.generation) for r in recorded if instance.created]
        self._index.write(put={record_key(aid, generation): value}, delete=stale)

    def _drop_unused_lock(self, aid: str) -> None:
        """Forget the lock of an actor that is not awake here and that no call waits for, so
        the locks do not grow with every key ever called."""
        lock = self._locks.get(aid)
        if (
            lock is not None
            and aid not in self._instances
            and not lock.locked()
            and not lock.statistics().tasks_waiting
        ):
            del self._locks[aid]

    async def forget(self, instance: ActorInstance, *, how: str, destroyed: bool) -> None:
        if self._instances.get(instance.actor_id) is instance:
            del self._instances[instance.actor_id]
            self._drop_unused_lock(instance.actor_id)
        self.hub.stopped(instance.actor_id, how)
        if how == "sleep" and instance.holding:
            self.holds.keep(
                instance.actor_id,
                instance.definition.name,
                instance.key,
                instance.generation,
                instance.released_due,
                instance.published,
            )
        self.counters[{"sleep": "sleeps", "destroy": "destroys"}.get(how, "crashes")] += 1
        self._stops_since_trim += 1
        if destroyed:
            await self.workers.run(self._erase, instance.actor_id, instance.generation)

    def _erase(self, aid: str, generation: int) -> None:
        """Remove what the index holds of an actor whose data is gone, as of `generation`: its
        records and lease entries of that generation and older ones. Newer ones belong to an
        actor created again since (see `index.py`), and stay."""
        self.ownership.erase(aid, generation)
        delete_records_up_to(self._index, aid, generation)

    def live(self) -> list[ActorInstance]:
        return list(self._instances.values())

    def metrics(self) -> dict[str, float]:
        """Counters since the registry started, plus the numbers of live actors and of open
        connections."""
        return {**self.counters, "live": len(self._instances), "connections": self.hub.count()}

    def client(self) -> Client:
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
        fn = self.definition(name).resolve(action, args, kwargs)
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
        for _ in range(_CALL_ATTEMPTS - 1):
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
        up to `_CALL_ATTEMPTS` times."""
        definition = self.definition(name)
        aid = actor_id(name, key)
        self.ownership.check_fits(aid)
        async with self._exclusive(aid):
            for attempt in range(_CALL_ATTEMPTS):
                instance = await self._instance(definition, key, False, False, None, via)
                try:
                    if await instance.stop("destroy") == "destroy":
                        return
                except ActorTakenOver:
                    if attempt == _CALL_ATTEMPTS - 1:
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
        for attempt in range(_CALL_ATTEMPTS):
            instance = await self.instance(name, key, create=create, input=input, via=via)
            try:
                return await instance.send(message)
            except NotServing:
                continue
            except ActorTakenOver:  # the append is one commit, refused by the fence: retry
                if attempt == _CALL_ATTEMPTS - 1:
                    raise
        raise ActorStopped(f"actor {actor_id(name, key)} kept stopping; message not sent")


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


class ActorHandle(CallsByName):
    """Calls actions of one actor by name; re-resolves the actor on every call. An actor that
    another registry owns is reached through `Registry.remote` when the registry has one (a
    server's: `ctx.client` across hosts), else `OwnedElsewhere` is raised."""

    def __init__(self, registry: Registry, name: str, key: str, *, create: bool, input: Any):
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


class Client:
    """In-process client of a running registry."""

    def __init__(self, registry: Registry) -> None:
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
