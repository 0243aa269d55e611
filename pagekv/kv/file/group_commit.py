"""Group commit: when the records this process wrote or saw become durable.

A write alone (no other thread or process waited for the lock, every earlier record durable)
makes its record durable before it lets go of the locks: one `O_DSYNC` write, the fastest way for
one writer. Otherwise it writes its record to the page cache, lets go, and waits for a flush that
covers it (`GroupCommit.await_durable`): one waiter per process, and one process of the host at a
time (the flusher lock on `kv.shm`), flushes outside the locks while the others append, so
concurrent writers of any namespaces, in any of the processes sharing the directory, share one
`fdatasync`. A flusher lock holder that stops is flushed around.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

from pagekv.kv.errors import KvIndeterminate, KvUnavailable
from pagekv.kv.file.log import LogFile, os_reason
from pagekv.kv.file.shm import ShmFile

_FIRST_POLL: Final = 20e-6
_MAX_POLL: Final = 500e-6
"""A process waiting for another's flush looks again after 20 µs, then twice as long each time
up to 0.5 ms: a flush takes from 0.1 ms to a few ms."""
_GROUPING_S: Final = 0.1
"""How long after a flush shared by several writes a write still leaves its flush to a group:
writers that have just been woken by one flush are about to write again, and one of them going
alone would hold the lock through its own flush while the others queue behind it."""
_FLUSHER_PATIENCE: Final = 10
_MIN_FLUSHER_WAIT_S: Final = 0.01
"""A process waits for another's flush at most this many of its own average flushes, and at
least this long, past the moment the other took the flusher lock; then it flushes itself, so
that a stopped flusher delays the others by that much once, not by every flush."""


class GroupCommit:
    """This process's durability: which log positions are durable, who flushes, and whether a
    failed write or flush has broken the store.

    Invariants:
    - Records are made durable in log order (a record is written with `O_DSYNC` only when all
      before it are durable, and a flush covers all written before it), so a crash loses a
      suffix of unacknowledged records.
    - `durable_pos` only names positions a flush or a durable write covered, by this process or
      (through `kv.shm`'s mark) another; once `broken` is set, only this process's own.
    - After a failed flush (or a failed write, `broken` set by the appender) the store refuses
      every further request until it is reopened: the kernel may have dropped the pages.

    Locks: `_durable` (a condition; `_gathered` shares its lock) guards `durable_pos`, `_flushing`,
    `_flushed_writes`, `_covered`, `_flush_s`, `_contended` and `grouping_until`'s writes.
    `seen_pos`, `writes`, `lock_waited` and `broken` are written under the store's section (and
    `broken` by a failed flush and `close`); the flusher reads `seen_pos` and `writes` without
    it (a stale value only covers less, and its waiter looks again). `is_durable` also raises
    `durable_pos` under the section alone: racing `mark_durable`, it can only lower it, which
    costs a flush, never a lost write. The package-internal fields are the ones without `_`.
    """

    def __init__(self, log: LogFile, shm: ShmFile, path: Path, lock_timeout: float) -> None:
        self._log = log
        self._shm = shm
        self._path = path
        self.lock_timeout = lock_timeout
        """Bounds the wait for another process's flush (`FileStore.lock_timeout` sets it)."""
        flush_lock = threading.Lock()
        self._durable = threading.Condition(flush_lock)
        self._gathered = threading.Condition(flush_lock)  # the flusher waits for writes on it
        self.durable_pos = 0
        """What this process knows to be durable."""
        self.seen_pos = 0
        """Every record up to this position is in the file (maybe not durable)."""
        self.writes = 0
        self.lock_waited = False
        """Whether the current section waited for another process's `flock`."""
        self.broken: str | None = None
        """Why the store refuses requests until reopened."""
        self.grouping_until = 0.0
        """`time.monotonic()` until which writes leave their flushes to groups."""
        self._contended = 0  # threads waiting for the section's thread lock
        self._flushing = False  # a thread is flushing for the others
        self._flushed_writes = 0  # `writes` when the latest flush began
        self._covered = 0  # how many writes the latest flush covered
        self._flush_s = 0.0  # a moving average of a flush's duration

    def contend(self, waiters: int) -> None:
        """A thread starts (1) or stops (-1) waiting to enter a section: while one waits, a
        writer leaves its flush to a group."""
        with self._durable:  # `+=` is not atomic between threads of interpreted code
            self._contended += waiters

    def goes_alone(self, position: int) -> bool:
        """Whether the record at `position` is written durably at once: nobody waits for the
        locks, no group flush is recent, and every record before it is durable."""
        return (
            self._contended == 0
            and not self.lock_waited
            and time.monotonic() >= self.grouping_until
            and self.is_durable(position - 1)
        )

    def appended(self, position: int, durable: bool) -> None:
        """Under the section: the record at `position` is written (durably if `durable`)."""
        self.saw(position)
        self._shm.raise_written(position)
        self.writes += 1
        if durable:
            self.mark_durable(position)

    def saw(self, position: int) -> None:
        """Under the section: the log holds a record (or an epoch's end) at `position`."""
        if position > self.seen_pos:
            self.seen_pos = position

    def is_durable(self, position: int) -> bool:
        """Whether the log is known durable up to `position` (by this process or, through the
        shared mark, another). Also called under the section alone (see the class)."""
        if position <= self.durable_pos:
            return True
        if self.broken is not None:  # closed, maybe: only what this process saw flushed
            return False
        mark = self._shm.durable_mark()
        if position <= mark:
            self.durable_pos = max(self.durable_pos, mark)
            return True
        return False

    def mark_durable(self, position: int) -> None:
        with self._durable:
            if position > self.durable_pos:
                self.durable_pos = position
            self._shm.raise_mark(position)
            self._durable.notify_all()

    def flush_under_lock(self) -> None:
        """Flush the log from inside a section; a failure breaks the store (pages may be lost)."""
        try:
            self._log.sync()
        except OSError as e:
            self.broken = f"a flush of its log failed: {os_reason(e)}"
            raise KvUnavailable(
                f"flush of {self._log.path} failed: {os_reason(e)}; the store refuses requests "
                "until it is reopened"
            ) from e

    def await_durable(self, position: int) -> None:
        """Return once the log is durable up to `position`, flushing it if no other thread is.

        One waiting thread per process flushes (`_flush_for_all`) while the others wait on
        `_durable`; it holds no lock while it flushes, so writers go on appending meanwhile, and
        the next flush covers all of them at once: that is the group commit. A failed flush
        breaks the store; every waiter then learns that its write may be lost.
        """
        durable = self._durable
        with durable:
            self._gathered.notify()
            while not self.is_durable(position):
                if self.broken is not None:
                    raise KvIndeterminate(
                        f"the file store {self._path} broke before this write was durable "
                        f"({self.broken}); it may or may not have been applied"
                    )
                if self._flushing:
                    durable.wait()
                    continue
                self._flushing = True
                try:
                    self._flush_for_all()
                finally:
                    self._flushing = False
                    durable.notify_all()

    def _flush_for_all(self) -> None:
        """Under `_durable`, as this process's flusher: flush what this process has written or
        seen, unless another process's flush covers it.

        A flush that follows one shared by several writes first gives the writers it woke, about
        to write again, up to half a flush's time to append (`_gather`). Then one process of the
        host at a time flushes (the flusher lock on `kv.shm`), up to the last record any process
        has written; a process that finds the lock taken waits for that flush, whose end often
        covers it, and else flushes next, for everything written meanwhile. A flusher that has
        held the lock for `_FLUSHER_PATIENCE` flushes (a stopped process) is flushed around:
        `fdatasync` covers the file whoever wrote its pages, and once a holder is past its
        time every later flush goes around it at once.
        """
        self._gather()
        want, shm, writes = self.seen_pos, self._shm, self.writes
        self._covered, self._flushed_writes = writes - self._flushed_writes, writes
        before = target = 0
        patience = max(_MIN_FLUSHER_WAIT_S, _FLUSHER_PATIENCE * self._flush_s)
        patience = min(patience, self.lock_timeout)
        self._durable.release()
        try:
            locked, delay = shm.try_lock_flusher(), _FIRST_POLL
            while locked < 0 and not self.is_durable(want) and shm.flusher_held_s() < patience:
                time.sleep(delay)
                delay = min(2 * delay, _MAX_POLL)
                locked = shm.try_lock_flusher()
            try:
                if self.is_durable(want):
                    return
                before = max(self.durable_pos, shm.durable_mark())
                started, end = time.monotonic(), max(want, shm.written_mark())
                try:
                    self._log.sync()
                except OSError as e:
                    self.broken = f"a flush of its log failed: {os_reason(e)}"
                    return
                self._flush_s += (time.monotonic() - started - self._flush_s) / 4
                shm.raise_mark(end)
                target = end
            finally:
                if locked >= 0:
                    shm.unlock_flusher(locked)
        finally:
            self._durable.acquire()
        if target - before > 1:  # several records, from this process or others
            self.grouping_until = time.monotonic() + _GROUPING_S
        if self.broken is None and target > self.durable_pos:
            self.durable_pos = target

    def _gather(self) -> None:
        """Under `_durable`: wait until as many writes of this process have come since the
        latest flush as it covered, or half a flush's time, whichever is first (nothing if it
        covered one)."""
        if self._covered < 2:
            return
        deadline = time.monotonic() + self._flush_s / 2
        while self.writes - self._flushed_writes < self._covered:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._gathered.wait(left)

    def close(self) -> None:
        """Under the section's thread lock: wait out a flush in flight (it must not sync a
        reused descriptor), flush what waiters wrote (theirs to keep), and refuse from now on."""
        with self._durable:
            while self._flushing:
                self._durable.wait()
            if self.broken is None and self.seen_pos > self.durable_pos:
                try:
                    self._log.sync()
                    self.durable_pos = self.seen_pos
                except OSError as e:
                    self.broken = f"a flush of its log failed: {os_reason(e)}"
            self.broken = self.broken or "it was closed"
            self._durable.notify_all()
