"""Actors served in the server tests (in-process and by `pagekv serve` in a subprocess).

`ledger` changes a row and its state in one transaction per `add`, so a test can count
acknowledged writes; `napper` sleeps after 0.2 s idle, to test wake and schedules over HTTP;
`flow` runs a workflow that waits for an approval message.
"""

from __future__ import annotations

import os
from typing import Any

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.workflow import StepContext, WorkflowContext

ledger = actor("ledger", state={"count": 0, "total": 0})
napper = actor("napper", state={"count": 0}, sleep_timeout=0.2)
flow = actor("flow", state={"loads": 0})


@ledger.create_state
async def _create_state(ctx: ActorContext, input: Any) -> dict[str, Any]:
    return {"count": 0, "total": 0, "input": input}


@ledger.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS entries(id INTEGER PRIMARY KEY, n INTEGER)")


@ledger.on_sleep
async def _on_sleep(ctx: ActorContext) -> None:
    ctx.state["sleeps"] = ctx.state.get("sleeps", 0) + 1


@ledger.action
async def add(ctx: ActorContext, n: int) -> dict[str, Any]:
    """One SQL write and a state change, committed together."""
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO entries(n) VALUES (?)", (n,))
        ctx.state["count"] += 1
        ctx.state["total"] += n
    return await read(ctx)


