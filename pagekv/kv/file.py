"""The embedded durable backend: a log of our own in front of one SQLite file, in a directory.

Why this engine (measured; `benchmarks/HISTORY.md`, "The current `file://` engine"): a durable
write must be fsynced before it returns. Native SQLite WAL+FULL pays one fsync plus a B-tree
update and a 4 KiB WAL frame per commit, LMDB two fsyncs, and our earlier store (SQLite
underneath) all of native's work plus the fence, the quota and Python around them. Writing each
batch as one record appended to a preallocated log (`file_log.py`) pays one durable write and no
B-tree work, which is what lets a one-entry write keep up with a native one-row commit. The B-tree
work is done in bulk instead: when the log is full, its changes are **folded** into `kv.sqlite3`
(rollback journal, `synchronous=FULL`) in one transaction, so reads stay indexed, memory stays
bounded by the log's size, and opening a store replays at most one log.

Files: `kv.log` (records of the current epoch; bodies in `file_records.py`) and `kv.sqlite3` with
`namespaces(id, name, generation, used)`, `entries(ns, key, value)` and `log_state(epoch)`, the
last epoch folded into the base. `docs/FORMAT.md` describes both.

How an operation runs: under the store's thread lock and a `flock` on `kv.log` (shared to read,
exclusive to write, so processes sharing the directory are serialised), it first catches up with
records other processes appended, then works on the **pending** state: each namespace's changes
of the current epoch, kept in memory over the base. A write checks the fence and the quota there,
applies its change and writes one record; if that write fails, the store refuses every request
until it is reopened (`_append`). Creating a namespace is one such record too.

**Group commit.** A write alone (no other thread or process waited for the lock, every earlier
record durable) makes its record durable before it lets go of the locks: one `O_DSYNC` write, the
fastest way for one writer. Otherwise it writes its record to the page cache, lets go, and waits for
a flush that covers it (`_await_durable`): one waiter per process, and one process of the host at a
time, flushes outside the locks while the others append, so concurrent writers of any namespaces, in
any of the processes sharing the directory, share one `fdatasync`. Records are chained by their CRCs
(`file_log.py`), so one stranded after a hole can never rejoin the log. An operation that saw a
record not yet durable (a read of its namespace, a fence it failed) waits for it too, so nothing
returns what a crash could undo.

Invariants:
- The visible state is the pending state over the base. The pending state is a function of the
  epoch's records and the base alone, so every process computes the same one, and applying an
  epoch to a base that already holds it changes nothing.
- Records are appended only to the live epoch, `log_state.epoch + 1`, and never to a sealed one.
- A fold seals the log header before it touches the base, and records the epoch it folded in the
  same transaction as the data. A writer that finds a sealed epoch (its folder crashed) finishes
  the fold and starts the next epoch before it appends.
- After a failed or short write of a record, or a failed `fsync`, the store refuses every further
  request until it is reopened: the kernel may have dropped the unwritten pages, and later
  records must never follow a hole. (A short write is one: `file_log.write_all`.)
- An operation returns only once every record it wrote or saw is durable. Records are made
  durable in log order (a record is written with `O_DSYNC` only when all before it are durable,
  and a flush covers all written before it), so a crash loses a suffix of unacknowledged records.
- Every wait for the log's `flock` or the base's lock ends within `lock_timeout`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, assert_never

import apsw

from pagekv.kv.api import FlushCounts
from pagekv.kv.errors import FormatTooNew, KvIndeterminate, KvUnavailable, StoreDamaged
from pagekv.kv.fence import check_fence
from pagekv.kv.file_log import (
    ALIGN,
    DATA_START,
    LOG_FORMAT,
    LogFile,
    LogHeader,
    SlotState,
    lock_holders,
    os_reason,
    processes_holding,
)
from pagekv.kv.file_records import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    Create,
    Range,
    Record,
    Takeover,
    Write,
    decode,
    encode_create,
    encode_range,
    encode_takeover,
    encode_write,
)
from pagekv.kv.limits import KvLimits, WriteBatch, check_name, check_quota
from pagekv.kv.namespace import KvNamespace
from pagekv.kv.sorted_keys import SortedKeys

_SCHEMA_VERSION: Final = 4
"""3: the log holds namespace creations (older versions would refuse the log as damaged).
4: log format 3 (record nonces, the store's identity and `kv.shm`'s in the header), `kv.shm`
format 1, and the `store` table (older versions would take the new log header for no log)."""
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS namespaces (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        generation INTEGER NOT NULL DEFAULT 0,
        used INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS entries (
        ns INTEGER NOT NULL,
        key BLOB NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (ns, key)
    ) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS log_state (epoch INTEGER NOT NULL)",
    "INSERT INTO log_state(epoch) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM log_state)",
    "CREATE TABLE IF NOT EXISTS store (id BLOB NOT NULL)",
    "INSERT INTO store(id) SELECT randomblob(16) WHERE NOT EXISTS (SELECT 1 FROM store)",
)
_UPSERT_ROWS: Final = 64
"""Rows per statement when a fold writes the base: one statement of many rows cost 45 % less
per row than one statement per row (65,536 rows of 100 B: 53-72 ms against 90-129 ms)."""


def _upsert(rows: int) -> str:
    values = ", ".join(["(?, ?, ?)"] * rows)
    return (
        f"INSERT INTO entries(ns, key, value) VALUES {values} "
        "ON CONFLICT(ns, key) DO UPDATE SET value = excluded.value"
    )


_UPSERT_ONE: Final = _upsert(1)
_UPSERT_MANY: Final = _upsert(_UPSERT_ROWS)
_SIZE: Final = "length(key) + length(value)"
DEFAULT_LOCK_TIMEOUT: Final = 30.0
_BASE_PAGE_SIZE: Final = 32 * 1024
_KEYS_PER_QUERY: Final = 500
DEFAULT_LOG_BYTES: Final = 32 * 2**20
_EPOCH_END: Final = 2**32 - 1
"""The largest `seq` of an epoch's positions: `_position(epoch, _EPOCH_END)` is past every
record of the epoch."""
_FIRST_POLL: Final = 20e-6
_MAX_POLL: Final = 500e-6
"""A process waiting for another's flush looks again after 20 µs, then twice as long each time
up to 0.5 ms: a flush takes from 0.1 ms to a few ms."""
_GROUPING_S: Final = 0.1
"""How long after a flush shared by several writes a write still leaves its flush to a group:
writers that have just been woken by one flush are about to write again, and one of them going
alone would hold the lock through its own flush while the others queue behind it."""
_MAX_GAPS: Final = 16
"""Reads that would query more gaps between hidden ranges than this read the span at once."""
_FLUSHER_PATIENCE: Final = 10
_MIN_FLUSHER_WAIT_S: Final = 0.01
"""A process waits for another's flush at most this many of its own average flushes, and at
least this long, past the moment the other took the flusher lock; then it flushes itself, so
that a stopped flusher delays the others by that much once, not by every flush."""


class _NeedsExclusive(Exception):
    """Raised by a catch-up under the shared lock that must write (`FileStore._adopt_shm`): the
    section takes the exclusive lock and catches up again."""


class _Ranges:
    """Disjoint, sorted half-open key ranges (`None` end: unbounded); membership by bisection."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[bytes] = []
        self._ends: list[bytes | None] = []

    def __iter__(self) -> Iterator[tuple[bytes, bytes | None]]:
        return zip(self._starts, self._ends, strict=True)

    def __contains__(self, key: bytes) -> bool:
        i = bisect.bisect_right(self._starts, key) - 1
        if i < 0:
            return False
        end = self._ends[i]
        return end is None or key < end

    def gaps(
        self, start: bytes | None, end: bytes | None
    ) -> list[tuple[bytes | None, bytes | None]]:
        """The parts of `[start, end)` (None: unbounded) that no range covers, in key order."""
        out: list[tuple[bytes | None, bytes | None]] = []
        low = start
        for r_start, r_end in self:
            if end is not None and r_start >= end:
                break
            if low is not None and r_end is not None and r_end <= low:
                continue
            if low is None or r_start > low:
                out.append((low, r_start))
            if r_end is None:
                return out
            low = r_end if low is None else max(low, r_end)
        if end is None or low is None or low < end:
            out.append((low, end))
        return out

    def add(self, start: bytes, end: bytes | None) -> None:
        lo = bisect.bisect_left(self._starts, start)
        if lo > 0:
            previous_end = self._ends[lo - 1]
            if previous_end is None or previous_end >= start:  # overlaps or touches: merge
                lo -= 1
                start = self._starts[lo]
        hi = lo
        while hi < len(self._starts) and (end is None or self._starts[hi] <= end):
            other = self._ends[hi]
            end = None if end is None or other is None else max(end, other)
            hi += 1
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]


