"""Running an awake actor's due schedules (`ScheduleDispatcher`), as calls nobody answers."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import cbor2

from pagekv.actor.errors import STORAGE_ERRORS, ActorStopped, ActorTakenOver
from pagekv.actor.lifecycle.instance_ports import ScheduleOwner
from pagekv.actor.lifecycle.phase import StopState
from pagekv.actor.schedule import WORKFLOW_WAKE, next_due
from pagekv.actor.tables.sql import is_scheduled, schedule_done, schedules

log = logging.getLogger("pagekv.actor")


class ScheduleDispatcher:
    """Runs every due schedule of one instance, then moves its wake time on.

    Invariants: one dispatch at a time; a schedule runs at least once (it is settled only after
    its call, so a crash or a failed store in between leaves it due, to run again here or on
    the next owner); an event cancelled or moved by another of the same round does not run; a
    takeover or a stop met on the way ends the dispatch, a takeover tearing the instance down.
    """

    def __init__(self, owner: ScheduleOwner, stops: StopState) -> None:
        self._owner = owner
        self._stops = stops
        self.dispatching = False
        """A dispatch is under way. Event loop only."""

    async def dispatch(self) -> None:
        """Run every due schedule (at least once), then move the wake time on."""
        self.dispatching = True
        owner = self._owner
        actor_id, db = owner.actor_id, owner.ctx.db
        try:
            now = time.time()
            due = await db.locked(lambda c: list(schedules(c, due_by=now)), internal=True)
            for call in due:
                if not await db.locked(
                    partial(is_scheduled, call_id=call.id, due=call.due), internal=True
                ):
                    continue  # cancelled (or moved) by an event of this same round
                try:
                    if call.action == WORKFLOW_WAKE:
                        owner.start_run()
                    else:
                        stored = tuple(cbor2.loads(call.args))
                        fn, call_args, call_kwargs = owner.definition.resolve(
                            call.action, stored, {}
                        )
                        await owner.call(fn, call_args, call_kwargs, answered=False)
                except (ActorTakenOver, ActorStopped):
                    raise
                except STORAGE_ERRORS as e:
                    log.warning("actor %s: scheduled %s stays due: %s", actor_id, call.action, e)
                    return
                except Exception:
                    log.exception("actor %s: scheduled %s failed", actor_id, call.action)
                await db.locked(
                    partial(_settle, event_id=call.id, due=call.due, every=call.every),
                    internal=True,
                )
            await owner.refresh_wake()
        except (ActorTakenOver, ActorStopped) as e:
            log.info("actor %s: dispatch ended by the instance stopping: %s", actor_id, e)
            if isinstance(e, ActorTakenOver):
                self._stops.request_crash()
        finally:
            self.dispatching = False


def _settle(connection: Any, event_id: str, due: float, every: float | None) -> None:
    """After a dispatch: drop a one-shot event, or move a recurring one to its next time."""
    then = None if every is None else next_due(due, every, time.time())
    schedule_done(connection, event_id, due, then)
