"""The registry's hub: every open connection of this process, by actor, awake or asleep.

The hub is what lets an actor hibernate: connections (and their transports) belong to it, not to
an instance, so an actor whose only activity is open connections goes to sleep like any idle
actor while its clients stay connected. A frame from a client, a due schedule or a disconnect
wakes it; the new instance restores each connection's state and subscriptions from its database
(`restore`), where every change of them is saved (`save`), and reaps the rows of connections
that are gone (closed while it slept elsewhere, or held by a process that died): `on_disconnect`
runs for each, once, wherever the actor runs.

Invariants:
- a connection's row exists from the end of its `on_connect` until its `on_disconnect` ran
  (or the actor was destroyed); `on_disconnect` runs only for a connection that has a row, and
  deletes it in the same call, so it runs once per connection however the close is noticed;
- a connection closed because the actor left this process (`MOVED`) or the server stops
  (`GOING_AWAY`) keeps its row: the client reconnects, and the next wake reaps the old one;
- an actor asleep with connections open here keeps its lease here (`socket_leases.py`), so it wakes
  here, where they are, and no other process takes their rows for connections gone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import cbor2

from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition
from pagekv.actor.directory.leases import Forwarded
from pagekv.actor.directory.records import actor_id
from pagekv.actor.errors import ActorNotFound, CallCutOff, InvalidArguments, OwnedElsewhere
from pagekv.actor.realtime.connection import (
    RECONNECT,
    UNLOADED,
    CloseCode,
    Connection,
    ConnectionLimits,
    Transport,
    calling_connection,
    encoded_size,
)
from pagekv.actor.tables.sql import (
    ConnectionRow,
    delete_connection,
    has_connection,
    put_connections,
    read_connections,
)


class HubHost(Protocol):
    """What the hub needs of its registry: the definitions, a way to run code on an actor
    (waking it), and whether it still serves."""

    draining: bool

    @property
    def running(self) -> bool: ...

    def definition(self, name: str) -> ActorDefinition: ...

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

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
    ) -> Any: ...


class Woken(Protocol):
    """An instance at its wake, as `restore` reads it."""

    actor_id: str
    key: str
    definition: ActorDefinition
    ctx: ActorContext


log = logging.getLogger("pagekv.actor")
MAX_EVENT_NAME = 256
MAX_SUBSCRIPTIONS = 256


class Hub:
    def __init__(self, registry: HubHost, limits: ConnectionLimits) -> None:
        self._registry = registry
        self.limits = limits
        self._live: dict[str, dict[str, Connection]] = {}

    def connections(self, aid: str) -> list[Connection]:
        return [c for c in self._live.get(aid, {}).values() if not c.closed]

    def count(self) -> int:
        return sum(len(c) for c in self._live.values())

    def broadcast(self, aid: str, event: str, args: tuple[Any, ...]) -> int:
        """Push `event` to every open connection of `aid` subscribed to it; how many."""
        conns = [c for c in self.connections(aid) if event in c.subscriptions]
        if not conns:
            return 0
        frame = {"t": "event", "name": event, "args": list(args)}
        size = encoded_size(frame, self.limits)
        for conn in conns:
            conn.push(frame, size)
        return len(conns)

    # -- from clients -----------------------------------------------------------------------

    async def connect(
        self,
        name: str,
        key: str,
        params: Any,
        transport: Transport,
        *,
        create: bool,
        input: Any = None,
        via: Forwarded | None = None,
    ) -> Connection:
        """Attach a new connection: `on_before_connect` (which may raise to refuse it), then
        `on_connect`, then its row, in one call on the actor."""
        hooks = self._registry.definition(name).hooks
        conn = Connection(name, key, params, transport, self.limits)
        aid = actor_id(name, key)

        async def attach(ctx: ActorContext) -> None:
            if "on_before_connect" in hooks:
                await hooks["on_before_connect"](ctx, params)
            self._live.setdefault(aid, {})[conn.id] = conn
            try:
                if "on_connect" in hooks:
                    await _as(conn, hooks["on_connect"], ctx, conn)
                conn.touched = True
                await self.save(ctx, [conn])
            except BaseException:
                self._forget(conn)
                raise

        await self._registry.invoke(name, key, attach, create=create, input=input, via=via)
        return conn

    async def action(
        self, conn: Connection, action: str, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        """Run `action` for `conn` (`ctx.conn` is it while it runs)."""
        fn, args, kwargs = self._registry.definition(conn.name).resolve(action, args, kwargs)

        async def run(ctx: ActorContext) -> Any:
            return await _as(conn, fn, ctx, *args, **kwargs)

        return await self._registry.invoke(conn.name, conn.key, run, create=False)

    async def subscribe(self, conn: Connection, event: object, on: bool) -> None:
        """Start (or stop) sending `conn` the broadcasts of `event`; saved before it returns."""
        if not isinstance(event, str) or not 0 < len(event) <= MAX_EVENT_NAME:
            raise InvalidArguments(f"an event name must be 1 to {MAX_EVENT_NAME} characters")
        if on and event not in conn.subscriptions and len(conn.subscriptions) >= MAX_SUBSCRIPTIONS:
            raise InvalidArguments(
                f"a connection may subscribe to at most {MAX_SUBSCRIPTIONS} events"
            )

        async def run(ctx: ActorContext) -> None:
            if on:
                conn.subscriptions.add(event)
            else:
                conn.subscriptions.discard(event)
            conn.touched = True
            await self.save(ctx, [conn])

        await self._registry.invoke(conn.name, conn.key, run, create=False)

    def spawn_disconnected(self, conn: Connection) -> None:
        """`disconnected`, in the background (for a transport closed from the actor's side)."""
        if self._registry.running:
            self._registry.spawn(self.disconnected, conn)

    async def disconnected(self, conn: Connection) -> None:
        """The transport closed. Unless it closed so the client reconnects elsewhere (`RECONNECT`)
        or the registry stops (both leave the row for the next wake to reap), run
        `on_disconnect`, waking the actor if it sleeps."""
        self._forget(conn)
        if conn.close_code in RECONNECT or self._registry.draining or not self._registry.running:
            return
        hooks = self._registry.definition(conn.name).hooks

        async def run(ctx: ActorContext) -> None:
            await self._reap(ctx, conn, hooks.get("on_disconnect"))

        try:
            await self._registry.invoke(conn.name, conn.key, run, create=False)
        except (ActorNotFound, OwnedElsewhere) as e:  # destroyed; or its owner's wake reaps it
            log.debug("connection %s of %s: on_disconnect not run here: %s", conn.id, conn.name, e)
        except CallCutOff as e:  # no code failed: a stop ended it (a row left: the next wake)
            log.info(
                "actor %s/%s: on_disconnect of %s cut off: %s", conn.name, conn.key, conn.id, e
            )
        except Exception:
            log.exception("actor %s/%s: on_disconnect of %s failed", conn.name, conn.key, conn.id)

    # -- from instances ---------------------------------------------------------------------

    async def save(self, ctx: ActorContext, conns: list[Connection] | None = None) -> None:
        """Write the rows of the connections whose state or subscriptions may have changed (all
        of the actor's open ones that were touched, by default) with the actor's state, in one
        commit: an action that changes both costs one KV write, as one that changes either."""
        rows = self._changes(ctx.actor_id if conns is None else None, conns or [])
        if not rows:
            await ctx.db.save_state()
            return
        written = [ConnectionRow(conn.id, cbor2.dumps(conn.params), data) for conn, data in rows]
        await ctx.db.save_state(also=lambda c: put_connections(c, written))
        for conn, data in rows:
            conn.saved = data

    def _changes(self, aid: str | None, conns: list[Connection]) -> list[tuple[Connection, bytes]]:
        """The touched connections (of `aid`, or `conns`) whose row would change, encoded. One
        that cannot be encoded is put back to its saved state and refused (`TypeError`)."""
        rows = []
        for conn in self.connections(aid) if aid is not None else conns:
            if not conn.touched or conn.closed:
                continue
            conn.touched = False
            try:
                data = cbor2.dumps([conn._state, sorted(conn.subscriptions)])
            except (cbor2.CBOREncodeError, TypeError, ValueError) as e:
                if conn.saved is not None:  # back to what the database holds, not wedged
                    conn._state = cbor2.loads(conn.saved)[0]
                raise TypeError(
                    f"connection state must be CBOR-serialisable (it is back to its last saved "
                    f"value): {e}"
                ) from e
            if data != conn.saved:
                rows.append((conn, data))
        return rows

    async def restore(self, instance: Woken) -> list[Connection]:
        """At a wake, before any hook that may read `ctx.conns`: give this process's
        connections of the actor their saved state and subscriptions, and close those without a
        row (connected at an instance whose commit did not land). Returns the connections that
        are gone (a row, no socket here), for `reap` once the wake hooks ran."""
        aid = instance.actor_id
        rows = await instance.ctx.db.locked(read_connections, internal=True)
        live = self._live.get(aid, {})
        found, gone = set(), []
        for row in rows:
            conn = live.get(row.id)
            state, subscriptions = cbor2.loads(row.data)
            if conn is not None and not conn.closed:
                found.add(row.id)
                conn._state, conn.subscriptions, conn.saved = state, set(subscriptions), row.data
                continue
            name, key = instance.definition.name, instance.key
            shell = Connection(name, key, cbor2.loads(row.params), _GONE, self.limits, id=row.id)
            shell._state, shell.subscriptions = state, set(subscriptions)
            shell.close_code = CloseCode.NORMAL
            gone.append(shell)
        for conn in list(live.values()):
            if conn.id not in found:
                conn.close(CloseCode.INTERNAL, "the connection was lost by the actor; reconnect")
                self._forget(conn)
        return gone

    async def reap(self, instance: Woken, gone: list[Connection]) -> None:
        """`on_disconnect` for each connection `restore` found gone, and its row deleted."""
        hook = instance.definition.hooks.get("on_disconnect")
        for conn in gone:
            await self._reap(instance.ctx, conn, hook)

    def stopped(self, aid: str, how: str) -> None:
        """An instance of `aid` stopped: its connections hibernate (sleep), or are closed."""
        live = self._live.get(aid)
        if not live:
            return
        if how == "sleep":
            for conn in live.values():
                conn._state, conn.subscriptions = UNLOADED, set()
            return
        if how == "destroy":
            code, reason = CloseCode.NOT_FOUND, "the actor was destroyed"
        else:
            code, reason = CloseCode.MOVED, "the actor stopped serving here; reconnect"
        for conn in list(live.values()):
            conn.close(code, reason)
        self._live.pop(aid, None)

    def shutdown(self) -> None:
        """The registry stops: close every connection so its client reconnects elsewhere."""
        for live in list(self._live.values()):
            for conn in list(live.values()):
                conn.close(CloseCode.GOING_AWAY, "the server is shutting down; reconnect")
        self._live.clear()

    # -- helpers ----------------------------------------------------------------------------

    async def _reap(
        self, ctx: ActorContext, conn: Connection, hook: Callable[..., Awaitable[Any]] | None
    ) -> None:
        """`on_disconnect` for `conn` and its row deleted, if it has a row (see the module)."""
        exists = await ctx.db.locked(lambda c: has_connection(c, conn.id), internal=True)
        if not exists:
            return
        try:
            if hook is not None:
                await _as(conn, hook, ctx, conn)
        except Exception:  # logged; the row goes all the same, so the hook never runs again
            log.exception("actor %s: on_disconnect of %s failed", ctx.actor_id, conn.id)
        await ctx.db.run(lambda c: delete_connection(c, conn.id), internal=True)

    def _forget(self, conn: Connection) -> None:
        aid = actor_id(conn.name, conn.key)
        live = self._live.get(aid)
        if live is not None and live.get(conn.id) is conn:
            del live[conn.id]
            if not live:
                del self._live[aid]


async def _as(
    conn: Connection, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
) -> Any:
    """`fn(*args, **kwargs)` with `ctx.conn` set to `conn`."""
    token = calling_connection.set(conn)
    try:
        return await fn(*args, **kwargs)
    finally:
        calling_connection.reset(token)


class _Gone:
    """The transport of a connection whose client is gone: it takes nothing."""

    def push(self, frame: dict[str, Any], size: int) -> None:
        return None

    def close(self, code: CloseCode, reason: str) -> None:
        return None


_GONE = _Gone()
