"""The `file://` store's write-ahead log: one preallocated file of checksummed, fsynced records.

Layout of `kv.log` (integers little-endian), log format 3:

- bytes 0-511 and 512-1023: two **header slots**, `magic:8 | hseq:u64 | epoch:u64 | salt:8 |
  sealed:u8 | store:16 | shm_dev:u64 | shm_ino:u64 | crc32c:u32` over the bytes before the CRC.
  The valid slot with the larger `hseq` is the header; a new header goes to slot `hseq % 2`, so a
  torn header write leaves the previous one readable. `store` is the store's identity (also in
  the base), `shm_dev`/`shm_ino` name the `kv.shm` its processes share (`shm.py`).
- from byte 4096: **records**, each starting on a 512-byte boundary: `crc32c:u32 | length:u32 |
  seq:u64 | nonce:u64 | body`, where the CRC covers the length, the sequence number, the nonce and
  the body, seeded with the previous record's CRC (the first record's with the CRC of the
  header's salt), `seq` counts from 1 in each epoch, and `nonce` is random per open store (per
  `LogFile`). The log ends at the first record that does not check out.

The magic says the format: `pkvlog3` is this one; `pkvlog2` (format 2) had no `store`, `shm_*`
or record nonce; `pkvlog1` (format 1, before group commit) also seeded every record with the salt
alone. This build reads all three and appends only to format 3 (an older epoch is folded first).
A slot whose magic starts with `pkvlog` but names another version is a newer format, and the
store refuses it (`FormatTooNew`) rather than take the log for absent and write over it.

Why a salted CRC and a contiguous `seq`: after a crash the bytes past the last record can be a torn
record or records of an earlier epoch (the file is reused, never truncated). Neither can pass for a
record of the current epoch, and a stored value that happens to contain record-shaped bytes cannot
either, because it cannot know the random salt. Why the chain: with group commit several records
wait in the page cache for one flush, and a power loss can keep a later one and lose an earlier one.
The replay stops at the hole. Why the nonce: the record written into the hole next must differ
from the lost one, or the stranded record after it would check out again and rejoin the log; the
same operation redone after a restart (a takeover to the same generation) has the same body, but
not the same nonce. Why 512-byte alignment: records are written with `O_DIRECT`, which needs
sector-aligned offsets and lengths; on this ext4 a direct write of 4.3 KB took the same time at
512-byte and at 4 KiB alignment, and 512 wastes less of the log (a 100-byte write takes one
sector, not one page).

Invariants: a record is acknowledged only once it is durable: written with `O_DSYNC`, or
written to the page cache and covered by a later `sync`. A record is written durably at once only
when every record before it is durable, so the durable records are always a prefix of the log and
a crash can tear or lose only records that were never acknowledged.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from crc32c import crc32c

from pagekv.kv.errors import FormatTooNew
from pagekv.kv.file.lock_holders import lock_holders

DATA_START: Final = 4096
ALIGN: Final = 512
LOG_FORMAT: Final = 3
"""The log format this build appends: `pkvlog3`. It reads formats 1 to 3."""
_MAGIC_PREFIX: Final = b"pkvlog"
_MAGICS: Final = {1: b"pkvlog1\0", 2: b"pkvlog2\0", 3: b"pkvlog3\0"}
_FORMATS: Final = {magic: version for version, magic in _MAGICS.items()}
_SLOT_SIZE: Final = 512
_HEADER_OLD: Final = struct.Struct("<8sQQ8sB")
"""Formats 1 and 2: magic, hseq, epoch, salt, sealed."""
_HEADER: Final = struct.Struct("<8sQQ8sB16sQQ")
"""Format 3: also the store's identity and the device and inode of its `kv.shm`."""
_CRC: Final = struct.Struct("<I")
_HSEQ: Final = struct.Struct("<Q")
_SLOT_BYTES: Final = 128
"""The bytes of a slot that `header_bytes` compares: every known header, and room to spare."""
_RECORD_OLD: Final = struct.Struct("<IIQ")
"""Formats 1 and 2: crc, length, seq."""
_RECORD: Final = struct.Struct("<IIQQ")
"""Format 3: crc, length, seq, nonce."""
_LENGTH_SEQ_NONCE: Final = struct.Struct("<IQQ")
_FIRST_EXTENT: Final = 256 * 1024
_MAX_EXTENT: Final = 2 * 2**20
_PADDING: Final = bytes(ALIGN)
_LOCK_EX: Final = fcntl.LOCK_EX
_LOCK_SH: Final = fcntl.LOCK_SH
_LOCK_UN: Final = fcntl.LOCK_UN
_LOCK_NB: Final = fcntl.LOCK_NB
_FIRST_POLL: Final = 50e-6
_MAX_POLL: Final = 1e-3


