"""`kv.shm`: what the processes that have a `file:` store open share through memory.

`kv.shm` (format 1), shared through memory by the processes that have the store open and never
synced: `magic "pkvshm1\0" | store:16 | changes:u64 | durable:u64 | written:u64 |
flusher_since:u64`. A `kv.shm` without the magic (new, from pagekv before format 1, or
overwritten) or of another store is rebuilt under the log's exclusive lock; one of a newer format
is refused. The log header names the `kv.shm` in use by device and inode, so a process that
still maps one that was deleted or replaced sees, at its next operation, that the others moved
to another one (`catch_up.py`).

Its counters are never trusted for more than their stated bound: after a reboot, or in a copy of
the directory, `kv.shm` holds arbitrary old values, so a process opening the store flushes the log
and resets the marks (`reset_marks`) before it relies on them.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Final

from pagekv.kv.errors import FormatTooNew
from pagekv.kv.file.log import SlotState

_MAGIC: Final = b"pkvshm1\0"
_PREFIX: Final = b"pkvshm"
FORMAT: Final = 1
_COUNTER: Final = struct.Struct("<Q")
_CHANGES_AT: Final = 24
_MARK_AT: Final = 32
_WRITTEN_AT: Final = 40
_FLUSHER_SINCE_AT: Final = 48
_SHARED_BYTES: Final = 56
_FILE_BYTES: Final = 4096
_LOCK_EX: Final = fcntl.LOCK_EX
_LOCK_UN: Final = fcntl.LOCK_UN
_LOCK_NB: Final = fcntl.LOCK_NB


class ShmFile:
    """This process's mapping of `kv.shm`: the change counter, the durable and written marks,
    and the host's flusher lock.

    Mapped at construction and checked by the catch-up (`state`), which rebuilds it (`rebuild`)
    or moves to the one now at its path (`remap`); a mapping that is replaced stays open until
    `close`, as a flush in flight may still hold its flusher lock. `ident` (device and inode)
    names the file mapped. The mapping is written under the log's exclusive lock (the counter,
    the written mark, a rebuild) or by any process at any time (the durable mark and the flusher
    stamp, whose races only cost a flush); this object's fields change only under the store's
    section (`remap`, `state`, `rebuild`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd, self._map, self.ident = _map_shared(path)
        self._prefix = b""  # what the mapping's first bytes must be, once checked
        self._retired: list[tuple[int, mmap.mmap]] = []

    def state(self, store: bytes) -> SlotState:
        """Whether the mapped `kv.shm` is of this store (`VALID`), new or from before its format
        (`EMPTY`), or another store's or overwritten (`DAMAGED`); `FormatTooNew` for a newer
        format. A valid one is what `intact` checks against from then on."""
        head = self._map[: len(_MAGIC)]
        if head != _MAGIC:
            if head.startswith(_PREFIX):
                found = head.rstrip(b"\0")[len(_PREFIX) :].decode("latin-1")
                raise FormatTooNew(self.path, "kv.shm", found, FORMAT)
            return SlotState.EMPTY if not any(self._map[:_SHARED_BYTES]) else SlotState.DAMAGED
        if self._map[len(_MAGIC) : _CHANGES_AT] != store:
            return SlotState.DAMAGED
        self._prefix = _MAGIC + store
        return SlotState.VALID

    def intact(self) -> bool:
        """Whether the mapped `kv.shm` still starts as it did when last checked: a cheap look,
        on every operation, for one overwritten in place."""
        return self._map[:_CHANGES_AT] == self._prefix

    def rebuild(self, store: bytes) -> None:
        """Make the mapped `kv.shm` this store's, under the log's exclusive lock. The change
        counter is bumped, never reset, so no process can take the rebuild for no change; the
        marks are the caller's to reset once it has flushed the log."""
        self._map[_CHANGES_AT:_SHARED_BYTES] = bytes(_SHARED_BYTES - _CHANGES_AT)
        self._map[: len(_MAGIC)] = _MAGIC
        self._map[len(_MAGIC) : _CHANGES_AT] = store
        self._prefix = _MAGIC + store
        self.bump()

    def remap(self) -> bool:
        """Map the `kv.shm` now at its path (creating it if it is gone), if it is another file
        than the mapped one; return whether it was. The old mapping is kept until `close`."""
        fd, shm, ident = _map_shared(self.path)
        if ident == self.ident:
            shm.close()
            os.close(fd)
            return False
        self._retired.append((self._fd, self._map))
        self._fd, self._map, self.ident = fd, shm, ident
        self._prefix = b""
        return True

    def changes(self) -> int:
        """The change counter: a caller holding the lock that sees the value it saw last time
        knows that no process has written to the log since (through this `kv.shm`)."""
        changes: int = _COUNTER.unpack_from(self._map, _CHANGES_AT)[0]
        return changes

    def durable_mark(self) -> int:
        """The log position (`epoch << 32 | seq`) up to which some process has made the
        records durable; records at or below it need no flush. Shared like the change counter,
        and like it only ever a lower bound of the truth (`raise_mark`)."""
        mark: int = _COUNTER.unpack_from(self._map, _MARK_AT)[0]
        return mark

    def raise_mark(self, position: int) -> None:
        """Record that the log is durable up to `position`. Not atomic between processes: two
        raising it at once can leave the lower value, which costs a flush, never a lost write."""
        if position > _COUNTER.unpack_from(self._map, _MARK_AT)[0]:
            _COUNTER.pack_into(self._map, _MARK_AT, position)

    def written_mark(self) -> int:
        """The position of the last record any process has written to the file (to the page
        cache at least): a flush that starts now covers the log up to it."""
        mark: int = _COUNTER.unpack_from(self._map, _WRITTEN_AT)[0]
        return mark

    def raise_written(self, position: int) -> None:
        """Record a record written; the caller holds the exclusive lock, so no writer races it."""
        if position > _COUNTER.unpack_from(self._map, _WRITTEN_AT)[0]:
            _COUNTER.pack_into(self._map, _WRITTEN_AT, position)

    def reset_marks(self, position: int) -> None:
        """Set both marks to `position`, the end of the log, just flushed: at open, where
        `kv.shm` may come from before a reboot or from another copy of the directory."""
        _COUNTER.pack_into(self._map, _MARK_AT, position)
        _COUNTER.pack_into(self._map, _WRITTEN_AT, position)

    def try_lock_flusher(self) -> int:
        """Take the host's flusher lock (a `flock` on `kv.shm`) if it is free, and stamp the
        time it was taken; return the descriptor locked (for `unlock_flusher`), or -1. One
        process at a time flushes for all; the others wait for its flush or the next one, or
        flush around a holder that keeps it too long (`flusher_held_s`)."""
        fd, shm = self._fd, self._map
        try:
            fcntl.flock(fd, _LOCK_EX | _LOCK_NB)
        except BlockingIOError:
            return -1
        _COUNTER.pack_into(shm, _FLUSHER_SINCE_AT, time.monotonic_ns())
        return fd

    def flusher_held_s(self) -> float:
        """How long ago the flusher lock was last taken (`CLOCK_MONOTONIC`, one clock for every
        process of the host): while it is held, how long its holder has been flushing."""
        since: int = _COUNTER.unpack_from(self._map, _FLUSHER_SINCE_AT)[0]
        return (time.monotonic_ns() - since) / 1e9

    def unlock_flusher(self, fd: int) -> None:
        fcntl.flock(fd, _LOCK_UN)

    def bump(self) -> int:
        """Count a change about to be made (under the exclusive lock); return the new value.

        Bumped *before* the change, so a writer that dies halfway still tells the others to
        look. The counter lives in a shared mapping of `kv.shm`: visible to every process at
        once, never synced, and never trusted for more than "something changed" — after a
        reboot its value is arbitrary, and every process starts by reading the whole log.
        """
        value: int = (_COUNTER.unpack_from(self._map, _CHANGES_AT)[0] + 1) % 2**64
        _COUNTER.pack_into(self._map, _CHANGES_AT, value)
        return value

    def close(self) -> None:
        """Idempotent."""
        for resource in (self._map, *(shm for _, shm in self._retired)):
            if not resource.closed:
                resource.close()
        for fd, _ in self._retired:
            os.close(fd)
        self._retired.clear()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _map_shared(path: Path) -> tuple[int, mmap.mmap, tuple[int, int]]:
    """`kv.shm`'s descriptor (for the flusher lock), its shared mapping, and its identity
    (device and inode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if st.st_size < _SHARED_BYTES:
            os.ftruncate(fd, _FILE_BYTES)  # only grows it: every process truncates to this size
        return fd, mmap.mmap(fd, _SHARED_BYTES), (st.st_dev, st.st_ino)
    except BaseException:
        os.close(fd)
        raise
