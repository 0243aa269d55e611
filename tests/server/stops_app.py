"""The app of `test_stops.py`: an action stuck in a transaction, one that waits after a state
change made outside a transaction, and actors that call each other in a cycle (`pagekv serve
tests/server/stops_app.py`)."""

from __future__ import annotations

from typing import Any

import anyio

from pagekv.actor import ActorContext, Registry, actor

STOP_GRACE = 1.0
_entered = anyio.Event()
_bumped = anyio.Event()

stuck = actor("stuck", state={"n": 0}, stop_grace=STOP_GRACE)


@stuck.on_create
async def on_create(ctx: ActorContext, input: Any) -> None:
    await ctx.db.execute("CREATE TABLE rows(n INTEGER)")


@stuck.action
async def commit(ctx: ActorContext, n: int) -> None:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO rows VALUES (?)", (n,))
        ctx.state["n"] = n


@stuck.action
async def wedge(ctx: ActorContext) -> None:
    """Writes 999 in a transaction, then waits inside it for ever."""
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO rows VALUES (999)")
        ctx.state["n"] = 999
        _entered.set()
        await anyio.sleep_forever()


@stuck.action
async def read(ctx: ActorContext) -> list[Any]:
    rows = await ctx.db.execute("SELECT n FROM rows ORDER BY n")
    return [ctx.state["n"], [r[0] for r in rows]]


probe = actor("probe")


@probe.action
async def entered(ctx: ActorContext) -> bool:
    """Whether `stuck.wedge` of this process is inside its transaction."""
    return _entered.is_set()


@probe.action
async def bumped(ctx: ActorContext) -> bool:
    """Whether `a.bump_then_wait` of this process changed the state and waits."""
    return _bumped.is_set()


a = actor("a", state={"n": 0}, stop_grace=STOP_GRACE)
b = actor("b", stop_grace=STOP_GRACE)


@a.action
async def through(ctx: ActorContext, b_key: str) -> str:
    """Calls `b.back`, which calls `a.hello` back, from inside a transaction."""
    async with ctx.db.transaction():
        ctx.state["n"] += 1
        result: str = await ctx.client.get_or_create("b", b_key).back(ctx.key)
        return result


@a.action
async def hello(ctx: ActorContext) -> list[Any]:
    return [ctx.key, ctx.state["n"]]


@a.action
async def bump_then_wait(ctx: ActorContext, seconds: float) -> int:
    """Adds 1 to n, outside a transaction, then waits `seconds` (past a stop's grace)."""
    ctx.state["n"] += 1
    _bumped.set()
    await anyio.sleep(seconds)
    n: int = ctx.state["n"]
    return n


@b.action
async def back(ctx: ActorContext, a_key: str) -> Any:
    return await ctx.client.get("a", a_key).hello()


@b.action
async def ping(ctx: ActorContext) -> str:
    return "pong"


registry = Registry([stuck, probe, a, b])
