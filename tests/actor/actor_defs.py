"""An actor shared by the in-process tests and `actor_worker.py` (the second process).

`ledger` keeps a count in its state and one row per `add` in its database, both changed in one
transaction, so a test can compare the two and count acknowledged writes.
"""

from __future__ import annotations

import os
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
async def queued(ctx: ActorContext, queue: str) -> list[Any]:
    """Receive every message waiting in `queue` (oldest first) and return their bodies."""
    bodies = []
    while (message := await ctx.queue.next([queue], timeout=0)) is not None:
        bodies.append(message.body)
    return bodies


@ledger.action
async def read(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT n FROM entries ORDER BY id")
    return {
        "count": ctx.state["count"],
        "total": ctx.state["total"],
        "rows": [n for (n,) in rows],
    }


stepper = actor("stepper", state={"count": 0})
STEPS = 40
STEP_PAUSE_S = float(os.environ.get("STEPPER_PAUSE_S", "0.01"))
"""How long each step takes; a child that must be stopped mid-workflow sets more."""


@stepper.on_migrate
async def _stepper_schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS done(i INTEGER)")


@stepper.workflow
async def _steps(wf: Any) -> int:
    """`STEPS` steps, each one row and one state change in its transaction, slow enough that a
    SIGKILL often lands inside one."""
    for i in range(STEPS):

        async def step(s: Any, i: int = i) -> int:
            await s.db.execute("INSERT INTO done VALUES (?)", (i,))
            s.state["count"] += 1
            await anyio.sleep(STEP_PAUSE_S)
            return s.state["count"]

        await wf.step(f"step-{i}", step)
    return STEPS


@stepper.action
async def progress(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT i FROM done ORDER BY rowid")
    return {"count": ctx.state["count"], "rows": [i for (i,) in rows]}


phoenix = actor("phoenix", state={"armed": 0})
"""Writes a line to `$PHOENIX_LOG` from `on_create` and from its scheduled `tick`, so a test can
count them across processes: a destroyed actor must never be created or woken again by itself."""


def _phoenix_log(line: str) -> None:
    with open(os.environ["PHOENIX_LOG"], "a") as log:
        log.write(line + "\n")


@phoenix.on_create
async def _phoenix_created(ctx: ActorContext, input: Any) -> None:
    _phoenix_log(f"create {input}")


@phoenix.action
async def arm(ctx: ActorContext) -> int:
    await ctx.schedule.after(0.5, "tick")
    ctx.state["armed"] += 1
    return ctx.state["armed"]


@phoenix.action
async def tick(ctx: ActorContext) -> None:
    _phoenix_log("tick")
