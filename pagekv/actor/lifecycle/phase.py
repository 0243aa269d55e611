"""Where an instance is in its life (`Phase`), the ways it stops (`Stop`), the stop it was asked
for and the one under way (`StopState`), and the refusal of a call it cannot serve
(`NotServing`)."""

from __future__ import annotations

import enum
from typing import Literal

from pagekv.actor.errors import ActorStopped

Stop = Literal["sleep", "destroy", "crash"]


class NotServing(ActorStopped):
    """The instance stopped before this call reached user code; a fresh one can take it."""


class Phase(enum.Enum):
    """STARTING -> RUNNING -> STOPPING -> STOPPED, never back: an instance serves once."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class StopState:
    """How an instance was asked to stop once its current work is done, and how the stop under
    way stops: shared by the instance and the parts that find a reason to stop (a takeover, a
    failed store, a failed run handler) or must know one began. Event loop only.

    Invariant: a crash, once requested, stays requested (a later sleep or destroy request does
    not hide that the instance can no longer be trusted to write)."""

    def __init__(self) -> None:
        self.requested: Stop | None = None
        """The stop asked for (by the actor's code, or a part that found a failure)."""
        self.stopping: Stop | None = None
        """How `ActorInstance.stop` is stopping the instance, once it began."""

    def request_sleep(self) -> None:
        self.requested = self.requested or "sleep"

    def request_destroy(self) -> None:
        if self.requested != "crash":
            self.requested = "destroy"

    def request_crash(self) -> None:
        self.requested = "crash"
