"""An instance's stop (`Stopper`): sleep, destroy, or the teardown after a crash, bounded by the
actor's `stop_grace`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, assert_never

import anyio

from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.errors import ActorTakenOver
from pagekv.actor.lifecycle.calls import Calls
from pagekv.actor.lifecycle.instance_ports import InstanceHost
from pagekv.actor.lifecycle.lease_keeper import LeaseKeeper
from pagekv.actor.lifecycle.phase import Stop
from pagekv.actor.lifecycle.run_handler import RunHandler
from pagekv.kv import ActorKv, FenceMismatch

log = logging.getLogger("pagekv.actor")
UNWIND_S = 2.0
"""How long a stop waits for the work it cancelled at the end of `stop_grace` to unwind (a
transaction to roll back) before it closes the database without it (`Stopper.run`)."""


class Stopper:
    """Stops one instance: waits for its calls and run handler, cuts off what is left, runs the
    stop hook and saves the state, gives up the lease (sleep), closes the database, drops its
    data (destroy), and tells the registry.

    Invariants: the stop spends at most `stop_grace` on user code, and waits at most `UNWIND_S`
    more for a running transaction to roll back, so a stop never waits on user code or a store
    unbounded; nothing acknowledged is lost and nothing half-written is saved (see `run`); a
    destroy drops the data only as the generation that opened it, so an instance taken over
    meanwhile drops nothing (`ActorTakenOver`); the registry hears of the stop however it ends.
    It holds no state of its own: it runs once per instance, on the parts it is given."""

    def __init__(
        self,
        *,
        instance: object,
        actor_id: str,
        definition: ActorDefinition,
        kv: ActorKv,
        ctx: ActorContext,
        registry: InstanceHost,
        calls: Calls,
        run: RunHandler,
        lease: LeaseKeeper,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._instance = instance
        """The instance stopped, as the registry knows it (`InstanceHost.forget`)."""
        self._actor_id = actor_id
        self._definition = definition
        self._kv = kv
        self._ctx = ctx
        self._registry = registry
        self._calls = calls
        self._run = run
        self._lease = lease
        self._close = close

    async def run(self, how: Stop) -> None:
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
            run_pending = self._run.pending()  # before `stop` cancels its waits
            deadline = anyio.current_time() + self._definition.stop_grace
            try:
                with anyio.move_on_at(deadline):
                    await self._run.stop()
                    await self._calls.wait_idle()
                if await self._cut_off():
                    await self._stop_hooks(how, deadline)
                if how == "sleep":
                    holding = self._registry.holds_sockets(self._actor_id)
                    await self._lease.release(run_pending, holding=holding)
            finally:
                try:
                    await self._close()
                    if how == "destroy":
                        generation = self._ctx.db.database.generation
                        await self._registry.workers.run(partial(self._kv.drop, fence=generation))
                        destroyed = True
                except FenceMismatch as e:
                    raise ActorTakenOver(
                        f"actor {self._actor_id} was taken over elsewhere; not destroyed: {e}"
                    ) from e
                finally:
                    await self._registry.forget(self._instance, how=how, destroyed=destroyed)

    async def _cut_off(self) -> bool:
        """Cancel the calls and the run handler still running once the stop's grace is over,
        and wait for them to unwind (a transaction rolls back as it does); True once none is
        left, False if some still runs after `UNWIND_S`."""
        if not self._calls.active and not self._run.active:
            return True
        cancelled = self._calls.cancel()
        log.warning(
            "actor %s: cancelling %d call(s)%s still running after stop_grace (%g s)",
            self._actor_id,
            cancelled,
            " and its run handler" if self._run.active else "",
            self._definition.stop_grace,
        )
        self._run.cancel()
        with anyio.move_on_after(UNWIND_S):
            await self._run.wait_ended()
            await self._calls.wait_idle()
            return True
        log.error(
            "actor %s: work still running %g s after it was cancelled; stopping without the "
            "stop hook or a save (the last committed state stands)",
            self._actor_id,
            UNWIND_S,
        )
        return False

    async def _stop_hooks(self, how: Stop, deadline: float) -> None:
        """Run the stop hook until `deadline` (the end of the stop's grace), then save the
        state; a hook that fails or is cut off is logged and skips the save, as a failed action
        keeps only what it committed."""
        hooks, ctx = self._definition.hooks, self._ctx
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
                        self._actor_id,
                        how,
                        self._definition.stop_grace,
                    )
                    return
            await self._registry.hub.save(ctx)  # the state too
        except Exception:
            log.exception("actor %s: stopping (%s) despite a failed hook", self._actor_id, how)
