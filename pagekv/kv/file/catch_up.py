"""Catching up with the log: applying what other processes appended, following a new epoch or
another `kv.shm`, and refusing a log that does not belong to the base."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pagekv.kv.errors import KvUnavailable, StoreDamaged
from pagekv.kv.file.append import Appender
from pagekv.kv.file.base import Base
from pagekv.kv.file.epoch import EPOCH_END, Epoch, position
from pagekv.kv.file.group_commit import GroupCommit
from pagekv.kv.file.log import DATA_START, LogFile, LogHeader, SlotState
from pagekv.kv.file.log_records import Create, decode
from pagekv.kv.file.shm import ShmFile


class NeedsExclusive(Exception):
    """Raised by a catch-up under the shared lock that must write (`kv.shm` to rebuild or to
    name): the section takes the exclusive lock and catches up again."""


class LogFollower:
    """Brings the `Epoch` view up to date with the log at the start of every section.

    Invariants: after `catch_up` the view matches the log as of the `flock` the section holds;
    applying an epoch to a base that already holds it changes nothing, so an epoch folded by
    another process meanwhile is dropped from the view, not applied twice. Anything this
    process saw of a sealed or folded epoch is durable before it is used. Writes only under the
    exclusive lock (`NeedsExclusive` otherwise). Holds no state of its own: the caller holds the
    section, which guards the view.
    """

    def __init__(
        self,
        log: LogFile,
        shm: ShmFile,
        epoch: Epoch,
        base: Base,
        commit: GroupCommit,
        appender: Appender,
        directory: Path,
        store_id: bytes,
    ) -> None:
        self._log = log
        self._shm = shm
        self._epoch = epoch
        self._base = base
        self._commit = commit
        self._appender = appender
        self._directory = directory
        self._store_id = store_id

    def catch_up(self, exclusive: bool) -> None:
        """Apply the records appended since this process last looked; follow a new epoch.
        `exclusive`: the section holds the log's exclusive lock, so the catch-up may write.

        Looks at `kv.shm`'s change counter and at the log header's stamp: the counter alone
        would miss the records of processes that share another `kv.shm` (this one was deleted
        or replaced), but those wrote a header naming theirs before anything else.
        """
        shm, epoch = self._shm, self._epoch
        if not shm.intact():
            self._adopt_shm(exclusive)
        ident, changes, stamp = shm.ident, shm.changes(), self._log.header_stamp()
        if changes != epoch.changes or stamp != epoch.stamp:
            self._follow(exclusive)
            if shm.ident == ident:
                epoch.changes, epoch.stamp = changes, stamp
            else:
                epoch.changes = None

    def _follow(self, exclusive: bool) -> None:
        try:
            self._follow_log(exclusive)
        except BaseException:
            self._epoch.header_bytes = None  # whatever was applied, the next look starts over
            raise

    def _follow_log(self, exclusive: bool) -> None:
        log, epoch = self._log, self._epoch
        trusted = epoch.header_bytes is not None  # the pending state matches `epoch.header`
        if trusted and epoch.live:
            self._replay_records()
        raw = log.header_bytes()
        # A sealed epoch may have been folded since without a header write: look at the base.
        sealed = epoch.live and epoch.header is not None and epoch.header.sealed
        if trusted and raw == epoch.header_bytes and not sealed:
            return
        old, slots = epoch.header, log.decode_header(raw)
        header = slots.header
        if header is not None and header.format >= 3:
            if header.store != self._store_id:
                raise StoreDamaged(
                    log.path,
                    f"the log belongs to another store ({header.store.hex()}), not to the "
                    f"one in {self._directory.name}/kv.sqlite3 ({self._store_id.hex()})",
                )
            if header.shm != self._shm.ident:
                self._adopt_shm(exclusive)
                if header.shm != self._shm.ident:  # the one it names is gone: name the new one
                    if not exclusive:
                        raise NeedsExclusive()
                    header = replace(header, hseq=header.hseq + 1, shm=self._shm.ident)
                    self._appender.write_header(header)
                    raw = log.header_bytes()
        epoch.header_bytes, epoch.header = raw, header
        folded = self._base.folded_epoch()
        if slots.damaged:
            self._check_fallback(header, folded)
        if header is not None and header.epoch > folded:
            if trusted and epoch.live and old is not None and header.salt == old.salt:
                # The same epoch, not folded yet (if sealed since, its folder died before the
                # base), or only another `kv.shm` named: the pending state still describes the
                # epoch. Once the base holds the epoch, the pending state must go, or a lookup
                # of a key's old size would find its new one.
                if header.sealed:
                    self._sealed_is_durable(header)
                return
            if header.epoch != folded + 1:
                raise KvUnavailable(
                    f"{log.path} holds epoch {header.epoch} but the base has folded only up to "
                    f"{folded}; the store is damaged"
                )
        epoch.restart()
        epoch.live = header is not None and header.epoch > folded
        if header is None:
            return
        epoch.chain = log.salt_seed(header.salt)
        if epoch.live:
            self._replay_records()
            if header.sealed:
                self._sealed_is_durable(header)
        else:  # folded, so its seal was flushed before the base changed: all of it is durable
            self._commit.saw(position(header.epoch, EPOCH_END))
            self._commit.mark_durable(self._commit.seen_pos)

    def _replay_records(self) -> None:
        """Apply the live epoch's records past the ones applied already."""
        log, epoch = self._log, self._epoch
        header = epoch.header
        assert header is not None
        fmt = header.format
        while (found := log.read_record(epoch.offset, epoch.chain, epoch.seq + 1, fmt)) is not None:
            body, crc = found
            self._replay(body, fmt)
            if header.chained:
                epoch.chain = crc
        self._commit.saw(position(header.epoch, epoch.seq))

    def _replay(self, body: bytes, fmt: int) -> None:
        epoch = self._epoch
        try:
            record = decode(body)
        except ValueError as e:
            raise KvUnavailable(f"record {epoch.seq + 1} of {self._log.path}: {e}") from e
        if isinstance(record, Create):
            pending = epoch.add_created(record.ns, record.name)
        else:
            pending = epoch.pending_for(record.ns)
            pending.apply(record)
        epoch.offset += LogFile.record_size(body, fmt)
        epoch.seq += 1
        header = epoch.header
        assert header is not None
        pending.last = position(header.epoch, epoch.seq)

    def _check_fallback(self, header: LogHeader | None, folded: int) -> None:
        """With a header slot that does not check out, the other one is the header only if
        nothing shows that the bad one was newer and its epoch has records.

        A torn header write is the one way a crash leaves a bad slot, and it happens before any
        record of the epoch it starts; every new epoch clears the first record's sector before
        its header (`Appender.start_epoch`). So if the good slot's epoch is folded (a newer
        header must have followed it), the first sector must be empty or a record of that folded
        epoch; a record of anything else means the newer header was damaged after records were
        written under it, and they cannot be read without its salt. Neither slot good: only an
        empty log (a torn first header) can be read, as no log.
        """
        log = self._log
        if header is None:
            if not log.first_record_empty():
                raise StoreDamaged(
                    log.path,
                    "both header slots are damaged, and records follow them; without the "
                    "header they cannot be checked, so the store refuses to open rather than "
                    "start the log over",
                )
            return
        if header.epoch > folded or log.first_record_empty():
            return
        if log.read_record(DATA_START, log.salt_seed(header.salt), 1, header.format) is None:
            raise StoreDamaged(
                log.path,
                f"header slot {1 - header.hseq % 2} is damaged, and the records after the "
                f"headers are not of epoch {header.epoch} that the other slot names; they "
                "cannot be checked without the damaged header, so the store refuses to open "
                "rather than drop them",
            )

    def _adopt_shm(self, exclusive: bool) -> None:
        """Share the `kv.shm` at the path, made this store's: at open, and when the one mapped
        was overwritten or the log header names another.

        The change counter, the durable mark and the flusher lock are only shared if every
        process maps one file. A process that opens the store after `kv.shm` was deleted or
        replaced maps a new one, and names it in the log header before it appends; the others
        see the header change at their next operation and move to it here. A `kv.shm` that is
        new, of a pagekv before its format, of another store or overwritten is rebuilt, and its
        marks are set only after a flush. A rebuild needs the log's exclusive lock
        (`NeedsExclusive`); a look does not.
        """
        shm = self._shm
        shm.remap()
        if shm.state(self._store_id) is not SlotState.VALID:
            if not exclusive:
                raise NeedsExclusive()
            shm.rebuild(self._store_id)
            self._commit.flush_under_lock()
            shm.reset_marks(self._commit.seen_pos)
        self._epoch.changes = None

    def _sealed_is_durable(self, header: LogHeader) -> None:
        """A sealed epoch takes no more records, and its folder flushed the log as it sealed it,
        unless it died before that flush: flush it once more, so its waiters can all return."""
        end = position(header.epoch, EPOCH_END)
        commit = self._commit
        commit.saw(end)
        if commit.durable_pos < end:
            commit.flush_under_lock()
            commit.mark_durable(end)
