"""The README's example: an actor with state, SQL and a durable workflow.

    ./run serve examples/quickstart.py --unauthenticated
    curl -X POST 'http://127.0.0.1:6420/actors/order/actions/add?key=ada-1' \
         -H 'content-type: application/json' -d '{"args": ["tea", 2]}'
"""

from pagekv.actor import Registry, actor

order = actor("order", state={"status": "open"})


@order.on_migrate  # at every wake, in a transaction
async def _tables(ctx) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS line(item TEXT, qty INTEGER)")


@order.action
async def add(ctx, item: str, qty: int = 1) -> int:
    await ctx.db.execute("INSERT INTO line VALUES (?, ?)", (item, qty))
    [(total,)] = await ctx.db.execute("SELECT sum(qty) FROM line")
    return total


@order.action
async def status(ctx) -> str:
    return ctx.state["status"]


@order.workflow  # starts with the actor; every step is recorded and replayed after a crash
async def fulfil(wf) -> str:
    await wf.queue.next("checkout", names=["pay"])  # waits, asleep if need be, for a message

    async def ship(step) -> None:
        lines = await step.db.execute("SELECT count(*) FROM line")
        step.state["status"] = f"shipped {lines[0][0]} lines"  # commits with the step

    await wf.step("ship", ship)
    return "done"


registry = Registry([order])
