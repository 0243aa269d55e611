"""Appending to the log and folding it: the only writes of `kv.log`'s records and headers, and
the fold that empties a full log into the base."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from pagekv.kv.errors import KvIndeterminate, KvUnavailable
from pagekv.kv.file.base import Base
from pagekv.kv.file.epoch import Epoch, position
from pagekv.kv.file.group_commit import GroupCommit
from pagekv.kv.file.log import ALIGN, DATA_START, LOG_FORMAT, LogFile, LogHeader, os_reason
from pagekv.kv.file.pending import Pending
from pagekv.kv.file.shm import ShmFile


class Appender:
    """Writes records, headers and folds; the caller holds an exclusive section throughout.

    Invariants:
    - Records are appended only to the live epoch, `log_state.epoch + 1`, and never to a sealed
      one (`make_writable` finishes an interrupted fold first).
    - A fold seals the log header before it touches the base, and records the epoch it folded in
      the same transaction as the data (`Base.fold`).
    - After a failed or short write of a record or header the store is broken (`GroupCommit.
      broken`): the kernel may have dropped the unwritten pages, and later records must never
      follow a hole. A full disk while growing the log leaves it usable: nothing was written.

    `folds` (package-internal) is guarded by the section; the rest is fixed at open.
    """

    def __init__(
        self,
        log: LogFile,
        shm: ShmFile,
        epoch: Epoch,
        base: Base,
        commit: GroupCommit,
        log_bytes: int,
        store_id: bytes,
    ) -> None:
        self._log = log
        self._shm = shm
        self._epoch = epoch
        self._base = base
        self._commit = commit
        self._log_bytes = log_bytes
        self._store_id = store_id
        self.folds = 0

    def append(
        self,
        ns: int,
        body: bytes,
        change: Callable[[Pending], object],
        created: str | None = None,
    ) -> int:
        """Apply one record to namespace `ns` and write it; return its position if it is not
        durable yet (the section waits for it on exit), else 0. `change` is what replaying
        `body` does to the namespace's pending state, and `created` the name of a namespace the
        record creates.

        The change is applied before the record is written, while the CPU is still warm
        (measured: the same Python runs about 3x slower right after a sync). That is safe because
        nothing can read the pending state before the write returns (the caller holds both
        locks), a failed write breaks the store, so the state is never read at all, and whoever
        reads it after the locks are released waits until the record is durable.
        """
        epoch, commit = self._epoch, self._commit
        size = LogFile.record_size(body)
        if epoch.offset > DATA_START and epoch.offset + size > self._log_bytes:
            self.fold()
            self.start_epoch()
        header = epoch.header
        assert header is not None and epoch.live and not header.sealed
        offset, seq = epoch.offset, epoch.seq + 1
        self._grow(offset + size)
        pending = epoch.pending_for(ns) if created is None else epoch.add_created(ns, created)
        change(pending)
        epoch.offset, epoch.seq = offset + size, seq
        at = position(header.epoch, seq)
        pending.last = at
        durable = commit.goes_alone(at)
        try:
            epoch.changes = self._shm.bump()
            epoch.chain = self._log.append(offset, epoch.chain, seq, body, durable)
        except OSError as e:
            commit.broken = f"an append to its log failed: {os_reason(e)}"
            raise KvIndeterminate(
                f"append to {self._log.path} failed: {os_reason(e)}; the write may or may not "
                "have been applied, and the store refuses requests until it is reopened"
            ) from e
        commit.appended(at, durable)
        return 0 if durable else at

    def _grow(self, size: int) -> None:
        """Make the log at least `size` bytes. A full disk leaves the store usable (nothing of
        the request was written); a failed flush of the new blocks breaks it."""
        try:
            grown = self._log.ensure_size(size)
        except OSError as e:
            raise KvUnavailable(
                f"cannot grow {self._log.path}: {os_reason(e)}; nothing was written"
            ) from e
        if grown:
            self._commit.flush_under_lock()
            self._commit.mark_durable(self._commit.seen_pos)

    def write_header(self, header: LogHeader, new_epoch: bool = False) -> None:
        """Write `header` to its slot (a flush: every record written so far becomes durable);
        `new_epoch` clears the first record's sector first (`LogFile.clear_first_record`)."""
        epoch, log = self._epoch, self._log
        self._grow(DATA_START + ALIGN)
        try:
            epoch.changes = self._shm.bump()
            if new_epoch:
                log.clear_first_record()
            log.write_header(header)
        except OSError as e:
            self._commit.broken = f"a header write to its log failed: {os_reason(e)}"
            raise KvUnavailable(
                f"header write to {log.path} failed: {os_reason(e)}; the request was not "
                "applied, and the store refuses requests until it is reopened"
            ) from e
        epoch.header = header
        epoch.header_bytes = log.header_bytes()
        epoch.stamp = log.header_stamp()
        self._commit.mark_durable(self._commit.seen_pos)

    def make_writable(self) -> None:
        """Ensure the header is live, unsealed and of this build's log format: finish an
        interrupted fold first, and fold an older log format's epoch before appending (the
        upgrade of the log; the base's schema version already fences older builds off)."""
        epoch = self._epoch
        header = epoch.header
        if epoch.live and header is not None and not header.sealed and header.format == LOG_FORMAT:
            return
        if epoch.live:
            self.fold()
        self.start_epoch()

    def fold(self) -> None:
        """Seal the epoch, then apply its pending state to the base and mark the epoch folded."""
        epoch = self._epoch
        header = epoch.header
        assert header is not None
        if not header.sealed:
            self.write_header(replace(header, hseq=header.hseq + 1, sealed=True))
        try:
            # Counted before the base changes: a process holding this epoch's pending state
            # must drop it once the base holds the epoch (`LogFollower`), even if this one dies
            # before the next epoch's header, the only other write that would tell it.
            epoch.changes = self._shm.bump()
            if self._base.fold(header.epoch, epoch.pending):
                self.folds += 1
        except KvIndeterminate as e:
            epoch.changes = epoch.header_bytes = None  # the base may hold the epoch: re-read
            # Whether it committed or not, the next look finds out and goes on from there; the
            # request that needed the fold has not been written.
            raise KvUnavailable(f"{e}; the fold is retried, and the request was not applied") from e
        except BaseException:
            epoch.changes = epoch.header_bytes = None
            raise

    def start_epoch(self) -> None:
        """Start the epoch after the folded one, in the same file, under a new salt."""
        epoch, log = self._epoch, self._log
        previous = epoch.header
        hseq = previous.hseq + 1 if previous is not None else 1
        number = self._base.folded_epoch() + 1
        salt = os.urandom(8)
        header = LogHeader(hseq, number, salt, False, LOG_FORMAT, self._store_id, self._shm.ident)
        self.write_header(header, new_epoch=True)
        epoch.restart()
        epoch.live = True
        epoch.chain = log.salt_seed(salt)
        self._commit.saw(position(number, 0))
        self._shm.raise_written(self._commit.seen_pos)
        self._commit.mark_durable(self._commit.seen_pos)
