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


saga = actor("saga", state=None)
"""A workflow whose every completed step has a rollback handler, spread over each shape a replay
treats differently: the root, a join's branches, a race's winner and its loser (which completed a
step before losing), and a loop pruned down to one iteration of history; then a durable sleep, one
more step and a failing one. Forward steps and handlers each write a row in their own transaction
(`did`, `undone`), so the rows say exactly which ran and in which order.

`$SAGA_STOP_AT` names a handler that, the first time it runs (marker file `$SAGA_MARKER`), stops
its process: `kill` with SIGKILL, `block` (in-process) by waiting until the instance is torn down.
"""
SAGA_STEPS = ["first", "x", "y", "s", "q", "loop0", "loop1", "loop2", "last"]
SAGA_NAP_S = float(os.environ.get("SAGA_NAP_S", "0.3"))


@saga.on_migrate
async def _saga_schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS did(name TEXT)")
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS undone(name TEXT)")


def _saga_step(name: str) -> tuple[Any, Any]:
    async def forward(step: Any) -> str:
        await step.db.execute("INSERT INTO did VALUES (?)", (name,))
        return name

    async def undo(step: Any, output: Any) -> None:
        assert output == name, (output, name)
        await step.db.execute("INSERT INTO undone VALUES (?)", (name,))
        stop = os.environ.get("SAGA_STOP_AT", "")
        if stop.partition(":")[2] == name and not Path(os.environ["SAGA_MARKER"]).exists():
            Path(os.environ["SAGA_MARKER"]).touch()
            if stop.startswith("kill:"):
                os.kill(os.getpid(), 9)
            await anyio.sleep_forever()

    return forward, undo


async def _saga_do(wf: Any, name: str, label: str | None = None) -> Any:
    forward, undo = _saga_step(label or name)
    return await wf.step(name, forward, rollback=undo)


@saga.workflow
async def _saga(wf: Any) -> None:
    from pagekv.actor.workflow import Critical

    await wf.rollback_checkpoint("checkpoint")
    await _saga_do(wf, "first")
    await wf.join("j", {"x": lambda b: _saga_do(b, "x"), "y": lambda b: _saga_do(b, "y")})

    async def quick(b: Any) -> Any:
        await b.sleep("wait", 0.2)
        return await _saga_do(b, "q")

    async def slow(b: Any) -> Any:
        await _saga_do(b, "s")
        await b.sleep("forever", 3600)

    await wf.race("r", {"quick": quick, "slow": slow})
    async for it in wf.loop("loop", state=0, history_size=1, prune_every=1):
        await _saga_do(it, "work", f"loop{it.index}")
        if it.index == 2:
            break
    await wf.sleep("nap", SAGA_NAP_S)
    await _saga_do(wf, "last")

    async def fail(step: Any) -> None:
        raise Critical("the saga fails at its end")

    await wf.step("fail", fail)


@saga.action
async def saga_rows(ctx: ActorContext) -> dict[str, list[str]]:
    tables = {}
    for table in ("did", "undone"):
        rows = await ctx.db.execute(f"SELECT name FROM {table} ORDER BY rowid")
        tables[table] = [name for (name,) in rows]
    return tables
