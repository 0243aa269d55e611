"""The registry's background loop: what keeps actors sleeping, waking and owned on time without
a call to drive it."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import anyio

from pagekv.actor.directory.leases import Ownership, Sleeper
from pagekv.actor.directory.records import actor_id
from pagekv.actor.errors import ActorNotFound, OwnedElsewhere
from pagekv.actor.lifecycle.instance import ActorInstance
from pagekv.actor.placement import Placement
from pagekv.actor.realtime.hub import Hub
from pagekv.actor.realtime.socket_leases import Holds
from pagekv.actor.worker_threads import Workers, release_free_memory

_IDLE_CHECK_S = 0.05
_WAKE_POLL_S = 0.5
_TRIM_AFTER_STOPS = 32
_TRIM_EVERY_S = 1.0
"""Memory freed by instances that stopped is given back to the system (`release_free_memory`)
once this many stopped, at most once per `_TRIM_EVERY_S`: RSS then follows the actors awake, not
the number ever woken."""
log = logging.getLogger("pagekv.actor")


class HousekeepingHost(Protocol):
    """What the loop needs of its registry: its lease, whether it drains, its counters, the
    store's directory and worker threads, the leases kept for sockets and the connections they
    are kept for, a way to run work in the background, and to wake an actor by name."""

    lease: float
    draining: bool
    counters: Counter[str]
    workers: Workers
    ownership: Ownership
    holds: Holds
    hub: Hub

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

    async def instance(self, name: str, key: str, *, create: bool) -> ActorInstance: ...


class Housekeeping:
    """Puts idle instances to sleep, renews leases (the instances', the registry's member
    entry, the ones kept for sockets), dispatches due schedules, wakes sleeping actors on time
    and gives the memory of stopped ones back to the system.

    Why apart from the registry: all of it runs on a clock, not on a call; the registry starts
    `run` in its task group and calls `release_holds` as it stops.

    Invariants:
    - The loop outlives any error: a round that fails (the store unreachable for a moment,
      say) is logged and counted (`housekeeping_errors`), and the next round tries again, since
      without it no actor would sleep or wake on time again.
    - Work that may wait on the store or on an actor (a wake, a renewal, a sleep) is spawned,
      so one slow actor holds up no round.
    - A lease kept for sockets is renewed or released under the actor's lock, and dropped once
      an instance of the actor is awake here (its lease is the instance's then).

    Fields: touched on the event loop only.
    """

    def __init__(self, host: HousekeepingHost, placement: Placement) -> None:
        self._host = host
        self._placement = placement
        self._stops_since_trim = 0
        """Instances stopped since memory was last given back (event loop only)."""

    def count_stop(self) -> None:
        """An instance stopped: its memory is freed, to give back at the next trim."""
        self._stops_since_trim += 1

    async def run(self) -> None:
        """The loop, every `_IDLE_CHECK_S`; the wake poll every `_WAKE_POLL_S`."""
        host = self._host
        indexed = False
        last_poll = last_trim = 0.0
        member_until = time.time() + host.lease
        while True:
            await anyio.sleep(_IDLE_CHECK_S)
            poll = time.monotonic() - last_poll >= _WAKE_POLL_S
            if poll:
                last_poll = time.monotonic()
            try:
                now = time.time()
                self._tend_instances(now)
                for aid in host.holds.lapsing(now):
                    host.spawn(self._renew_hold, aid)
                if self._stops_since_trim >= _TRIM_AFTER_STOPS and (
                    time.monotonic() - last_trim >= _TRIM_EVERY_S
                ):
                    self._stops_since_trim, last_trim = 0, time.monotonic()
                    if await host.workers.upkeep(release_free_memory):
                        host.counters["memory_trims"] += 1
                if member_until - now < host.lease / 2:
                    member_until = now + host.lease
                    await host.workers.upkeep(
                        partial(host.ownership.join, member_until, draining=host.draining)
                    )
                if poll:
                    if not indexed:
                        await host.workers.upkeep(host.ownership.index_due_times)
                        indexed = True
                    for sleeper in await self.due_sleepers(time.time()):
                        host.spawn(self.wake, sleeper.name, sleeper.key)
            except Exception:
                host.counters["housekeeping_errors"] += 1
                log.exception("housekeeping failed; the next round tries again")

    async def due_sleepers(self, now: float) -> list[Sleeper]:
        """The actors not awake here whose wake is due (`Ownership.due_sleepers`)."""
        awake = {instance.actor_id for instance in self._placement.live()}
        return await self._host.workers.upkeep(self._host.ownership.due_sleepers, now, awake)

    async def wake(self, name: str, key: str) -> None:
        """Wake an actor the poll found due, if it still is (`Ownership.still_due`)."""
        aid = actor_id(name, key)
        try:
            if await self._host.workers.upkeep(self._host.ownership.still_due, aid, time.time()):
                await self._host.instance(name, key, create=False)
        except ActorNotFound:
            log.info("actor %s/%s was destroyed; its lease entries are removed", name, key)
        except OwnedElsewhere:
            log.debug("actor %s/%s due, but another registry took it first", name, key)
        except Exception:
            log.exception("could not wake actor %s/%s for its schedule", name, key)

    def _tend_instances(self, now: float) -> None:
        """Dispatch the due schedules of live instances, renew their leases, and put idle ones
        to sleep."""
        for instance in self._placement.live():
            if instance.lease.next_due is not None and instance.lease.next_due <= now:
                self._host.spawn(instance.dispatch_due)
            if instance.lease_lapsing(now):
                self._host.spawn(instance.renew_lease)
            if instance.sleepy():
                self._host.spawn(instance.sleep_if_idle)

    async def _renew_hold(self, aid: str) -> None:
        """Renew (or release, its connections gone) the lease a sleeping actor keeps for its
        sockets here; close them if the actor was taken over elsewhere meanwhile."""
        host = self._host
        async with self._placement.exclusive(aid):
            if self._placement.awake(aid):  # woken here since: its instance holds the lease
                host.holds.drop(aid)
                return
            release = host.draining or not host.hub.connections(aid)
            if not await host.holds.renew(aid, release=release):
                host.hub.stopped(aid, "moved")

    async def release_holds(self) -> None:
        """The registry stops: release every held lease (its sockets are closed already), so
        the other registries wake those actors at once."""
        async with anyio.create_task_group() as tg:
            for aid in self._host.holds.held():
                tg.start_soon(self._renew_hold, aid)