@dataclass(frozen=True, slots=True)
class LogHeader:
    """Which epoch the records belong to; `sealed` means a fold of it into the base has begun.
    `format` is the log format of the epoch's records (`LOG_FORMAT` for every epoch this build
    starts; an older one is folded before anything is appended to it). `store` and `shm` (the
    `kv.shm` in use, as device and inode) exist from format 3 on: empty and `(0, 0)` before."""

    hseq: int
    epoch: int
    salt: bytes
    sealed: bool
    format: int = LOG_FORMAT
    store: bytes = b""
    shm: tuple[int, int] = (0, 0)

    @property
    def chained(self) -> bool:
        """Whether each record's CRC is seeded with the previous one's (format 2 on)."""
        return self.format >= 2

    def encode(self) -> bytes:
        magic = _MAGICS[self.format]
        if self.format < 3:
            head = _HEADER_OLD.pack(magic, self.hseq, self.epoch, self.salt, self.sealed)
        else:
            dev, ino = self.shm
            head = _HEADER.pack(
                magic, self.hseq, self.epoch, self.salt, self.sealed, self.store, dev, ino
            )
        return head + _CRC.pack(crc32c(head))


class SlotState(enum.Enum):
    EMPTY = "empty"
    """Never written: all zeros."""
    VALID = "valid"
    DAMAGED = "damaged"
    """Written, but it does not check out: torn by a crash during a header write, or damaged."""


@dataclass(frozen=True, slots=True)
class HeaderSlots:
    """What the two header slots hold: `header` the valid one with the larger `hseq` (None if
    neither is valid), `damaged` whether a slot that is not empty failed its check."""

    header: LogHeader | None
    damaged: bool


def _decode_slot(raw: bytes, path: Path) -> tuple[SlotState, LogHeader | None]:
    """One slot's state and header; raises `FormatTooNew` for a newer format's magic."""
    magic = raw[:8]
    version = _FORMATS.get(magic)
    if version is None:
        if magic.startswith(_MAGIC_PREFIX):
            found = magic[len(_MAGIC_PREFIX) :].rstrip(b"\0").decode("latin-1")
            raise FormatTooNew(path, "log", found, LOG_FORMAT)
        return (SlotState.EMPTY if not any(raw) else SlotState.DAMAGED), None
    layout = _HEADER if version >= 3 else _HEADER_OLD
    size = layout.size
    if _CRC.unpack_from(raw, size)[0] != crc32c(raw[:size]):
        return SlotState.DAMAGED, None
    if version >= 3:
        _, hseq, epoch, salt, sealed, store, dev, ino = _HEADER.unpack_from(raw)
        return SlotState.VALID, LogHeader(hseq, epoch, salt, bool(sealed), 3, store, (dev, ino))
    _, hseq, epoch, salt, sealed = _HEADER_OLD.unpack_from(raw)
    return SlotState.VALID, LogHeader(hseq, epoch, salt, bool(sealed), version)


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


