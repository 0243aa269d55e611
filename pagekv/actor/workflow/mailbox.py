"""The workflow's side of the actor's queue: receiving messages into the history, completing
them, and giving back what a forgotten branch had received.

Split from the run handler because which queue rows the workflow holds is state of its own,
shared by every branch that receives, and must agree with the history across commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import apsw
import cbor2

from pagekv.actor.queue import Message
from pagekv.actor.tables.sql import QueueMessage, queue_delete, queue_messages
from pagekv.actor.workflow.history import Entry, Status
from pagekv.actor.workflow.hosts import RunActor
from pagekv.actor.workflow.journal import Journal
from pagekv.actor.workflow.payloads import Kind, Messages, ReceivedMessage


class Mailbox:
    """Messages received by the workflow, never delivered twice.

    Invariants: a message received as not completable is taken from the queue in the same
    commit that records it in the history; a completable one stays in the queue and is held
    (`_held`) from that commit until the commit that deletes it and marks it completed, or
    until its entry is forgotten; no two branches ever take one message. A message given back
    goes into the queue again under its own id, in the commit that forgets its entry.
    """

    def __init__(self, actor: RunActor, journal: Journal) -> None:
        self._actor = actor
        self._journal = journal
        self._held: set[int] = set()
        """Event loop only: queue ids received as completable and not completed yet."""

    def hold_received(self) -> None:
        """Hold what the history, as just loaded, received as completable and not completed."""
        self._held = {
            m.id
            for e in self._journal.history.entries.values()
            if isinstance(e.data, Messages) and e.data.completable
            for m in e.data.messages
            if not m.completed and not m.returned
        }

    async def receive(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message]:
        queue = self._actor.ctx.queue
        while True:
            arrival = queue.arrival()
            batch = await self._take(entry, names, count, completable)
            if batch is not None:
                return batch
            deadline = entry.payload(Messages).deadline
            if deadline is not None and time.time() >= deadline:
                entry.status, entry.completed = Status.COMPLETED, time.time()
                self._journal.history.put(entry)
                return []
            await self._journal.wait(deadline, arrival)

    async def _take(
        self, entry: Entry, names: Sequence[str] | None, count: int, completable: bool
    ) -> list[Message] | None:
        """Receive and record in one transaction: a message leaves the queue exactly when its
        history entry is written (unless completable: then at `complete()`). A plain read looks
        first, so waiting on an empty queue never takes the actor's exclusive transaction.

        What other branches hold is read again once the transaction is under way, and what
        this receive holds is held before it ends: two branches never take one message."""
        db = self._journal.db
        peek = await db.locked(self._select(names, count), internal=True)
        if not peek:
            return None
        taken: set[int] = set()
        try:
            async with self._journal.transaction() as staged:
                select = self._select(names, count)
                rows = await db.run(lambda c: _take_rows(c, select(c), completable), internal=True)
                if not rows:
                    return None  # another branch took them meanwhile
                records = tuple(
                    ReceivedMessage(r.id, r.name, cbor2.loads(r.body), r.created, not completable)
                    for r in rows
                )
                received = replace(
                    entry.payload(Messages), messages=records, completable=completable
                )
                staged.append(entry.settled(data=received))
                if completable:
                    taken = {r.id for r in records}
                    self._held |= taken
        except BaseException:
            self._held -= taken
            raise
        return self.messages(staged[0], replaying=False)

    def _select(
        self, names: Sequence[str] | None, count: int
    ) -> Callable[[apsw.Connection], list[QueueMessage]]:
        """The query for up to `count` messages (of `names`) not held, as the held set is now."""
        skip = sorted(self._held)
        return lambda c: list(queue_messages(c, limit=count, names=names, skip=skip))

    async def return_messages(self, gone: Sequence[Entry], kept: Sequence[Entry] = ()) -> None:
        """Commit the pending history (a race's losers deleted, or `kept` for their rollback
        handlers), with what their entries had received given back: a message received as not
        completable goes back into the queue under its own id (so in its order), since no
        replay could receive it again; a completable one not yet completed never left the queue
        and only stops being held, as after a restart; one the branch completed stays consumed.
        A kept entry keeps its messages for the rollback replay, marked `returned`; one given
        back once (by a race nested in a loser) is not given back again. The rows go back with
        the pending history (`History.give_back`), so that whichever commit writes the losers'
        deletion writes them too."""
        history = self._journal.history
        rows = []
        for entry in [*gone, *kept]:
            if not isinstance(entry.data, Messages) or not entry.data.messages:
                continue
            received, marked = entry.data, []
            for record in received.messages:
                if record.returned:
                    marked.append(record)
                    continue
                if not received.completable:
                    body = cbor2.dumps(record.body)
                    rows.append(QueueMessage(record.id, record.name, body, record.created))
                elif not record.completed:
                    self._held.discard(record.id)
                marked.append(replace(record, returned=True))
            if entry in kept:
                history.put(replace(entry, data=replace(received, messages=tuple(marked))))
        history.give_back(rows)
        await self._journal.flush()
        if rows or any(e.kind is Kind.MESSAGE for e in [*gone, *kept]):
            self._actor.ctx.queue.notify()

    def messages(self, entry: Entry, *, replaying: bool) -> list[Message]:
        """The messages `entry` received; completable only if not completed or given back yet,
        and not while `replaying` for a rollback."""
        received = entry.payload(Messages)
        return [
            Message(
                record.id,
                record.name,
                record.body,
                record.created,
                _complete=(
                    _done
                    if record.completed or record.returned or replaying
                    else partial(self._complete, entry.location, index)
                )
                if received.completable
                else None,
            )
            for index, record in enumerate(received.messages)
        ]

    async def _complete(self, location: str, index: int) -> None:
        """Delete a completable message and mark it completed in its entry, in one commit."""
        entry = self._journal.history.entries[location]
        received = entry.payload(Messages)
        messages = list(received.messages)
        message_id = messages[index].id
        async with self._journal.transaction() as staged:
            await self._journal.db.run(lambda c: queue_delete(c, [message_id]), internal=True)
            messages[index] = replace(messages[index], completed=True)
            staged.append(replace(entry, data=replace(received, messages=tuple(messages))))
        self._held.discard(message_id)


def _take_rows(
    connection: apsw.Connection, rows: list[QueueMessage], completable: bool
) -> list[QueueMessage]:
    if not completable:
        queue_delete(connection, [r.id for r in rows])
    return rows


async def _done() -> None:
    """`complete()` of a message whose completion is already recorded."""
