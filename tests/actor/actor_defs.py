"""An actor shared by the in-process tests and `actor_worker.py` (the second process).

`ledger` keeps a count in its state and one row per `add` in its database, both changed in one
transaction, so a test can compare the two and count acknowledged writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from pagekv.actor import ActorContext, actor

ledger = actor("ledger", state={"count": 0, "total": 0})


@ledger.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS entries(id INTEGER PRIMARY KEY, n INTEGER)")


@ledger.action
async def add(ctx: ActorContext, n: int) -> dict[str, Any]:
    """Record `n` in a row and in the state, atomically; return the view after the write."""
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO entries(n) VALUES (?)", (n,))
        ctx.state["count"] += 1
        ctx.state["total"] += n
    return await read(ctx)


@ledger.action
async def add_then_hang(ctx: ActorContext, n: int, marker: str) -> None:
    """Start adding `n`, touch the file `marker` inside the open transaction, and hang there."""
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO entries(n) VALUES (?)", (n,))
        ctx.state["count"] += 1
        ctx.state["total"] += n
        Path(marker).touch()
        await anyio.sleep_forever()


@ledger.action
async def read(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT n FROM entries ORDER BY id")
    return {
        "count": ctx.state["count"],
        "total": ctx.state["total"],
        "rows": [n for (n,) in rows],
    }
