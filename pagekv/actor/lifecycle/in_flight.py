"""The calls an instance runs (`CallsInFlight`): how many, and the scopes a stop cuts them off
with once its grace is over."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from pagekv.actor.async_db import ActorDb, noting_rollbacks
from pagekv.actor.errors import CallCutOff
from pagekv.actor.lifecycle.phase import StopState
from pagekv.actor.request_writes import Writes, note_writes


class _Running:
    """A call in flight, as `CallsInFlight.cut_off_by_stop` sees it."""

    commits: int | None = None
    """The database's commit count as the call's own code began; None until it does."""


class CallsInFlight:
    """Counts the calls in flight (an instance with one does not go to sleep), lets a stop wait
    until none is left, and cancels what still runs when the stop's grace is over.

    Invariant: a call cut off by a stop says it wrote nothing only if nothing of it was or can
    still be persisted (see `cut_off_by_stop`)."""

    def __init__(self, actor_id: str, stop_grace: float, db: ActorDb, stops: StopState) -> None:
        self._actor_id = actor_id
        self._stop_grace = stop_grace
        self._db = db
        self._stops = stops
        self.active = 0
        """Calls (and sends) in flight. Event loop only, as are the fields below."""
        self._scopes: set[anyio.CancelScope] = set()
        """A scope around the user code of each call in flight."""
        self._idle = anyio.Event()
        """Set when `active` falls to 0, then replaced."""

    def enter(self) -> None:
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()
            self._idle = anyio.Event()

    async def wait_idle(self) -> None:
        """Wait until no call is in flight."""
        while self.active:
            await self._idle.wait()

    def cancel(self) -> int:
        """Cancel the user code of every call in flight; returns how many."""
        for scope in self._scopes:
            scope.cancel()
        return len(self._scopes)

    @contextmanager
    def cut_off_by_stop(self, writes: Writes) -> Iterator[_Running]:
        """Around a call's user code: a stop that waited `stop_grace` for it cancels it here
        (`cancel`), and the call fails with `CallCutOff` (an `ActorStopped`). `writes`: what the
        call committed so far; the caller sets `commits` of what this yields as the call's own
        code begins.

        Invariant: the failure says nothing was written (`written: false`, which a client
        retries) only if nothing of the call was or can still be persisted. A transaction it
        had open was rolled back by then, its state restored with it; but its changes to the
        state outside a transaction are in the one state cell that every call shares, and a
        cell cannot tell whose change is whose: the stop's save (or a commit of another call
        that ran meanwhile) writes them. So once its code began, a call cut off while the state
        holds unsaved changes, or after anything committed on this instance since its code
        began, reports its writes as unknown (`Writes.unknown`: `written: null`, never retried
        blindly). A call cut off before its code began (waiting at the gate) wrote nothing."""
        running = _Running()
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope, noting_rollbacks() as rolled_back:
                yield running
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            began = running.commits is not None
            may_stand = running.commits is not None and self._unsaved_since(running.commits)
            if may_stand:
                note_writes(committed=False, unknown=True)
            what = "" if began else " before its code began"
            if rolled_back:
                what += "; a transaction it had open was rolled back"
            if writes.committed:
                what += "; writes of it had committed"
            elif may_stand:
                what += (
                    "; changes it made to the state outside a transaction may be saved (the "
                    "stop saves the state), so it may have written"
                )
            raise CallCutOff(
                f"actor {self._actor_id} stopped ({self._stops.stopping}) while this call ran: "
                f"it was cancelled after the stop waited stop_grace ({self._stop_grace:g} s) "
                f"for it{what}"
            )

    def _unsaved_since(self, commits: int) -> bool:
        """Whether a state change made by a call that began when the database had made
        `commits` commits may be, or may have been, persisted by another than the call: the
        state holds changes not yet saved (the stop saves them), or something committed since
        (each commit saves the state as it is)."""
        if self._db.database.commits != commits:
            return True
        try:
            return self._db.state.changed() is not None
        except Exception:  # a state that does not encode: whether a save writes it is unknown
            return True
