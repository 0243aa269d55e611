"""What one request wrote: the commits its database work made, for an exact error answer.

The server runs each call inside `tracking_writes()`, and an instance each action (so that it
knows whether running the call again elsewhere is safe); every worker hop of an actor's database
(`ActorDb.run`) and every write of `ctx.kv` made by the task, or by tasks it starts, reports to
every tracking around it. An error answer can then say whether a retry is safe.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Writes:
    """What the database work of one request committed, whichever actor and task did it.

    `state()` is True once a commit landed, None once a commit's outcome is unknown (and none is
    known to have landed), False while nothing was committed: what an error answer needs to say
    whether a retry is safe."""

    committed: bool = False
    unknown: bool = False

    def state(self) -> bool | None:
        if self.committed:
            return True
        return None if self.unknown else False


_writes: contextvars.ContextVar[tuple[Writes, ...]] = contextvars.ContextVar(
    "pagekv_request_writes", default=()
)


@contextmanager
def tracking_writes() -> Iterator[Writes]:
    """Count the commits of the database work done in this task (and the tasks it starts),
    inside any tracking already under way (which counts them too)."""
    writes = Writes()
    token = _writes.set((*_writes.get(), writes))
    try:
        yield writes
    finally:
        _writes.reset(token)


def note_writes(*, committed: bool, unknown: bool = False) -> None:
    """Report a write of the current task: `committed` if it landed, `unknown` if its outcome
    is not known. Outside `tracking_writes` it is not counted."""
    for writes in _writes.get():
        writes.committed |= committed
        writes.unknown |= unknown
