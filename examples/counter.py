"""A counter: state only, plus a log row per change in its own SQL table.

    ./run serve examples/counter.py --unauthenticated
    curl -X POST 'http://127.0.0.1:6420/actors/counter/actions/increment?key=room-1' \
         -H 'content-type: application/json' -d '{"args": [5]}'
"""

from __future__ import annotations

from pagekv.actor import ActorContext, Registry, actor

counter = actor("counter", state={"count": 0}, sleep_timeout=30)


@counter.create_state
async def _create_state(ctx: ActorContext, input: dict | None) -> dict:
    return {"count": (input or {}).get("start", 0)}


@counter.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute(
        "CREATE TABLE IF NOT EXISTS log(id INTEGER PRIMARY KEY, amount INTEGER, at REAL)"
    )


@counter.action
async def increment(ctx: ActorContext, amount: int = 1) -> int:
    """Add `amount`; the log row and the new count commit together."""
    async with ctx.db.transaction():
        await ctx.db.execute(
            "INSERT INTO log(amount, at) VALUES (?, unixepoch('subsec'))", (amount,)
        )
        ctx.state["count"] += amount
    return ctx.state["count"]


@counter.action
async def get(ctx: ActorContext) -> int:
    return ctx.state["count"]


@counter.action
async def history(ctx: ActorContext, limit: int = 10) -> list[int]:
    rows = await ctx.db.execute("SELECT amount FROM log ORDER BY id DESC LIMIT ?", (limit,))
    return [amount for (amount,) in rows]


registry = Registry([counter])
