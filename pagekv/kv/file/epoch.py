"""What this process knows of the log's current epoch: its header, how far its records go, and
every namespace's pending changes in it.

Log positions: record `seq` of epoch `epoch` sits at `position(epoch, seq)`, which only grows
over the log's history; durability is tracked in positions (`group_commit.py`).
"""

from __future__ import annotations

from typing import Final

from pagekv.kv.file.base import Base
from pagekv.kv.file.log import DATA_START, LogHeader
from pagekv.kv.file.pending import Pending

EPOCH_END: Final = 2**32 - 1
"""The largest `seq` of an epoch's positions: `position(epoch, EPOCH_END)` is past every record
of the epoch."""


def position(epoch: int, seq: int) -> int:
    """Where record `seq` of `epoch` sits in the log's history: positions only grow."""
    return epoch << 32 | seq


class Epoch:
    """This process's view of `kv.log`'s current epoch and the pending state it implies.

    Why a class of its own: catching up (`LogFollower`) and appending (`Appender`) both move it
    forward, the namespaces read it, and a fold empties it; each of them works on this one view.

    Invariants:
    - When `live` (the header's epoch is the one after the base's), `pending` and `created` are
      what records 1 to `seq` of the header's epoch did to the base, `offset` is where record
      `seq + 1` goes and `chain` is the seed of its CRC. Otherwise they are empty.
    - The pending state is a function of the epoch's records and the base alone, so every
      process computes the same one.
    - `header_bytes` is None when the view may not match the file (an operation failed half-way
      through it): the next catch-up re-reads the header and the base and starts over.

    Every field is guarded by the store's section (its thread lock and the log's `flock`);
    all are package-internal.
    """

    def __init__(self, base: Base) -> None:
        self._base = base
        self.header: LogHeader | None = None
        self.header_bytes: bytes | None = None
        self.live = False
        self.offset = DATA_START
        self.seq = 0
        self.chain = 0
        """The seed of the next record's CRC."""
        self.changes: int | None = None
        """The log's change counter (`kv.shm`) when this process last caught up or wrote."""
        self.stamp = -1
        """The log's `header_stamp` when this process last caught up or wrote a header."""
        self.pending: dict[int, Pending] = {}
        self.created: dict[str, int] = {}
        """The namespaces created in this epoch (not in the base yet), by name."""

    def restart(self) -> None:
        """Forget the pending state: an epoch begins, or the view is read again from the base."""
        self.pending.clear()
        self.created.clear()
        self.offset, self.seq = DATA_START, 0

    def pending_for(self, ns: int) -> Pending:
        """Namespace `ns`'s pending state, begun from its row in the base if it has none yet."""
        pending = self.pending.get(ns)
        if pending is None:
            pending = self.pending[ns] = Pending(*self._base.head(ns))
        return pending

    def add_created(self, ns: int, name: str) -> Pending:
        pending = self.pending[ns] = Pending(0, 0, created=name)
        self.created[name] = ns
        return pending
