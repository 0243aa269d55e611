"""An actor that holds something of everything the runtime keeps, for the export, import and
copy tests: state, a table of its own, `ctx.kv` entries, a pending schedule, queued messages,
and a workflow that waits for a message between two steps.

`fill(client, key)` gives one actor all of that; `approve(client, key)` lets its workflow end.
"""

from __future__ import annotations

from typing import Any

from pagekv.actor import ActorContext, Client, actor
from pagekv.actor.workflow import StepContext, WorkflowContext

order = actor("order", state={"lines": 0, "steps": []})


@order.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS lines(id INTEGER PRIMARY KEY, item TEXT)")


async def _step(name: str, step: StepContext) -> str:
    step.state["steps"] = [*step.state["steps"], name]
    return name


@order.workflow
async def _fulfil(wf: WorkflowContext) -> dict[str, Any]:
    first = await wf.step("reserve", lambda step: _step("reserve", step))
    message = await wf.queue.next("approval", names=["approve"])
    last = await wf.step("ship", lambda step: _step("ship", step))
    return {"first": first, "approved_by": message.body if message else None, "last": last}


@order.action
async def add(ctx: ActorContext, item: str) -> int:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO lines(item) VALUES (?)", (item,))
        ctx.state["lines"] += 1
    await ctx.kv.put({item.encode(): b"stock:" + item.encode()})
    return ctx.state["lines"]


@order.action
async def remind(ctx: ActorContext, seconds: float) -> None:
    await ctx.schedule.after(seconds, "add", "reminder")


@order.action
async def view(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT item FROM lines ORDER BY id")
    stored = await ctx.kv.list()
    return {"state": ctx.state, "items": [r[0] for r in rows], "kv": dict(stored)}


async def fill(client: Client, key: str, items: int = 3) -> None:
    """Lines, `ctx.kv` entries, a schedule an hour away and a waiting message."""
    handle = client.get_or_create("order", key)
    for i in range(items):
        await handle.add(f"item-{i}")
    await handle.remind(3600)
    await handle.send("notes", {"text": "leave at the door"})


async def approve(client: Client, key: str) -> None:
    await client.get("order", key).send("approve", "ada")
