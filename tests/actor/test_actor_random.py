"""Random actor traffic (transactions, schedules, queue messages) while KV writes fail at random
points, then the delivery guarantees are checked against what each call reported:

- an acknowledged transaction is applied exactly once; a failed one at most once; state and SQL
  always agree (they commit together);
- an acknowledged schedule runs at least once;
- an acknowledged message is consumed at least once (completable receive, completed after the
  work is recorded).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import anyio
import pytest

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.kv import FaultKind, FaultyStore, MemoryStore

pytestmark = pytest.mark.anyio


def traffic_actor() -> Any:
    a = actor("traffic", state={"count": 0})

    @a.on_migrate
    async def schema(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS applied(label TEXT)")
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS consumed(body TEXT)")

    @a.action
    async def add(ctx: ActorContext, label: str) -> None:
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO applied VALUES (?)", (label,))
            ctx.state["count"] += 1

    @a.action
    async def add_later(ctx: ActorContext, label: str) -> None:
        await ctx.schedule.after(0.01, "add", label)

    @a.action
    async def consume(ctx: ActorContext) -> bool:
        message = await ctx.queue.next(timeout=0, completable=True)
        if message is None:
            return False
        await ctx.db.execute("INSERT INTO consumed VALUES (?)", (message.body,))
        await message.complete()
        return True

    @a.action
    async def view(ctx: ActorContext) -> Any:
        applied = [r[0] for r in await ctx.db.execute("SELECT label FROM applied")]
        consumed = [r[0] for r in await ctx.db.execute("SELECT body FROM consumed")]
        pending = len(await ctx.schedule.list())
        return ctx.state["count"], applied, consumed, pending

    return a


@pytest.mark.parametrize("seed", range(100, 120))
async def test_random_traffic_under_kv_faults_keeps_every_guarantee(seed: int) -> None:
    rng = random.Random(seed)
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    outcomes: dict[str, list[tuple[str, bool]]] = {"add": [], "add_later": [], "send": []}
    fired = 0
    async with Registry([traffic_actor()], kv=store).run() as client:
        handle = client.get_or_create("traffic", "k")
        await handle.view()
        faulty = store.faulty["traffic/k"]
        for i in range(150):
            if rng.random() < 0.25:
                kind = rng.choice([FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE])
                faulty.arm(kind, after=rng.randint(0, 2))
            op = rng.choice(["add", "add", "add_later", "send", "consume"])
            label = f"{op}-{i}"
            try:
                if op == "send":
                    await handle.send("jobs", label)
                elif op == "consume":
                    await handle.consume()
                else:
                    await handle.call(op, label)
                ok = True
            except Exception:
                ok = False
            if op != "consume":
                outcomes[op].append((label, ok))
        fired = faulty.fired_count()
        faulty.enabled = False
        with anyio.fail_after(20):
            while True:
                count, applied, consumed, pending = await handle.view()
                if pending == 0 and not await handle.consume():
                    break
                await anyio.sleep(0.02)
        count, applied, consumed, _ = await handle.view()
    times = Counter(applied)
    assert fired >= 5, "faults were injected"
    assert count == len(applied), "state and SQL commit together"
    for label, ok in outcomes["add"]:
        assert times[label] == 1 if ok else times[label] <= 1, (label, ok, times[label])
    for label, ok in outcomes["add_later"]:
        if ok:
            assert times[label] >= 1, f"acknowledged schedule {label} never ran"
    for label, ok in outcomes["send"]:
        if ok:
            assert label in consumed, f"acknowledged message {label} was lost"
