"""`ctx.schedule`: durable one-shot and recurring action calls, stored in `_pagekv_schedule`.

Delivery is at-least-once: a due event is dispatched, and only removed (one-shot) or advanced
(recurring, anchored to its original cadence so it never drifts) after the action returned. A
crash in between dispatches it again on the next wake. An action that raises is logged and not
retried; one cut short by a storage failure stays due and is dispatched again.

With several registries on one store, a due event runs once while the instance that has the
actor is healthy: its lease entry keeps the other registries from taking the actor over (see
`LeaseKeeper._target`). If its process dies, another registry wakes the actor at
most one lease later and dispatches the event again, even one the crash cut short.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import apsw
import cbor2

from pagekv.actor.errors import ActorError
from pagekv.actor.ports import ScheduleHost
from pagekv.actor.tables.sql import (
    ScheduledCall,
    schedule_cancel,
    schedule_count,
    schedule_put,
    schedules,
)
from pagekv.actor.typed_values import cbor_dumps

MAX_SCHEDULES = 1000
WORKFLOW_WAKE = "_pagekv.workflow"
"""Id and action of the row that holds the workflow's earliest deadline (see the workflow runner);
dispatching it resumes the workflow instead of calling an action."""


class TooManySchedules(ActorError):
    """The actor has `MAX_SCHEDULES` pending schedules already."""


@dataclass(frozen=True)
class ScheduledEvent:
    id: str
    due: float
    action: str
    args: tuple[Any, ...]
    every: float | None


def next_due(due: float, every: float, now: float) -> float:
    """The first time after `now` on the cadence `due + k * every` (no drift, no catch-up storm)."""
    missed = int((now - due) // every) + 1 if now >= due else 1
    return due + missed * every


class Schedule:
    def __init__(self, instance: ScheduleHost) -> None:
        self._instance = instance

    async def at(self, timestamp: float, action: str, *args: Any) -> str:
        """Call `action(*args)` at a Unix timestamp; returns the event id."""
        return await self._add(str(uuid.uuid4()), timestamp, action, args, None)

    async def after(self, seconds: float, action: str, *args: Any) -> str:
        return await self.at(time.time() + seconds, action, *args)

    async def every(self, seconds: float, action: str, *args: Any, name: str | None = None) -> str:
        """Call `action(*args)` every `seconds`, first in `seconds`; a `name` makes it upsert."""
        if seconds <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {seconds}")
        event_id = f"every:{name}" if name is not None else str(uuid.uuid4())
        return await self._add(event_id, time.time() + seconds, action, args, seconds)

    async def _add(
        self, event_id: str, due: float, action: str, args: tuple[Any, ...], every: float | None
    ) -> str:
        instance = self._instance
        instance.definition.resolve(action, args, {})  # refused now, not when it is due
        encoded = cbor_dumps(list(args))

        def add(c: apsw.Connection) -> None:
            with c:
                count = schedule_count(c, other_than=event_id)
                if count >= MAX_SCHEDULES:
                    raise TooManySchedules(
                        f"actor {instance.actor_id} has {count} schedules (limit {MAX_SCHEDULES})"
                    )
                schedule_put(c, ScheduledCall(event_id, due, action, encoded, every, time.time()))

        await instance.announce_wake(due)
        await instance.ctx.db.locked(add, internal=True)
        await instance.ctx.db.after_transaction(instance.refresh_wake)
        return event_id

    async def list(self) -> list[ScheduledEvent]:
        rows = await self._instance.ctx.db.locked(lambda c: list(schedules(c)), internal=True)
        return [
            ScheduledEvent(r.id, r.due, r.action, tuple(cbor2.loads(r.args)), r.every) for r in rows
        ]

    async def cancel(self, event_id: str) -> bool:
        removed = await self._instance.ctx.db.locked(
            lambda c: schedule_cancel(c, event_id), internal=True
        )
        await self._instance.ctx.db.after_transaction(self._instance.refresh_wake)
        return removed