@ledger.action
async def read(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT n FROM entries ORDER BY id")
    return {"count": ctx.state["count"], "total": ctx.state["total"], "rows": [n for (n,) in rows]}


@ledger.action
async def echo(ctx: ActorContext, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Exactly what reached the action."""
    return {"args": list(args), "kwargs": kwargs, "input": ctx.state["input"]}


@ledger.action
async def fail(ctx: ActorContext, message: str) -> None:
    raise ValueError(message)


@ledger.action
async def stash(ctx: ActorContext, size: int) -> None:
    await ctx.kv.put({b"blob": b"x" * size})


@ledger.action
async def fill(ctx: ActorContext, rows: int, size: int) -> int:
    """`rows` blobs of `size` bytes in one transaction: a commit as big as a test needs."""
    async with ctx.db.transaction():
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS blobs(b BLOB)")
        for _ in range(rows):
            await ctx.db.execute("INSERT INTO blobs VALUES (randomblob(?))", (size,))
    return (await ctx.db.execute("SELECT count(*) FROM blobs"))[0][0]


@ledger.action
async def rewrite(ctx: ActorContext, size: int) -> None:
    """Every blob rewritten: a commit of every page `fill` wrote."""
    await ctx.db.execute("UPDATE blobs SET b = randomblob(?)", (size,))


@ledger.action
async def blob(ctx: ActorContext, data: bytes) -> bytes:
    return data[::-1]


@ledger.action
async def pid(ctx: ActorContext) -> int:
    """The process serving the actor: which worker of `pagekv serve --workers` owns it."""
    return os.getpid()


async def bump(ctx: ActorContext) -> int:
    """A state-only change."""
    ctx.state["count"] += 1
    return ctx.state["count"]


async def later(ctx: ActorContext, seconds: float) -> str:
    return await ctx.schedule.after(seconds, "bump")


async def count(ctx: ActorContext) -> int:
    return ctx.state["count"]


for definition in (ledger, napper):
    definition.action(bump)
    definition.action(later)
    definition.action(count)


async def load(step: StepContext) -> dict[str, int]:
    step.state["loads"] += 1
    return {"loaded": step.state["loads"]}


@flow.workflow
async def approve(wf: WorkflowContext) -> dict[str, Any]:
    """A step, then wait for an `approve` message; the output names who approved."""
    loaded = await wf.step("load", load)
    message = await wf.queue.next("approval", names=["approve"], timeout=60)
    return {**loaded, "by": None if message is None else message.body}


@flow.action
async def loads(ctx: ActorContext) -> int:
    return ctx.state["loads"]


registry = Registry([ledger, napper, flow])


member = actor("member", state={"gone": {}, "joined": 0})
"""Connections whose ends are counted durably, per connection id (for a server killed with
sockets open: `connected` is served as `server_defs.py:connected`)."""


@member.on_connect
async def _member_joined(ctx: ActorContext, conn: Any) -> None:
    ctx.state["joined"] += 1
    conn.state = {"name": conn.params["name"]}


@member.on_disconnect
async def _member_gone(ctx: ActorContext, conn: Any) -> None:
    ctx.state["gone"][conn.id] = ctx.state["gone"].get(conn.id, 0) + 1


@member.action
async def report(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.locked(
        lambda c: c.execute("SELECT count(*) FROM _pagekv_connections").fetchall(), internal=True
    )
    return {**ctx.state, "rows": rows[0][0], "open": len(ctx.conns)}


chat = actor("chat", state={"gone": {}, "said": 0}, sleep_timeout=0.2)
"""Hibernates 0.2 s after its last call, sockets open: its events must reach them wherever it
wakes next; ends counted durably per connection id."""


@chat.on_connect
async def _chat_joined(ctx: ActorContext, conn: Any) -> None:
    conn.state = {"name": conn.params["name"]}


@chat.on_disconnect
async def _chat_gone(ctx: ActorContext, conn: Any) -> None:
    ctx.state["gone"][conn.id] = ctx.state["gone"].get(conn.id, 0) + 1


@chat.action
async def say(ctx: ActorContext, text: str) -> int:
    ctx.state["said"] += 1
    return ctx.broadcast("said", text)


@chat.action
async def say_later(ctx: ActorContext, seconds: float, text: str) -> None:
    await ctx.schedule.after(seconds, "say", text)


@chat.action
async def gone(ctx: ActorContext) -> dict[str, int]:
    return ctx.state["gone"]


@chat.action
async def name(ctx: ActorContext) -> Any:
    return ctx.conn.state["name"] if ctx.conn is not None else None


connected = Registry([member, chat])


gauge = actor("gauge", state={"value": 0.0})
"""Writes whose answers are hard: a NaN, a result JSON cannot hold, a failure after a commit."""


@gauge.on_migrate
async def _gauge_schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS log(what TEXT)")


@gauge.action
async def assign(ctx: ActorContext, value: float) -> float:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO log VALUES ('nan')")
        ctx.state["value"] = value
    return ctx.state["value"]


@gauge.action
async def value(ctx: ActorContext) -> float:
    return ctx.state["value"]


@gauge.action
async def odd(ctx: ActorContext) -> object:
    await ctx.db.execute("INSERT INTO log VALUES ('odd')")
    return object()


@gauge.action
async def half(ctx: ActorContext) -> None:
    await ctx.db.execute("INSERT INTO log VALUES ('half')")
    raise RuntimeError("failed after its commit")


@gauge.action
async def log(ctx: ActorContext) -> list[str]:
    return [what for (what,) in await ctx.db.execute("SELECT what FROM log ORDER BY rowid")]


@gauge.action
async def bump_then_fail(ctx: ActorContext) -> None:
    """A state change outside any transaction, then a failure."""
    ctx.state["value"] = ctx.state["value"] + 1
    raise RuntimeError("failed after changing the state")


@gauge.action
async def stash_then_fail(ctx: ActorContext) -> None:
    await ctx.kv.put({b"k": b"v"})
    raise RuntimeError("failed after a ctx.kv write")


@gauge.action
async def odd_failure(ctx: ActorContext) -> None:
    raise ValueError("bad \ud800 text")


@gauge.action
async def plan(ctx: ActorContext, count: int, size: int) -> None:
    """`count` far-off schedules whose arguments are `size` bytes each."""
    for _ in range(count):
        await ctx.schedule.after(3600, "noop", "x" * size)


@gauge.action
async def noop(ctx: ActorContext, payload: str) -> None:
    pass