@dataclass(slots=True)
class _Pending:
    """One namespace's changes in the current epoch, over the base.

    `entries` maps a key to its value, or None if deleted; `hidden` holds ranges that hide every
    base key in them (a key in `entries` is never hidden: it was written after the range).

    Usage is kept lazily, so a write never has to look up a key in the base: `used` is the exact
    usage plus the base sizes of the keys in `unresolved`, keys first changed this epoch whose
    old size is still owed. It is therefore an upper bound; `FileStore._resolve` makes it exact.
    """

    generation: int
    used: int
    created: str | None = None
    """The name, if the namespace was created in this epoch (it has no row in the base yet)."""
    last: int = 0
    """The log position of the namespace's latest record in this epoch: whoever sees the
    state must wait until that position is durable."""
    entries: dict[bytes, bytes | None] = field(default_factory=dict)
    hidden: _Ranges = field(default_factory=_Ranges)
    unresolved: list[bytes] = field(default_factory=list)
    _keys: SortedKeys = field(default_factory=SortedKeys)
    """The keys of `entries`, for ranges."""

    def shadows(self, key: bytes) -> bool:
        """Whether the base's row for `key` is not what readers see."""
        return key in self.entries or key in self.hidden

    def old_size(self, key: bytes) -> int | None:
        """The charged size `key` has now; None if that is its base size, not yet looked up."""
        if key in self.entries:
            value = self.entries[key]
            return 0 if value is None else len(key) + len(value)
        return 0 if key in self.hidden else None

    def growth(self, batch: WriteBatch) -> tuple[int, list[bytes]]:
        """An upper bound of the batch's usage change, and the keys whose old size it omits."""
        delta, unknown = 0, []
        for key, value in batch.puts.items():
            old = self.old_size(key)
            delta += len(key) + len(value) - (old or 0)
            if old is None:
                unknown.append(key)
        for key in batch.deletes:
            old = self.old_size(key)
            delta -= old or 0
            if old is None:
                unknown.append(key)
        return delta, unknown

    def keys_in(self, start: bytes | None, end: bytes | None) -> list[bytes]:
        """The keys of `entries` in `[start, end)` (None: unbounded), in order."""
        keys, lo, hi = self._keys.bounds(start, end)
        return keys[lo:hi]

    def write(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        for key in deletes:
            self._set(key, None)
        for key, value in puts:
            self._set(key, value)

    def _set(self, key: bytes, value: bytes | None) -> None:
        """Record `key`'s new value (None: deleted) and keep `used` an upper bound."""
        entries = self.entries
        if key in entries:
            old = entries[key]
            if old is not None:
                self.used -= len(key) + len(old)
        else:
            self._keys.add(key)
            if key not in self.hidden:
                self.unresolved.append(key)
        if value is not None:
            self.used += len(key) + len(value)
        entries[key] = value

    def delete_range(self, start: bytes, end: bytes | None, refund: int) -> None:
        for key in self._keys.remove_range(start, end):
            del self.entries[key]
        self.hidden.add(start, end)
        self.used -= refund

    def take_over(self, generation: int) -> None:
        self.generation = generation

    def apply(self, record: Record) -> None:
        """Replay a decoded record: the same change its writer made."""
        match record:
            case Write():
                self.write(record.puts, record.deletes)
            case Range():
                self.delete_range(record.start, record.end, record.refund)
            case Takeover():
                self.take_over(record.generation)
            case Create():
                pass  # its state is the new `_Pending` itself (`FileStore._add_created`)
            case unreachable:
                assert_never(unreachable)


class FileStore:
    """All namespaces of one directory. Safe to share between threads and between processes.

    `log_bytes` is the log size at which it is folded into the base: a larger log folds less
    often and holds more in memory (about that many bytes of pending changes per open store).
    `lock_timeout` bounds, in seconds, each wait for the locks other threads and processes hold
    on the directory; past it the request fails with `KvUnavailable`, having done nothing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        limits: KvLimits | None = None,
        log_bytes: int = DEFAULT_LOG_BYTES,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        flush_delay_ms: float = 0.0,
    ) -> None:
        if not 0 <= flush_delay_ms < float("inf"):
            raise ValueError(f"flush_delay_ms must be a number >= 0, got {flush_delay_ms}")
        if log_bytes < 2 * DATA_START:
            raise ValueError(f"log_bytes must be at least {2 * DATA_START}, got {log_bytes}")
        if not 0 < lock_timeout < float("inf"):
            raise ValueError(f"lock_timeout must be a number of seconds > 0, got {lock_timeout}")
        self.lock_timeout = float(lock_timeout)
        self.path = Path(path)
        self.limits = limits or KvLimits()
        if self.limits.max_key_bytes > MAX_KEY_BYTES:
            raise ValueError(
                f"the file store holds keys of up to {MAX_KEY_BYTES} bytes, "
                f"not max_key_bytes={self.limits.max_key_bytes}"
            )
        if self.limits.max_name_bytes > MAX_NAME_BYTES:
            raise ValueError(
                f"the file store holds names of up to {MAX_NAME_BYTES} bytes, "
                f"not max_name_bytes={self.limits.max_name_bytes}"
            )
        self.log_bytes = log_bytes
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._pending: dict[int, _Pending] = {}
        self._created: dict[str, int] = {}  # namespaces created in this epoch, by name
        self._writes = self._folds = 0
        self._contended = 0  # threads waiting for `_lock` to enter a section
        self._lock_waited = False  # under `_lock`: this section waited for another process
        self._owed = 0  # under `_lock`: the position the current section must see durable
        self._log_pos = 0  # every record up to this position is in the file (maybe not durable)
        self._chain = 0  # the seed of the next record's CRC
        flush_lock = threading.Lock()
        self._durable = threading.Condition(flush_lock)
        self._gathered = threading.Condition(flush_lock)  # the flusher waits for writes on it
        self._durable_pos = 0  # under `_durable`: what this process knows to be durable
        self._flushing = False  # under `_durable`: a thread is flushing for the others
        self._flushed_writes = 0  # under `_durable`: `_writes` when the latest flush began
        self._covered = 0  # under `_durable`: how many writes the latest flush covered
        self._flush_s = 0.0  # under `_durable`: a moving average of a flush's duration
        self._grouping_until = 0.0  # `time.monotonic()` until which writes leave flushes to groups
        self._header_bytes: bytes | None = None  # None: re-read the header and the base
        self._changes: int | None = None  # the log's change counter when last caught up
        self._stamp = -1  # the log's `header_stamp` when last caught up
        self._exclusive_held = False  # under `_lock`: the section holds the log's exclusive lock
        self._header: LogHeader | None = None
        self._live = False  # whether the header's epoch is the one records go to
        self._offset = DATA_START
        self._seq = 0
        self._broken: str | None = None  # why the store refuses requests until reopened
        self._sections = (_Section(self, exclusive=False), _Section(self, exclusive=True))
        try:
            self._db = apsw.Connection(str(self.path / "kv.sqlite3"))
        except apsw.Error as e:
            raise KvUnavailable(f"cannot open the file store at {self.path}: {e}") from e
        try:
            self._store_id = self._open_base()
            self._log = LogFile(self.path / "kv.log", flush_delay_ms / 1000)
        except OSError as e:
            self._db.close()
            raise KvUnavailable(f"cannot open the log of the file store at {self.path}: {e}") from e
        except BaseException:
            self._db.close()
            raise
        try:
            self._open_log()
        except BaseException:
            self.close()
            raise

    def _open_base(self) -> bytes:
        """Check the base and upgrade its schema; return the store's identity.

        Before the log is opened, so that an upgrade can tell that no other process has the
        log open (one that has is an older pagekv, or a copy or backup tool in the middle of
        reading it): this process's own open of the log would look like one.
        """
        try:
            self._db.set_busy_timeout(min(int(self.lock_timeout * 1000), 2**31 - 1))
            # One statement per execute: APSW runs a multi-statement string lazily, so a second
            # pragma after one that returns a row (journal_mode does) would never run. A rollback
            # journal, not WAL: only folds write the base, always under the log's exclusive lock,
            # so WAL's concurrent readers buy nothing, and a fold writes its pages once instead of
            # to the WAL and again at the checkpoint (measured: half the fold time). A store
            # another process holds open in WAL mode (pagekv before the log) stays in WAL until
            # every process has closed it; both modes are durable with synchronous=FULL.
            if self._db.execute("PRAGMA page_count").get == 0:
                # A new base: pages that hold a 4 KiB value in the leaf. The VFS stores 4.1 KB
                # values; with 32 KiB pages a fold of them took 9 µs per entry instead of 21,
                # and a random 128-key read of them 1.65 ms instead of 2.45 (100 B values: fold
                # 2.4 vs 3.0 µs, read 0.93 vs 0.79 ms). Existing bases keep their page size.
                self._db.execute(f"PRAGMA page_size={_BASE_PAGE_SIZE}")
            mode = str(self._db.execute("PRAGMA journal_mode=TRUNCATE").get).lower()
            self._db.execute("PRAGMA synchronous=FULL")
            synchronous = self._db.execute("PRAGMA synchronous").get
            if mode not in ("truncate", "wal") or synchronous != 2:
                raise apsw.Error(
                    f"journal_mode={mode}, synchronous={synchronous}; need truncate, 2"
                )
            # Written only when the schema is older, so a store on a full disk still opens.
            if self._db.execute("PRAGMA user_version").get != _SCHEMA_VERSION:
                with self._transaction() as db:
                    self._upgrade(db, db.execute("PRAGMA user_version").get)
            store_id: bytes = self._db.execute("SELECT id FROM store").get
            return store_id
        except apsw.Error as e:
            raise KvUnavailable(
                f"cannot open the file store at {self.path}: {_describe(e, self.path)}"
            ) from e

    def _upgrade(self, db: apsw.Connection, version: int) -> None:
        """Bring the base from schema `version` to this build's, inside a base transaction.

        The version fences older builds: one that reads a newer version refuses the store at
        open. One that has the store open already does not look again, and would misread the
        new log, so the upgrade of a store that had a log (schema 2 on) waits until no other
        process has it open. The log itself is upgraded at the first exclusive section (this
        open's): an epoch of an older log format is folded, and the next is of this build's.
        """
        if version == _SCHEMA_VERSION:
            return  # another process upgraded it first
        if version > _SCHEMA_VERSION:
            raise FormatTooNew(self.path / "kv.sqlite3", "schema", str(version), _SCHEMA_VERSION)
        if version >= 2:
            holders = processes_holding([self.path / "kv.log", self.path / "kv.shm"])
            if holders:
                raise KvUnavailable(
                    f"cannot upgrade the file store at {self.path} from schema version {version} "
                    f"to {_SCHEMA_VERSION} while other processes have it open: "
                    f"{', '.join(holders)}; stop them first (an older pagekv would misread what "
                    "this one writes); nothing was changed"
                )
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    def _open_log(self) -> None:
        """Check `kv.shm` and replay the log, so damage shows at open. Nothing is written unless
        `kv.shm` must be rebuilt: an older log format is folded at the first write."""
        with self._section(exclusive=False):
            # What the log holds now is durable, whatever `kv.shm` says (it may come from a copy
            # of the directory, or from before a reboot).
            self._flush_under_lock()
            self._log.reset_marks(self._log_pos)

    @property
    def log_used(self) -> int:
        """Bytes of `kv.log` in use as of this process's last look: where the next record goes.
        The log is folded into the base when a record would take it past `log_bytes`."""
        return self._offset

    def flush_counts(self) -> FlushCounts:
        """Writes made durable, log flushes and folds by this process since it opened the
        store. Group commit shows as fewer flushes than writes."""
        return FlushCounts(self._writes, self._log.flushes, self._folds)

    def _section(self, *, exclusive: bool) -> _Section:
        return self._sections[exclusive]

    def _transaction(self) -> _Transaction:
        return _Transaction(self)

    # -- catching up with the log ------------------------------------------------------------

    def _catch_up(self) -> None:
        """Apply the records appended since this process last looked; follow a new epoch.

        Looks at `kv.shm`'s change counter and at the log header's stamp: the counter alone
        would miss the records of processes that share another `kv.shm` (this one was deleted
        or replaced), but those wrote a header naming theirs before anything else.
        """
        log = self._log
        if not log.shm_intact():
            self._adopt_shm()
        ident, changes, stamp = log.shm_ident, log.changes(), log.header_stamp()
        if changes != self._changes or stamp != self._stamp:
            self._follow()
            if log.shm_ident == ident:
                self._changes, self._stamp = changes, stamp
            else:
                self._changes = None

    def _follow(self) -> None:
        try:
            self._follow_log()
        except BaseException:
            self._header_bytes = None  # whatever was applied, the next look starts over
            raise

    def _follow_log(self) -> None:
        log = self._log
        trusted = self._header_bytes is not None  # the pending state matches `_header`
        if trusted and self._live:
            self._replay_records()
        raw = log.header_bytes()
        # A sealed epoch may have been folded since without a header write: look at the base.
        sealed = self._live and self._header is not None and self._header.sealed
        if trusted and raw == self._header_bytes and not sealed:
            return
        old, slots = self._header, log.decode_header(raw)
        header = slots.header
        if header is not None and header.format >= 3:
            if header.store != self._store_id:
                raise StoreDamaged(
                    log.path,
                    f"the log belongs to another store ({header.store.hex()}), not to the "
                    f"one in {self.path.name}/kv.sqlite3 ({self._store_id.hex()})",
                )
            if header.shm != log.shm_ident:
                self._adopt_shm()
                if header.shm != log.shm_ident:  # the one it names is gone: name the new one
                    if not self._exclusive_held:
                        raise _NeedsExclusive()
                    header = replace(header, hseq=header.hseq + 1, shm=log.shm_ident)
                    self._write_header(header)
                    raw = self._log.header_bytes()
        self._header_bytes, self._header = raw, header
        folded = self._folded_epoch()
        if slots.damaged:
            self._check_fallback(header, folded)
        if header is not None and header.epoch > folded:
            if trusted and self._live and old is not None and header.salt == old.salt:
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
        self._pending.clear()
        self._created.clear()
        self._offset, self._seq = DATA_START, 0
        self._live = header is not None and header.epoch > folded
        if header is None:
            return
        self._chain = log.salt_seed(header.salt)
        if self._live:
            self._replay_records()
            if header.sealed:
                self._sealed_is_durable(header)
        else:  # folded, so its seal was flushed before the base changed: all of it is durable
            self._raise_log_pos(_position(header.epoch, _EPOCH_END))
            self._mark_durable(self._log_pos)

    def _replay_records(self) -> None:
        """Apply the live epoch's records past the ones applied already."""
        log, header = self._log, self._header
        assert header is not None
        fmt = header.format
        while (found := log.read_record(self._offset, self._chain, self._seq + 1, fmt)) is not None:
            body, crc = found
            self._replay(body, fmt)
            if header.chained:
                self._chain = crc
        self._raise_log_pos(_position(header.epoch, self._seq))

    def _check_fallback(self, header: LogHeader | None, folded: int) -> None:
        """With a header slot that does not check out, the other one is the header only if
        nothing shows that the bad one was newer and its epoch has records.

        A torn header write is the one way a crash leaves a bad slot, and it happens before any
        record of the epoch it starts; every new epoch clears the first record's sector before
        its header (`_start_epoch`). So if the good slot's epoch is folded (a newer header must
        have followed it), the first sector must be empty or a record of that folded epoch; a
        record of anything else means the newer header was damaged after records were written
        under it, and they cannot be read without its salt. Neither slot good: only an empty
        log (a torn first header) can be read, as no log.
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

    def _adopt_shm(self) -> None:
        """Share the `kv.shm` at the path, made this store's: at open, and when the one mapped
        was overwritten or the log header names another.

        The change counter, the durable mark and the flusher lock are only shared if every
        process maps one file. A process that opens the store after `kv.shm` was deleted or
        replaced maps a new one, and names it in the log header before it appends; the others
        see the header change at their next operation and move to it here. A `kv.shm` that is
        new, of a pagekv before its format, of another store or overwritten is rebuilt, and its
        marks are set only after a flush. A rebuild needs the log's exclusive lock
        (`_NeedsExclusive`); a look does not.
        """
        log = self._log
        log.remap_shm()
        if log.shm_state(self._store_id) is not SlotState.VALID:
            if not self._exclusive_held:
                raise _NeedsExclusive()
            log.init_shm(self._store_id)
            self._flush_under_lock()
            log.reset_marks(self._log_pos)
        self._changes = None

    def _sealed_is_durable(self, header: LogHeader) -> None:
        """A sealed epoch takes no more records, and its folder flushed the log as it sealed it,
        unless it died before that flush: flush it once more, so its waiters can all return."""
        end = _position(header.epoch, _EPOCH_END)
        self._raise_log_pos(end)
        if self._durable_pos < end:
            self._flush_under_lock()
            self._mark_durable(end)

    def _flush_under_lock(self) -> None:
        """Flush the log from inside a section; a failure breaks the store (pages may be lost)."""
        try:
            self._log.sync()
        except OSError as e:
            self._broken = f"a flush of its log failed: {os_reason(e)}"
            raise KvUnavailable(
                f"flush of {self._log.path} failed: {os_reason(e)}; the store refuses requests "
                "until it is reopened"
            ) from e

    def _raise_log_pos(self, position: int) -> None:
        if position > self._log_pos:
            self._log_pos = position

    def _replay(self, body: bytes, fmt: int) -> None:
        try:
            record = decode(body)
        except ValueError as e:
            raise KvUnavailable(f"record {self._seq + 1} of {self._log.path}: {e}") from e
        if isinstance(record, Create):
            pending = self._add_created(record.ns, record.name)
        else:
            pending = self._pending_for(record.ns)
            pending.apply(record)
        self._offset += LogFile.record_size(body, fmt)
        self._seq += 1
        header = self._header
        assert header is not None
        pending.last = _position(header.epoch, self._seq)

    def _make_writable(self) -> None:
        """Ensure the header is live, unsealed and of this build's log format: finish an
        interrupted fold first, and fold an older log format's epoch before appending (the
        upgrade of the log; the base's schema version already fences older builds off)."""
        header = self._header
        if self._live and header is not None and not header.sealed and header.format == LOG_FORMAT:
            return
        if self._live:
            self._fold()
        self._start_epoch()

    # -- appending and folding ---------------------------------------------------------------

    def _append(
        self,
        ns: int,
        body: bytes,
        change: Callable[[_Pending], object],
        created: str | None = None,
    ) -> None:
        """Apply one record to namespace `ns` and write it; the section makes it durable before
        the operation returns (at once here if the writer is alone, else by a shared flush). The
        caller holds an exclusive section; `change` is what replaying `body` does to the
        namespace's pending state, and `created` the name of a namespace the record creates.

        The change is applied before the record is written, while the CPU is still warm
        (measured: the same Python runs about 3x slower right after a sync). That is safe because
        nothing can read the pending state before the write returns (the caller holds both
        locks), a failed write breaks the store, so the state is never read at all, and whoever
        reads it after the locks are released waits until the record is durable.
        """
        size = LogFile.record_size(body)
        if self._offset > DATA_START and self._offset + size > self.log_bytes:
            self._fold()
            self._start_epoch()
        header = self._header
        assert header is not None and self._live and not header.sealed
        offset, seq = self._offset, self._seq + 1
        self._grow(offset + size)
        pending = self._pending_for(ns) if created is None else self._add_created(ns, created)
        change(pending)
        self._offset, self._seq = offset + size, seq
        position = _position(header.epoch, seq)
        pending.last = position
        durable = (
            self._contended == 0
            and not self._lock_waited
            and time.monotonic() >= self._grouping_until
            and self._is_durable(position - 1)
        )
        try:
            self._changes = self._log.bump()
            self._chain = self._log.append(offset, self._chain, seq, body, durable)
        except OSError as e:
            self._broken = f"an append to its log failed: {os_reason(e)}"
            raise KvIndeterminate(
                f"append to {self._log.path} failed: {os_reason(e)}; the write may or may not "
                "have been applied, and the store refuses requests until it is reopened"
            ) from e
        self._raise_log_pos(position)
        self._log.raise_written(position)
        self._writes += 1
        if durable:
            self._mark_durable(position)
        else:
            self._owed = position

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
            self._flush_under_lock()
            self._mark_durable(self._log_pos)

    def _write_header(self, header: LogHeader, new_epoch: bool = False) -> None:
        self._grow(DATA_START + ALIGN)
        try:
            self._changes = self._log.bump()
            if new_epoch:
                self._log.clear_first_record()
            self._log.write_header(header)  # a flush: every record written so far is durable
        except OSError as e:
            self._broken = f"a header write to its log failed: {os_reason(e)}"
            raise KvUnavailable(
                f"header write to {self._log.path} failed: {os_reason(e)}; the request was not "
                "applied, and the store refuses requests until it is reopened"
            ) from e
        self._header = header
        self._header_bytes = self._log.header_bytes()
        self._stamp = self._log.header_stamp()
        self._mark_durable(self._log_pos)

    def _fold(self) -> None:
        """Seal the epoch, then apply its pending state to the base and mark the epoch folded."""
        header = self._header
        assert header is not None
        if not header.sealed:
            self._write_header(replace(header, hseq=header.hseq + 1, sealed=True))
        try:
            # Counted before the base changes: a process holding this epoch's pending state
            # must drop it once the base holds the epoch (`_follow_log`), even if this one dies
            # before the next epoch's header, the only other write that would tell it.
            self._changes = self._log.bump()
            with self._transaction() as db:
                if db.execute("SELECT epoch FROM log_state").get >= header.epoch:
                    return  # folded by a process that died before starting the next epoch
                for ns, pending in self._pending.items():
                    self._resolve(ns, pending)  # old sizes from the base before the fold
                for ns, pending in self._pending.items():
                    for start, end in pending.hidden:
                        if end is None:
                            db.execute("DELETE FROM entries WHERE ns = ? AND key >= ?", (ns, start))
                        else:
                            db.execute(
                                "DELETE FROM entries WHERE ns = ? AND key >= ? AND key < ?",
                                (ns, start, end),
                            )
                    items = pending.entries.items()
                    db.executemany(
                        "DELETE FROM entries WHERE ns = ? AND key = ?",
                        [(ns, k) for k, v in items if v is None],
                    )
                    _upsert_all(db, [(ns, k, v) for k, v in items if v is not None])
                    if pending.created is None:
                        db.execute(
                            "UPDATE namespaces SET generation = ?, used = ? WHERE id = ?",
                            (pending.generation, pending.used, ns),
                        )
                    else:
                        db.execute(
                            "INSERT INTO namespaces(id, name, generation, used) VALUES (?,?,?,?)",
                            (ns, pending.created, pending.generation, pending.used),
                        )
                db.execute("UPDATE log_state SET epoch = ?", (header.epoch,))
            self._folds += 1
        except KvIndeterminate as e:
            self._changes = self._header_bytes = None  # the base may hold the epoch: re-read
            # Whether it committed or not, the next look finds out and goes on from there; the
            # request that needed the fold has not been written.
            raise KvUnavailable(f"{e}; the fold is retried, and the request was not applied") from e
        except BaseException:
            self._changes = self._header_bytes = None
            raise

    def _start_epoch(self) -> None:
        """Start the epoch after the folded one, in the same file, under a new salt."""
        previous = self._header
        hseq = previous.hseq + 1 if previous is not None else 1
        epoch = self._folded_epoch() + 1
        salt = os.urandom(8)
        shm = self._log.shm_ident
        header = LogHeader(hseq, epoch, salt, False, LOG_FORMAT, self._store_id, shm)
        self._write_header(header, new_epoch=True)
        self._pending.clear()
        self._created.clear()
        self._live, self._offset, self._seq = True, DATA_START, 0
        self._chain = self._log.salt_seed(salt)
        self._raise_log_pos(_position(epoch, 0))
        self._log.raise_written(self._log_pos)
        self._mark_durable(self._log_pos)

    # -- the base ----------------------------------------------------------------------------

    def _base(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, args).fetchall()
        except apsw.Error as e:
            raise KvUnavailable(f"file store {self.path} is busy or unreadable: {e}") from e

    def _range(
        self,
        ns: int,
        column: str,
        start: bytes | None,
        end: bytes | None,
        reverse: bool,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, Any]]:
        """`(key, column)` of the base's rows in `[start, end)` in key order, read lazily; the
        caller holds a section."""
        where = "ns = ?"
        args: list[int | bytes] = [ns]
        if start is not None:
            where += " AND key >= ?"
            args.append(start)
        if end is not None:
            where += " AND key < ?"
            args.append(end)
        order = "DESC" if reverse else "ASC"
        sql = f"SELECT key, {column} FROM entries WHERE {where} ORDER BY key {order} LIMIT ?"
        try:
            yield from self._db.execute(sql, (*args, -1 if limit is None else limit))
        except apsw.Error as e:
            raise KvUnavailable(f"file store {self.path} is busy or unreadable: {e}") from e

    def _folded_epoch(self) -> int:
        return self._base("SELECT epoch FROM log_state")[0][0]

    def _base_head(self, ns: int) -> tuple[int, int]:
        rows = self._base("SELECT generation, used FROM namespaces WHERE id = ?", (ns,))
        if not rows:
            raise KvUnavailable(f"namespace {ns} vanished from {self.path}")
        return rows[0]

    def _base_values(self, ns: int, keys: list[bytes], column: str) -> dict[bytes, Any]:
        found: dict[bytes, Any] = {}
        for i in range(0, len(keys), _KEYS_PER_QUERY):
            part = keys[i : i + _KEYS_PER_QUERY]
            marks = ",".join("?" * len(part))
            sql = f"SELECT key, {column} FROM entries WHERE ns = ? AND key IN ({marks})"
            found.update(self._base(sql, (ns, *part)))
        return found

    def _pending_for(self, ns: int) -> _Pending:
        pending = self._pending.get(ns)
        if pending is None:
            pending = self._pending[ns] = _Pending(*self._base_head(ns))
        return pending

    def _add_created(self, ns: int, name: str) -> _Pending:
        pending = self._pending[ns] = _Pending(0, 0, created=name)
        self._created[name] = ns
        return pending

    def _saw(self, pending: _Pending | None) -> None:
        """The current section read `pending`: it returns only once what it saw is durable."""
        if pending is not None and pending.last > self._owed:
            self._owed = pending.last

    # -- durability --------------------------------------------------------------------------

    def _is_durable(self, position: int) -> bool:
        """Whether the log is known durable up to `position` (by this process or, through the
        shared mark, another). Also called under `_lock` alone: an update of `_durable_pos`
        racing `_mark_durable` can only lower it, which costs a flush, never a lost write."""
        if position <= self._durable_pos:
            return True
        if self._broken is not None:  # closed, maybe: only what this process saw flushed
            return False
        mark = self._log.durable_mark()
        if position <= mark:
            self._durable_pos = max(self._durable_pos, mark)
            return True
        return False

    def _mark_durable(self, position: int) -> None:
        with self._durable:
            if position > self._durable_pos:
                self._durable_pos = position
            self._log.raise_mark(position)
            self._durable.notify_all()

    def _await_durable(self, position: int) -> None:
        """Return once the log is durable up to `position`, flushing it if no other thread is.

        One waiting thread per process flushes (`_flush_for_all`) while the others wait on
        `_durable`; it holds no lock while it flushes, so writers go on appending meanwhile, and
        the next flush covers all of them at once: that is the group commit. A failed flush
        breaks the store; every waiter then learns that its write may be lost.
        """
        durable = self._durable
        with durable:
            self._gathered.notify()
            while not self._is_durable(position):
                if self._broken is not None:
                    raise KvIndeterminate(
                        f"the file store {self.path} broke before this write was durable "
                        f"({self._broken}); it may or may not have been applied"
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
        want, log, writes = self._log_pos, self._log, self._writes
        self._covered, self._flushed_writes = writes - self._flushed_writes, writes
        before = target = 0
        patience = max(_MIN_FLUSHER_WAIT_S, _FLUSHER_PATIENCE * self._flush_s)
        patience = min(patience, self.lock_timeout)
        self._durable.release()
        try:
            locked, delay = log.try_lock_flusher(), _FIRST_POLL
            while locked < 0 and not self._is_durable(want) and log.flusher_held_s() < patience:
                time.sleep(delay)
                delay = min(2 * delay, _MAX_POLL)
                locked = log.try_lock_flusher()
            try:
                if self._is_durable(want):
                    return
                before = max(self._durable_pos, log.durable_mark())
                started, end = time.monotonic(), max(want, log.written_mark())
                try:
                    log.sync()
                except OSError as e:
                    self._broken = f"a flush of its log failed: {os_reason(e)}"
                    return
                self._flush_s += (time.monotonic() - started - self._flush_s) / 4
                log.raise_mark(end)
                target = end
            finally:
                if locked >= 0:
                    log.unlock_flusher(locked)
        finally:
            self._durable.acquire()
        if target - before > 1:  # several records, from this process or others
            self._grouping_until = time.monotonic() + _GROUPING_S
        if self._broken is None and target > self._durable_pos:
            self._durable_pos = target

    def _gather(self) -> None:
        """Under `_durable`: wait until as many writes of this process have come since the
        latest flush as it covered, or half a flush's time, whichever is first (nothing if it
        covered one)."""
        if self._covered < 2:
            return
        deadline = time.monotonic() + self._flush_s / 2
        while self._writes - self._flushed_writes < self._covered:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._gathered.wait(left)

    def _resolve(self, ns: int, pending: _Pending) -> None:
        """Look up the base sizes still owed, making `pending.used` exact."""
        if pending.unresolved:
            sizes = self._base_values(ns, pending.unresolved, _SIZE)
            pending.used -= sum(sizes.values())
            pending.unresolved.clear()

    # -- the store ---------------------------------------------------------------------------

    def namespace(self, actor_id: object) -> FileNamespace:
        """The namespace named `actor_id`; a new one is created with one record in the log."""
        name = check_name(self.limits, actor_id)
        with self._section(exclusive=False):
            ns_id = self._find(name)
        if ns_id is None:
            with self._section(exclusive=True):
                ns_id = self._find(name)
                if ns_id is None:
                    rows = self._base("SELECT coalesce(max(id), 0) FROM namespaces")
                    ns_id = max(rows[0][0], *self._created.values(), 0) + 1
                    self._append(ns_id, encode_create(ns_id, name), _unchanged, created=name)
        return FileNamespace(name, self, ns_id)

    def _find(self, name: str) -> int | None:
        """The id of namespace `name`, or None; the caller holds a section."""
        ns_id = self._created.get(name)
        if ns_id is not None:
            self._saw(self._pending.get(ns_id))
            return ns_id
        rows = self._base("SELECT id FROM namespaces WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def actor_ids(self) -> list[str]:
        with self._section(exclusive=False):
            names = [r[0] for r in self._base("SELECT name FROM namespaces ORDER BY name")]
            if not self._created:
                return names
            for ns_id in self._created.values():
                self._saw(self._pending.get(ns_id))
            return sorted([*names, *self._created])

    def close(self) -> None:
        """Idempotent; also releases what a failed open had opened."""
        with self._lock:
            with self._durable:  # a flush in flight must not sync a reused descriptor
                while self._flushing:
                    self._durable.wait()
                if self._broken is None and self._log_pos > self._durable_pos:
                    try:
                        self._log.sync()  # what waiters wrote is theirs to keep
                        self._durable_pos = self._log_pos
                    except OSError as e:
                        self._broken = f"a flush of its log failed: {os_reason(e)}"
                self._broken = self._broken or "it was closed"
                self._durable.notify_all()
            self._db.close()
            self._log.close()

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(error: apsw.Error, directory: Path) -> str:
    """SQLite's error, and who holds the base's lock when it waited for it in vain."""
    if isinstance(error, apsw.BusyError):
        holders = lock_holders(directory / "kv.sqlite3")
        return f"{error}; waited for the lock on kv.sqlite3, held by {holders}"
    return str(error)


def _upsert_all(db: apsw.Connection, rows: list[tuple[int, bytes, bytes]]) -> None:
    """Write `rows` (`ns, key, value`; keys distinct) into the base, `_UPSERT_ROWS` a statement."""
    whole = len(rows) - len(rows) % _UPSERT_ROWS
    db.executemany(
        _UPSERT_MANY,
        [
            tuple(itertools.chain.from_iterable(rows[i : i + _UPSERT_ROWS]))
            for i in range(0, whole, _UPSERT_ROWS)
        ],
    )
    db.executemany(_UPSERT_ONE, rows[whole:])


class _Section:
    """`with store._section(exclusive=...):` — every operation's locks and catch-up.

    A class, not a generator, as it runs on every request; the store keeps one of each kind (they
    hold no state of their own). An exclusive section also makes the log writable (finishing an
    interrupted fold), so the block may append.
    """

    __slots__ = ("_exclusive", "_store")

    def __init__(self, store: FileStore, *, exclusive: bool) -> None:
        self._store = store
        self._exclusive = exclusive

    def __enter__(self) -> FileStore:
        store = self._store
        timeout = store.lock_timeout
        if not store._lock.acquire(False):
            started = time.monotonic()
            with store._durable:  # `+=` is not atomic between threads of interpreted code
                store._contended += 1  # tells the holder to leave its flush to a group
            try:
                acquired = store._lock.acquire(True, timeout)
            finally:
                with store._durable:
                    store._contended -= 1
            if not acquired:
                raise KvUnavailable(
                    f"waited {timeout:g} s for another thread of this process to finish with "
                    f"the file store {store.path}; nothing was done"
                )
            timeout = max(0.0, timeout - (time.monotonic() - started))
        try:
            if store._broken is not None:
                raise KvUnavailable(
                    f"the file store {store.path} refuses requests ({store._broken}); reopen it"
                )
            try:
                store._lock_waited = store._log.lock(self._exclusive, timeout)
                store._exclusive_held = self._exclusive
            except TimeoutError as e:
                raise KvUnavailable(
                    f"the file store {store.path} is locked: {e.strerror}; nothing was done"
                ) from e
            except OSError as e:
                raise KvUnavailable(f"cannot lock {store._log.path}: {os_reason(e)}") from e
            try:
                try:
                    store._catch_up()
                except _NeedsExclusive:
                    store._log.lock(True, timeout)
                    store._exclusive_held = True
                    store._catch_up()
                    if not self._exclusive:
                        store._log.lock(False, timeout)
                        store._exclusive_held = False
                if self._exclusive:
                    store._make_writable()
            except OSError as e:
                store._log.unlock()
                raise KvUnavailable(f"cannot read {store._log.path}: {e}") from e
            except BaseException:
                store._log.unlock()
                raise
        except BaseException:
            store._lock.release()
            raise
        return store

    def __exit__(self, *exc: object) -> None:
        """Let go of the locks, then wait until what the block wrote or saw is durable."""
        store = self._store
        owed, store._owed = store._owed, 0
        try:
            store._log.unlock()
        finally:
            store._lock.release()
        if owed > store._durable_pos:
            store._await_durable(owed)


class _Transaction:
    """`with store._transaction() as db:` — one write transaction on the base.

    `BEGIN IMMEDIATE` takes SQLite's write lock, which excludes other processes. An exception in
    the block rolls back; a failed COMMIT that left no transaction open may have been applied and
    is reported as indeterminate.
    """

    __slots__ = ("_db", "_path")

    def __init__(self, store: FileStore) -> None:
        self._db = store._db
        self._path = store.path

    def __enter__(self) -> apsw.Connection:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except apsw.Error as e:
            raise KvUnavailable(
                f"file store {self._path} is busy or unreadable: {_describe(e, self._path)}"
            ) from e
        return self._db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        db = self._db
        if exc_type is not None:
            if db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL)
                db.execute("ROLLBACK")
            if isinstance(exc, apsw.Error):
                raise KvUnavailable(f"file store {self._path} failed: {exc}") from exc
            return
        try:
            db.execute("COMMIT")
        except apsw.Error as e:
            if not db.in_transaction:
                raise KvIndeterminate(f"commit to {self._path} failed: {e}") from e
            db.execute("ROLLBACK")
            raise KvUnavailable(f"commit to {self._path} failed: {e}") from e


class FileNamespace(KvNamespace):
    def __init__(self, actor_id: str, store: FileStore, ns_id: int) -> None:
        super().__init__(actor_id, store.limits)
        self._store = store
        self._id = ns_id

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        store, ns = self._store, self._id
        with store._section(exclusive=False):
            pending = store._pending.get(ns)
            if pending is None:
                found = store._base_values(ns, keys, "value")
            else:
                store._saw(pending)
                found = {k: pending.entries[k] for k in keys if k in pending.entries}
                missing = [k for k in keys if not pending.shadows(k)]
                if missing:
                    found.update(store._base_values(ns, missing, "value"))
            return [found.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        store, ns = self._store, self._id
        with store._section(exclusive=False):
            pending = store._pending.get(ns)
            if pending is None:
                return list(store._range(ns, "value", start, end, reverse, limit))
            store._saw(pending)
            base = _unshadowed(
                _visible_base(store, ns, pending, "value", start, end, reverse), pending
            )
            merged = heapq.merge(
                base, _pending_items(pending, start, end, reverse), reverse=reverse
            )
            return list(itertools.islice(merged, limit))

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        store, ns = self._store, self._id
        with store._section(exclusive=True):
            pending = store._pending_for(ns)
            store._saw(pending)
            check_fence(fence, pending.generation)
            if not batch.puts and not batch.deletes:
                return
            puts, deletes = batch.puts, batch.deletes
            limit = store.limits.max_storage_bytes
            # The batch's bytes bound its growth, so the exact check is rarely needed.
            if pending.used + batch.payload > limit:
                growth, unknown = pending.growth(batch)
                if growth > 0 and pending.used + growth > limit:
                    store._resolve(ns, pending)
                    owed = store._base_values(ns, unknown, _SIZE)
                    check_quota(store.limits, pending.used, growth - sum(owed.values()))
            store._append(
                ns, encode_write(ns, puts, deletes), lambda p: p.write(puts.items(), deletes)
            )

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        store, ns = self._store, self._id
        with store._section(exclusive=True):
            pending = store._pending_for(ns)
            store._saw(pending)
            check_fence(fence, pending.generation)
            if start >= end:
                return
            entries = pending.entries
            sizes = [
                len(k) + len(v)
                for k in pending.keys_in(start, end)
                if (v := entries[k]) is not None
            ]
            rows = _visible_base(store, ns, pending, _SIZE, start, end, reverse=False)
            sizes += [size for key, size in rows if key not in pending.entries]
            if sizes:
                refund = sum(sizes)
                body = encode_range(ns, start, end, refund)
                store._append(ns, body, lambda p: p.delete_range(start, end, refund))

    def takeover(self) -> int:
        store, ns = self._store, self._id
        with store._section(exclusive=True):
            pending = store._pending_for(ns)
            store._saw(pending)
            generation = pending.generation + 1
            store._append(ns, encode_takeover(ns, generation), lambda p: p.take_over(generation))
            return generation

    def generation(self) -> int:
        store = self._store
        with store._section(exclusive=False):
            pending = store._pending.get(self._id)
            if pending is None:
                return store._base_head(self._id)[0]
            store._saw(pending)
            return pending.generation

    def used_bytes(self) -> int:
        store = self._store
        with store._section(exclusive=False):
            pending = store._pending.get(self._id)
            if pending is None:
                return store._base_head(self._id)[1]
            store._saw(pending)
            store._resolve(self._id, pending)
            return pending.used

    def _drop(self, fence: int | None) -> None:
        store, ns = self._store, self._id
        with store._section(exclusive=True):
            pending = store._pending_for(ns)
            store._saw(pending)
            check_fence(fence, pending.generation)
            store._resolve(ns, pending)
            if pending.used:
                used = pending.used
                body = encode_range(ns, b"", None, used)
                store._append(ns, body, lambda p: p.delete_range(b"", None, used))


def _position(epoch: int, seq: int) -> int:
    """Where record `seq` of `epoch` sits in the log's history: positions only grow."""
    return epoch << 32 | seq


def _unchanged(pending: _Pending) -> None:
    """The pending-state change of a record that only creates its namespace."""


def _pending_items(
    pending: _Pending, start: bytes | None, end: bytes | None, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    """The pending namespace's live entries in `[start, end)`, in key order."""
    keys = pending.keys_in(start, end)
    for key in reversed(keys) if reverse else keys:
        value = pending.entries[key]
        if value is not None:
            yield key, value


def _unshadowed(
    rows: Iterator[tuple[bytes, Any]], pending: _Pending
) -> Iterator[tuple[bytes, Any]]:
    """The base `rows` whose keys the pending state does not hold, read lazily.

    A generator function, not a generator expression: mypyc compiles a generator expression
    as a list comprehension, which would read the whole rest of the range for `list(limit=1)`.
    """
    entries = pending.entries
    for row in rows:
        if row[0] not in entries:
            yield row


def _visible_base(
    store: FileStore,
    ns: int,
    pending: _Pending,
    column: str,
    start: bytes | None,
    end: bytes | None,
    reverse: bool,
) -> Iterator[tuple[bytes, Any]]:
    """The base's rows in `[start, end)` outside the pending state's hidden ranges, in key order.

    Reads only between the hidden ranges, so a range delete or drop of many keys costs nothing
    to later reads of the same epoch. Past `_MAX_GAPS` gaps (many small range deletes, such as
    one per actor in the registry's index) one query per gap costs more than reading the hidden
    rows too, so the span is read at once and the hidden rows are skipped.
    """
    hidden = pending.hidden
    gaps = hidden.gaps(start, end)
    if len(gaps) > _MAX_GAPS:
        for row in store._range(ns, column, start, end, reverse):
            if row[0] not in hidden:
                yield row
        return
    for low, high in reversed(gaps) if reverse else gaps:
        if low is None or high is None or low < high:
            yield from store._range(ns, column, low, high, reverse)
