"""An instance's start (`Starter`): the takeover (opening the database), the internal tables'
migrations and the load of the state, then the start hooks, each timed (`perf internal:` and
`perf user:` in the debug log, and the registry's `*_ms_total` counters)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from functools import partial
from typing import Any, TypeVar

import apsw

from pagekv.actor.async_db import ActorDb
from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.errors import ActorNotFound, ActorTakenOver
from pagekv.actor.lifecycle.instance_ports import InstanceHost
from pagekv.actor.realtime.hub import Woken
from pagekv.actor.state import StateCell
from pagekv.actor.tables.schema import migrate
from pagekv.actor.tables.sql import Loaded, encode_state, load, mark_initialized
from pagekv.kv import ActorKv, FenceMismatch
from pagekv.vfs import Database, DatabaseDead, open_database

T = TypeVar("T")
log = logging.getLogger("pagekv.actor")


class Starter:
    """Opens, loads and creates one instance's actor and runs its start hooks, in the order
    `on_migrate` (in a transaction) -> [new actor: `create_state`, `on_create`] ->
    `create_vars` -> `on_wake`, and keeps how long each took (`metrics`).

    Invariants: opening the database is the takeover (an instance of the same actor elsewhere
    dies on its next write), and one that meets a takeover of its own meanwhile fails with
    `ActorTakenOver`; `on_create`'s SQL commits together with the record of the creation, so it
    is there exactly once; an actor the database holds none of is not created unless asked to
    (`ActorNotFound`, before anything is written)."""

    def __init__(
        self, actor_id: str, definition: ActorDefinition, key: str, registry: InstanceHost
    ) -> None:
        self._actor_id = actor_id
        self._definition = definition
        self._key = key
        self._registry = registry
        self.metrics: dict[str, float] = {}
        """Milliseconds each phase of the start took, by `internal.<phase>_ms` (the runtime's
        work) or `user.<hook>_ms` (the actor's hooks). Event loop only."""

    async def _timed(self, phase: str, work: Awaitable[T], *, user: bool = False) -> T:
        started = time.perf_counter()
        result = await work
        ms = (time.perf_counter() - started) * 1000
        self.metrics[f"{'user' if user else 'internal'}.{phase}_ms"] = ms
        log.debug("perf %s: %s duration_ms=%.2f", "user" if user else "internal", phase, ms)
        return result

    async def open(self, kv: ActorKv) -> Database:
        """Open (take over) the actor's database."""
        try:
            return await self._timed("open_database", self._registry.workers.run(open_database, kv))
        except DatabaseDead as e:
            if _fenced_off(e):  # what it wrote as it opened (recovery) was fenced off
                raise ActorTakenOver(f"actor {self._actor_id} was woken elsewhere meanwhile") from e
            raise

    async def load(self, db: ActorDb, *, create: bool) -> Loaded:
        """Migrate the internal tables and load the actor's state and next schedule; an actor
        whose database holds none is created unless `create` is false (`ActorNotFound`)."""
        loaded = await self._timed(
            "migrate_and_load", db.run(partial(load, create=create), internal=True)
        )
        if loaded is None:
            raise ActorNotFound(f"no actor {self._definition.name!r} with key {self._key!r}")
        return loaded

    async def run_hooks(self, woken: Woken, cell: StateCell, loaded: Loaded, input: Any) -> None:
        """Run the start hooks of the instance `woken`, whose state was `loaded` into `cell`,
        and restore its hibernated connections (those that closed meanwhile are reaped)."""
        hooks, ctx, db = self._definition.hooks, woken.ctx, woken.ctx.db
        hooked = any(h in hooks for h in ("on_migrate", "create_state", "on_create"))
        if loaded.fresh and hooked:  # the hooks find the internal tables
            await db.run(migrate, internal=True)
        if "on_migrate" in hooks:
            async with db.transaction():
                await self._timed("on_migrate", hooks["on_migrate"](ctx), user=True)
        if not loaded.initialized:
            await self._create(ctx, cell, input, fresh=loaded.fresh and not hooked)
        gone = await self._registry.hub.restore(woken)
        if "create_vars" in hooks:
            ctx.vars = await self._timed("create_vars", hooks["create_vars"](ctx), user=True)
        if "on_wake" in hooks:
            await self._timed("on_wake", hooks["on_wake"](ctx), user=True)
            await db.save_state()
        await self._registry.hub.reap(woken, gone)

    async def _create(self, ctx: ActorContext, cell: StateCell, input: Any, *, fresh: bool) -> None:
        """Run the create hooks and record the creation with the first state; `fresh`: the
        internal tables are created in that same commit.

        `on_create` runs in one transaction with the record of the creation, so its SQL is
        there exactly once: a crash or a failed commit before the record rolls it back with the
        rest, and the next wake runs the hook again on a database without it."""
        hooks = self._definition.hooks
        if "create_state" in hooks:
            ctx.state = await self._timed(
                "create_state", hooks["create_state"](ctx, input), user=True
            )
        else:
            ctx.state = self._definition.initial_state()
        name, key = self._definition.name, self._key
        if "on_create" in hooks:

            def mark_created(connection: apsw.Connection) -> None:
                mark_initialized(connection, name, key, encode_state(ctx.state))

            async with ctx.db.transaction(before_commit=mark_created):
                await self._timed("on_create", hooks["on_create"](ctx, input), user=True)
            return
        data = encode_state(ctx.state)
        mark = partial(mark_initialized, name=name, key=key, data=data, fresh=fresh)
        await ctx.db.run(mark, internal=True)
        cell.mark_saved(data)


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
