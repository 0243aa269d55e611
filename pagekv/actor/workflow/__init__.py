"""Durable workflows: an actor's `run` handler whose every durable operation is recorded in the
actor's own database and replayed after sleep, crash or takeover.

```python
@orders.workflow
async def fulfil(wf):
    order = await wf.step("load", load_order)      # load_order(step_ctx) -> result
    await wf.sleep("cool-off", seconds=30)
    msg = await wf.queue.next("approval", names=["approve", "reject"], timeout=3600)
```
"""

from pagekv.actor.workflow.errors import (
    Critical,
    EntryInProgress,
    HistoryDiverged,
    JoinError,
    RaceError,
    RollbackCheckpointError,
    StepContextClosed,
    StepCritical,
    StepError,
    StepExhausted,
    StepTimeout,
    WorkflowChangeRefused,
    WorkflowError,
    WorkflowFormatError,
)
from pagekv.actor.workflow.handle import WorkflowHandle
from pagekv.actor.workflow.history import FORMAT_VERSION, WorkflowState, describe
from pagekv.actor.workflow.primitives import LoopIteration, RaceResult, WorkflowContext
from pagekv.actor.workflow.runner import WorkflowStatus
from pagekv.actor.workflow.step import StepContext, StepFailure, StepResult

__all__ = [
    "FORMAT_VERSION",
    "Critical",
    "EntryInProgress",
    "HistoryDiverged",
    "JoinError",
    "LoopIteration",
    "RaceError",
    "RaceResult",
    "RollbackCheckpointError",
    "StepContext",
    "StepContextClosed",
    "StepCritical",
    "StepError",
    "StepExhausted",
    "StepFailure",
    "StepResult",
    "StepTimeout",
    "WorkflowChangeRefused",
    "WorkflowContext",
    "WorkflowError",
    "WorkflowFormatError",
    "WorkflowHandle",
    "WorkflowState",
    "WorkflowStatus",
    "describe",
]