class LogFile:
    """The open log file: locking, headers, and reading and appending records.

    Reads go through a read-only shared mapping (remapped when the file has grown), so catching
    up with an unchanged log costs no system call. The file only ever grows, so a mapping never
    points past its end. Every method raises `OSError` on I/O failure; the store decides what
    that means. `nonce` goes into every record this object appends (random per object, so per
    open store).

    Used under the store's section (`flock`, `lock` and `unlock` themselves aside), but for
    `sync`, which the group commit's flusher calls without it (`fdatasync` needs no lock);
    `flushes` counts them, a statistic only.
    """

    def __init__(self, path: Path, flush_delay: float = 0.0) -> None:
        self.path = path
        self.flush_delay = flush_delay
        self.flushes = 0
        self.nonce = int.from_bytes(os.urandom(8), "little")
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._map: mmap.mmap | None = None
        self._size = 0  # a lower bound of the file's size: other processes may have grown it
        self._direct = _open_direct(path)
        self._buffer: mmap.mmap | None = None
        self._salt, self._salt_crc = b"", crc32c(b"")

    # -- the log -----------------------------------------------------------------------------

    def lock(self, exclusive: bool, timeout: float) -> bool:
        """Take the log's `flock`, waiting at most `timeout` seconds; `TimeoutError` past it.
        Return whether it had to wait (another process held it). A holder of the shared lock
        may ask for the exclusive one (and back): `flock` converts it, not atomically.

        A blocking `flock` cannot be given a timeout, and a holder that is stopped (SIGSTOP, a
        debugger, a frozen cgroup) would stall every other process for good. So a lock not free
        at once is polled, with sleeps growing from 50 µs to 1 ms: a waiter behind a healthy
        holder (one durable write) gets it within a millisecond of its release, and one behind
        a stopped holder gives up on time, naming the holder where `/proc/locks` tells it.
        """
        kind = _LOCK_EX if exclusive else _LOCK_SH
        try:
            fcntl.flock(self.fd, kind | _LOCK_NB)
            return False
        except BlockingIOError:
            pass
        deadline = time.monotonic() + timeout
        delay = _FIRST_POLL
        while True:
            time.sleep(delay)
            try:
                fcntl.flock(self.fd, kind | _LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        errno.ETIMEDOUT,
                        f"waited {timeout:g} s for the lock on {self.path}, "
                        f"held by {lock_holders(self.path)}",
                    ) from None
            delay = min(2 * delay, _MAX_POLL)

    def unlock(self) -> None:
        fcntl.flock(self.fd, _LOCK_UN)

    def _view(self, end: int) -> mmap.mmap | None:
        """A mapping covering `[0, end)`, or None if the file is shorter."""
        if self._map is None or len(self._map) < end:
            size = os.fstat(self.fd).st_size
            if size < end:
                return None
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
            self._size = max(self._size, size)
        return self._map

    def header_bytes(self) -> bytes:
        """The bytes of both header slots that any known header uses; unchanged bytes mean an
        unchanged header."""
        view = self._view(_SLOT_SIZE + _SLOT_BYTES)
        if view is None:
            return b""
        return view[:_SLOT_BYTES] + view[_SLOT_SIZE : _SLOT_SIZE + _SLOT_BYTES]

    def header_stamp(self) -> int:
        """The sum of both slots' `hseq` fields: every header write raises one of them, so an
        unchanged stamp means no header was written. Read from the mapping, no system call
        once the log has a header (every known format keeps `hseq` at byte 8)."""
        view = self._map
        if view is None or len(view) < _SLOT_SIZE + 16:
            view = self._view(_SLOT_SIZE + 16)
            if view is None:
                return 0
        stamp: int = _HSEQ.unpack_from(view, 8)[0] + _HSEQ.unpack_from(view, _SLOT_SIZE + 8)[0]
        return stamp

    def decode_header(self, raw: bytes) -> HeaderSlots:
        """The header that `header_bytes` returned; `FormatTooNew` if a slot is of a newer
        format."""
        header: LogHeader | None = None
        damaged = False
        for at in (0, _SLOT_BYTES):
            state, found = _decode_slot(raw[at : at + _SLOT_BYTES], self.path)
            damaged = damaged or state is SlotState.DAMAGED
            if found is not None and (header is None or found.hseq > header.hseq):
                header = found
        return HeaderSlots(header, damaged)

    def write_header(self, header: LogHeader) -> None:
        """Write `header` to its slot, durably; the caller has grown the file to `DATA_START`."""
        write_all(self.fd, header.encode(), (header.hseq % 2) * _SLOT_SIZE)
        self.sync()

    def first_record_empty(self) -> bool:
        """Whether the first record's sector is all zeros (or not in the file yet)."""
        view = self._view(DATA_START + ALIGN)
        return view is None or not any(view[DATA_START : DATA_START + ALIGN])

    def clear_first_record(self) -> None:
        """Zero the first record's sector (unsynced; the next header write's flush covers it),
        before a new epoch's header: then, if that header write is torn, the sector cannot
        hold a record of an epoch whose header is lost (`catch_up.py`)."""
        write_all(self.fd, _PADDING, DATA_START)

    def read_record(
        self, offset: int, seed: int, seq: int, fmt: int = LOG_FORMAT
    ) -> tuple[bytes, int] | None:
        """The body and CRC of record `seq` at `offset`, or None where the log ends. `seed` is
        what its CRC starts from: the previous record's CRC in a chained epoch, else
        `salt_seed(salt)`; `fmt` the epoch's log format."""
        layout = _RECORD if fmt >= 3 else _RECORD_OLD
        view = self._view(offset + layout.size)
        if view is None:
            return None
        crc, length, found_seq = _RECORD_OLD.unpack_from(view, offset)
        if found_seq != seq:
            return None
        start = offset + layout.size
        view = self._view(start + length)
        if view is None:
            return None
        body = view[start : start + length]
        if crc != crc32c(body, crc32c(view[offset + 4 : start], seed)):
            return None
        return body, crc

    def salt_seed(self, salt: bytes) -> int:
        """The CRC of the salt: the first record's seed, and every record's in an unchained
        epoch (cached per epoch)."""
        if salt != self._salt:
            self._salt, self._salt_crc = salt, crc32c(salt)
        return self._salt_crc

    def sync(self) -> None:
        """Make every record written so far durable, by this process or any other: one flush
        (`fdatasync` covers the file's dirty pages, whoever wrote them)."""
        os.fdatasync(self.fd)
        self._flushed()

    def _flushed(self) -> None:
        self.flushes += 1
        if self.flush_delay:
            time.sleep(self.flush_delay)

    def append(self, offset: int, seed: int, seq: int, body: bytes, durable: bool) -> int:
        """Write record `seq` at `offset` in this build's format, its CRC seeded with `seed`,
        and return the CRC: on disk when this returns if `durable`, else in the page cache, for
        a later `sync` to cover along with its neighbours' (group commit). The caller has made
        room with `ensure_size`, so the write lands on allocated, zeroed blocks.

        A durable record's blocks (zero-padded to whole blocks) are written where the file
        system allows it with `O_DIRECT | O_DSYNC`, one system call that bypasses the page cache
        and returns once the device has them; otherwise with `pwrite` and `fdatasync`. The
        direct write measured about 30 % faster than `pwrite` + `fdatasync` on ext4
        (`benchmarks/HISTORY.md`, "The current `file://` engine"). Either way the record is
        built in one reused page-aligned buffer, as `O_DIRECT` requires, and its CRC taken there
        in one pass.
        """
        end = _RECORD.size + len(body)
        size = _aligned(end)
        if self._buffer is None or len(self._buffer) < size:
            self._close_buffer()
            self._buffer = mmap.mmap(-1, size)
        buffer = self._buffer
        with memoryview(buffer) as record:  # released on the way out, so `close` can unmap
            _LENGTH_SEQ_NONCE.pack_into(buffer, _CRC.size, len(body), seq, self.nonce)
            buffer[_RECORD.size : end] = body
            buffer[end:size] = _PADDING[: size - end]
            crc = crc32c(record[_CRC.size : end], seed)
            _CRC.pack_into(buffer, 0, crc)
            if not durable:
                write_all(self.fd, buffer, offset, 0, size)
                return crc
            if self._direct is not None:
                try:
                    written = os.pwritev(self._direct, [record[:size]], offset)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    os.close(self._direct)  # wrote nothing: the file system wants other alignment
                    self._direct = None
                else:
                    if written == size:
                        self._flushed()
                        return crc
                    # A short direct write (a full disk, a quota, RLIMIT_FSIZE): the rest goes
                    # through the page cache, which either completes it or says why it cannot.
                    write_all(self.fd, buffer, offset + written, written, size)
                    self.sync()
                    return crc
            write_all(self.fd, buffer, offset, 0, end)
            self.sync()
            return crc

    @staticmethod
    def record_size(body: bytes, fmt: int = LOG_FORMAT) -> int:
        return _aligned((_RECORD if fmt >= 3 else _RECORD_OLD).size + len(body))

    def ensure_size(self, size: int) -> bool:
        """Grow the file with zeros ahead of the records, so they overwrite allocated blocks; return
        whether it grew, and so must be synced before records go on the new blocks.

        Overwriting allocated blocks lets a durable write skip the file-size metadata; the zeros are
        synced once per extension, not with each record. The caller syncs: that flush also covers
        records waiting in the page cache, so its failure is theirs too. Extensions double up to
        `_MAX_EXTENT`, which bounds the pause of the write that pays for one. The current size is
        read from the file before growing it: zeros written from a stale size would erase records.
        """
        if size <= self._size:
            return False
        current = os.fstat(self.fd).st_size
        grown = size > current
        if grown:
            step = min(max(current, _FIRST_EXTENT), _MAX_EXTENT)
            target = max(_aligned(size), current + step)
            write_all(self.fd, bytes(target - current), current)
            current = target
        self._size = current
        return grown

    def _close_buffer(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
        self._buffer = None

    def close(self) -> None:
        """Idempotent; later calls on a closed log fail with `OSError`."""
        self._close_buffer()
        if self._map is not None and not self._map.closed:
            self._map.close()
        self._map = None
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def os_reason(e: OSError) -> str:
    """`ENOSPC (No space left on device)`: the symbolic errno a user can search for."""
    name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "OSError"
    return f"{name} ({e.strerror or e})"


def write_all(
    fd: int, data: bytes | mmap.mmap, offset: int, start: int = 0, end: int | None = None
) -> None:
    """Write `data[start:end]` at `offset` in full, or raise `OSError`.

    `pwrite` may write less than asked without an error (the disk filled up, a quota or
    `RLIMIT_FSIZE` was reached); writing the rest then fails with the reason (`ENOSPC`,
    `EDQUOT`, `EFBIG`), so a short write is never taken for a whole one. The view of `data` is
    released on every way out, so a traceback never keeps a mapping from being closed.
    """
    with memoryview(data) as view:
        done, stop = start, len(view) if end is None else end
        while done < stop:
            written = os.pwrite(fd, view[done:stop], offset + done - start)
            if written <= 0:
                raise OSError(errno.EIO, f"wrote nothing of {stop - done} bytes")
            done += written


def _open_direct(path: Path) -> int | None:
    """A descriptor for durable direct writes, or None where the file system has none (tmpfs)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return None
        raise
