"""Placement: which registry serves each actor, and the one live instance that serves it here.

A call goes to the actor's owner. A registry with an `address` (one that others can forward
calls to: a server's) that receives a call for an actor another live registry owns raises
`OwnedElsewhere` before it wakes or writes anything, and its server forwards the call.
Otherwise the actor wakes where the call arrived: when it sleeps, when its owner's lease ran
out, when the owner cannot be forwarded to (no address), or when this registry has no address
itself (in-process use: nobody could forward to it either, so it takes the actor over, as
every registry did before ownership). A forwarded call (`via`) is never forwarded again: it is
served here or refused with `NotOwner`, and the sender routes it afresh. A registry that drains
(`drain`, a graceful stop begun) wakes no actor: a call that would wake one is sent to another
registry that is not stopping (`_route_away`), and a forwarded one is refused.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio

from pagekv.actor.definition import ActorDefinition
from pagekv.actor.directory.leases import Forwarded, Member, Owner
from pagekv.actor.directory.records import (
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
    ActorTakenOver,
    NotOwner,
    OwnedElsewhere,
)
from pagekv.actor.lifecycle.instance import ActorInstance
from pagekv.actor.lifecycle.instance_ports import InstanceHost
from pagekv.actor.realtime.socket_leases import Holds
from pagekv.kv import ActorKv, KvStore

CALL_ATTEMPTS = 3
"""Wakes a call may take when an instance stops before the call reaches it (e.g. its run
handler crashed right after the wake)."""
_MAX_OWNERS = 10_000
_AWAIT_OWNER_POLLS = 20
_AWAIT_OWNER_EVERY_S = 0.05
"""Polls, this far apart, for the lease entry of a registry that won a wake."""


class PlacementHost(InstanceHost, Protocol):
    """What placement reads of its registry, besides what the instances it wakes do: where
    others forward to it, whether it drains, the store and its registry namespace (actor
    records, leases), the leases it keeps for sockets, and the other live registries."""

    address: str | None
    draining: bool
    store: KvStore
    index: ActorKv
    holds: Holds

    async def peers(self) -> list[Member]: ...


class Placement:
    """Which instance serves each actor in this process, and when another registry does.

    Why apart from the registry: the rules of who serves a call (wake here, refuse, send on)
    and the locking that makes a wake safe are one concern, read and changed together; the
    registry only addresses actors by name and runs their calls on what this returns.

    Invariants:
    - At most one live instance per actor id in this process (`_instances`): one is added only
      under the actor's lock (`exclusive`), after any older one stopped, and removed by its own
      stop (`forget`).
    - Wakes, creates and destroys of one actor run one at a time here (the lock); across
      processes the directory's leases decide (`ActorInstance._take_lease`).
    - A call is answered by the owner or forwarded, never served by two: before a wake here,
      an owner that another live registry with an address holds is refused (`_route`), read
      afresh just before the takeover.
    - A lock is kept only while its actor is awake here or someone holds or waits for it, so
      the locks do not grow with every key ever called.

    Fields: every one is touched on the event loop only.
    """

    def __init__(self, host: PlacementHost) -> None:
        self._host = host
        self._instances: dict[str, ActorInstance] = {}
        """The live instance of each actor awake here (event loop only; added under the
        actor's lock)."""
        self._locks: dict[str, anyio.Lock] = {}
        """Each actor's lock in this registry (event loop only)."""
        self._owners: dict[str, Owner] = {}
        """Owners `_route` found elsewhere, oldest first (at most `_MAX_OWNERS`; event loop
        only)."""

    def live(self) -> list[ActorInstance]:
        return list(self._instances.values())

    def awake(self, aid: str) -> bool:
        """Whether an instance of `aid` lives here (serving or stopping)."""
        return aid in self._instances

    @asynccontextmanager
    async def exclusive(self, aid: str) -> AsyncIterator[None]:
        """The actor's lock in this registry: wakes, creates and destroys of one actor run one
        at a time, so in one process they are linearizable (across processes, its lease
        entries: `directory/leases.py`)."""
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
        definition: ActorDefinition,
        key: str,
        *,
        create: bool,
        must_be_new: bool,
        input: Any,
        via: Forwarded | None,
    ) -> ActorInstance:
        """The live instance of the actor, woken (taken over) if needed, unless another live
        registry owns it (`OwnedElsewhere`, or `NotOwner` for a forwarded call). One that
        serves is returned without the actor's lock: what the lock orders (wakes, creates,
        destroys) begins by stopping it, and a call that finds it stopping is refused there
        (`NotServing`) and comes back here."""
        aid = actor_id(definition.name, key)
        live = self._instances.get(aid)
        if live is not None and not must_be_new and live.serving():
            return live
        self._host.ownership.check_fits(aid)
        async with self.exclusive(aid):
            return await self.locked_instance(
                definition, key, create=create, must_be_new=must_be_new, input=input, via=via
            )

    async def locked_instance(
        self,
        definition: ActorDefinition,
        key: str,
        *,
        create: bool,
        must_be_new: bool,
        input: Any,
        via: Forwarded | None,
    ) -> ActorInstance:
        """`instance`, the actor's lock held (`exclusive`)."""
        host = self._host
        name, aid = definition.name, actor_id(definition.name, key)
        live = self._instances.get(aid)
        if live is not None:
            if live.serving():
                if must_be_new:  # refused without touching the live instance
                    raise ActorExists(f"actor {name!r} with key {key!r} already exists")
                return live
            await live.stop(live.stop_reason())
        await self._route(aid, via, cached=True)
        for attempt in range(CALL_ATTEMPTS):
            recorded, namespace = await host.workers.run(self._look_up, aid, create, must_be_new)
            if recorded and must_be_new:
                raise ActorExists(f"actor {name!r} with key {key!r} already exists")
            if namespace is None:
                raise ActorNotFound(f"no actor {name!r} with key {key!r}")
            await self._route(aid, via)  # just before the takeover (`ActorInstance._take_lease`)
            instance = ActorInstance(host, definition, aid, key, namespace)
            try:
                await instance.start(input, create=create)
                break
            except ActorNotFound:  # recorded, but destroyed: its destroyer died before the index
                await host.workers.run(self.erase, aid, instance.generation)
                raise
            except ActorTakenOver:  # another registry woke it at the same time
                host.counters["lost_wakes"] += 1
                if attempt == CALL_ATTEMPTS - 1 or host.address is None:
                    raise
                await self._await_owner(aid, instance.generation)
        host.counters["wakes"] += 1
        for phase, ms in instance.starter.metrics.items():
            # Counter holds any number; typeshed types its values as int only
            host.counters[f"{phase}_total"] += ms  # type: ignore[assignment]
        if instance.created or not recorded:
            await host.workers.run(self._record, instance, recorded)
        self._instances[aid] = instance
        host.holds.drop(aid)
        if must_be_new and not instance.created:  # created elsewhere since the index was read
            raise ActorExists(f"actor {name!r} with key {key!r} already exists")
        return instance

    def _look_up(
        self, aid: str, create: bool, must_be_new: bool
    ) -> tuple[list[ActorRecord], ActorKv | None]:
        """The actor's records, and its namespace unless the records refuse the wake (in one
        worker hop): opening a namespace may create it, which a refused call must not."""
        recorded = records_of(self._host.index, aid)
        if (recorded and must_be_new) or (not recorded and not create):
            return recorded, None
        return recorded, self._host.store.namespace(aid)

    async def _await_owner(self, aid: str, generation: int) -> None:
        """After losing a wake to another registry: wait (briefly) for the winner's lease entry,
        which it writes right after its takeover, so that the call is routed to it rather than
        take the actor back. A winner that never writes it died: the call wakes it again."""
        for _ in range(_AWAIT_OWNER_POLLS):
            owner = await self._host.workers.run(self._host.ownership.owner, aid, time.time())
            if owner is not None and owner.generation > generation:
                return
            await anyio.sleep(_AWAIT_OWNER_EVERY_S)

    async def _route(self, aid: str, via: Forwarded | None, *, cached: bool = False) -> None:
        """Before a wake here: refuse it if another live registry that can be forwarded to owns
        the actor (see the module's docstring). An owner that advertised this registry's own
        address is a registry that died here (one process listens at an address, and this one
        took it over): its lease is as good as run out.

        `cached`: an owner found less than half a lease ago may be believed without a read
        (`_owners`), as a call forwarded to an owner that let the actor go is refused or
        served there; the forwarder drops it when it fails (`forget_owner`). The check just
        before a takeover always reads."""
        host = self._host
        if via is not None and host.draining:
            raise NotOwner(f"actor {aid}: this registry is stopping")
        if host.address is None:
            return
        now = time.time()
        owner = self._owners.get(aid) if cached and via is None else None
        if owner is None or owner.until - now < host.lease / 2:
            owner = await host.workers.run(host.ownership.owner, aid, now)
        if owner is None or owner.address is None or owner.address == host.address:
            self._owners.pop(aid, None)
            if host.draining:  # it would wake here
                await self._route_away(aid)
            return
        if via is not None:
            raise NotOwner(f"actor {aid} is owned by the registry at {owner.address}, not here")
        self._owners.pop(aid, None)
        self._owners[aid] = owner
        if len(self._owners) > _MAX_OWNERS:
            del self._owners[next(iter(self._owners))]
        host.counters["owned_elsewhere"] += 1
        raise OwnedElsewhere(f"actor {aid} is owned by the registry at {owner.address}", aid, owner)

    async def locate(self, name: str, key: str) -> None:
        """Raise `OwnedElsewhere` if another live registry owns the actor and it is not awake
        here: for reads that want the owner's view of it (the inspector's)."""
        aid = actor_id(name, key)
        live = self._instances.get(aid)
        if live is None or not live.serving():
            await self._route(aid, None, cached=True)

    async def _route_away(self, aid: str) -> None:
        """While draining: a call that would wake `aid` here goes to another running registry
        with an address (`OwnedElsewhere`, which wakes it there), chosen by the actor id so
        that one actor's calls agree; with none, it wakes here (and sleeps at the stop)."""
        live = await self._host.peers()
        peers = sorted((m for m in live if m.address and not m.draining), key=lambda m: m.id)
        if not peers:
            return
        peer = peers[zlib.crc32(aid.encode()) % len(peers)]
        self._host.counters["owned_elsewhere"] += 1
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
        self._host.index.write(put={record_key(aid, generation): value}, delete=stale)

    def forget(self, instance: ActorInstance) -> None:
        """The instance stopped: it serves no more calls here."""
        if self._instances.get(instance.actor_id) is instance:
            del self._instances[instance.actor_id]
            self._drop_unused_lock(instance.actor_id)

    def erase(self, aid: str, generation: int) -> None:
        """Remove what the index holds of an actor whose data is gone, as of `generation`: its
        records and lease entries of that generation and older ones. Newer ones belong to an
        actor created again since (see `directory/records.py`), and stay."""
        self._host.ownership.erase(aid, generation)
        delete_records_up_to(self._host.index, aid, generation)

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
