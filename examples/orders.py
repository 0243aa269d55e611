"""An order workflow: load the order, wait out a cool-off period, then wait for an approval
message, each step recorded durably so the order survives sleep, crashes and takeovers.

    ./run serve examples/orders.py --unauthenticated
    # create order 42 (its workflow starts on creation)
    curl -X POST 'http://127.0.0.1:6420/actors/orders?key=42' \
         -H 'content-type: application/json' -d '{"input": {"item": "book", "quantity": 2}}'
    # after the 30 s cool-off, approve it
    curl -X POST 'http://127.0.0.1:6420/actors/orders/queues/approve?key=42&mode=get' \
         -H 'content-type: application/json' -d '{"body": {"by": "ada"}}'
    curl -X POST 'http://127.0.0.1:6420/actors/orders/actions/status?key=42&mode=get'
    curl 'http://127.0.0.1:6420/inspect/actors/orders/workflow?key=42'
"""

from __future__ import annotations

from typing import Any

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.workflow import StepContext, WorkflowContext

COOL_OFF_S = 30
APPROVAL_TIMEOUT_S = 3600

orders = actor("orders", state={"status": "new", "order": None, "decided_by": None})


@orders.on_create
async def _on_create(ctx: ActorContext, input: dict[str, Any] | None) -> None:
    ctx.state["order"] = input or {}


@orders.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute(
        "CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY, event TEXT NOT NULL, "
        "at REAL NOT NULL DEFAULT (unixepoch('subsec')))"
    )


async def _record(step: StepContext, event: str, status: str) -> None:
    await step.db.execute("INSERT INTO events(event) VALUES (?)", (event,))
    step.state["status"] = status


async def load_order(step: StepContext) -> dict[str, Any]:
    """Validate the order given at creation; the result is recorded, so it runs once."""
    order = step.state["order"]
    if not order.get("item") or int(order.get("quantity", 0)) < 1:
        raise ValueError(f"an order needs an item and a quantity >= 1, got {order}")
    await _record(step, "loaded", "cooling-off")
    return order


@orders.workflow
async def fulfil(wf: WorkflowContext) -> str:
    order = await wf.step("load", load_order)
    await wf.sleep("cool-off", seconds=COOL_OFF_S)

    async def waiting(step: StepContext) -> None:
        await _record(step, "awaiting approval", "awaiting-approval")

    await wf.step("await-approval", waiting)
    message = await wf.queue.next(
        "approval", names=["approve", "reject"], timeout=APPROVAL_TIMEOUT_S
    )
    outcome = "expired" if message is None else f"{message.name}d"
    decided_by = None if message is None else (message.body or {}).get("by")

    async def decide(step: StepContext) -> None:
        await _record(step, f"{outcome} {order['quantity']} x {order['item']}", outcome)
        step.state["decided_by"] = decided_by

    await wf.step("decide", decide)
    return outcome


@orders.action
async def status(ctx: ActorContext) -> dict[str, Any]:
    events = await ctx.db.execute("SELECT event, at FROM events ORDER BY id")
    return {**ctx.state, "events": [{"event": e, "at": at} for e, at in events]}


registry = Registry([orders])
