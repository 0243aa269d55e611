"""Waiting on workflows in tests: poll a handle until its workflow reaches a state."""

from __future__ import annotations

import anyio

from pagekv.actor import ActorHandle, ActorStopped, ActorTakenOver
from pagekv.actor.workflow import WorkflowState, WorkflowStatus

TERMINAL = (WorkflowState.COMPLETED, WorkflowState.FAILED, WorkflowState.CANCELLED)


async def settle(
    handle: ActorHandle, *states: WorkflowState, timeout: float = 15.0
) -> WorkflowStatus:
    """The status once the workflow is in one of `states` (default: a terminal one). A call
    that meets a dying instance (a test's injected fault) is retried."""
    wanted = states or TERMINAL
    with anyio.fail_after(timeout):
        while True:
            try:
                status = await handle.workflow.status()
                if status.state in wanted:
                    return status
            except (ActorStopped, ActorTakenOver):
                pass
            await anyio.sleep(0.01)


async def durably(handle: ActorHandle, state: WorkflowState, timeout: float = 10.0) -> None:
    """Wait until the database (not only memory) records the workflow in `state`."""
    with anyio.fail_after(timeout):
        while ((await handle.workflow.history()) or {}).get("state") != state.value:
            await anyio.sleep(0.01)
