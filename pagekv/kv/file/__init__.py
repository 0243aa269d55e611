"""The embedded durable backend: a log of our own in front of one SQLite file, in a directory.

Why this engine (measured; `benchmarks/HISTORY.md`, "The current `file://` engine"): a durable
write must be fsynced before it returns. Native SQLite WAL+FULL pays one fsync plus a B-tree
update and a 4 KiB WAL frame per commit, LMDB two fsyncs, and our earlier store (SQLite
underneath) all of native's work plus the fence, the quota and Python around them. Writing each
batch as one record appended to a preallocated log (`log.py`) pays one durable write and no
B-tree work, which is what lets a one-entry write keep up with a native one-row commit. The B-tree
work is done in bulk instead: when the log is full, its changes are **folded** into `kv.sqlite3`
(rollback journal, `synchronous=FULL`) in one transaction, so reads stay indexed, memory stays
bounded by the log's size, and opening a store replays at most one log.

Files: `kv.log` (records of the current epoch; bodies in `log_records.py`) and `kv.sqlite3` with
`namespaces(id, name, generation, used)`, `entries(ns, key, value)` and `log_state(epoch)`, the
last epoch folded into the base. `docs/FORMAT.md` describes both.

How an operation runs: under the store's thread lock and a `flock` on `kv.log` (shared to read,
exclusive to write, so processes sharing the directory are serialised), it first catches up with
records other processes appended, then works on the **pending** state: each namespace's changes
of the current epoch, kept in memory over the base. A write checks the fence and the quota there,
applies its change and writes one record; if that write fails, the store refuses every request
until it is reopened (`Appender.append`). Creating a namespace is one such record too.

**Group commit.** A write alone (no other thread or process waited for the lock, every earlier
record durable) makes its record durable before it lets go of the locks: one `O_DSYNC` write, the
fastest way for one writer. Otherwise it writes its record to the page cache, lets go, and waits
for a flush that covers it (`GroupCommit.await_durable`): one waiter per process, and one process
of the host at a time, flushes outside the locks while the others append, so concurrent writers of
any namespaces, in any of the processes sharing the directory, share one `fdatasync`. Records are
chained by their CRCs (`log.py`), so one stranded after a hole can never rejoin the log. An
operation that saw a record not yet durable (a read of its namespace, a fence it failed) waits for
it too, so nothing returns what a crash could undo.

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
  records must never follow a hole. (A short write is one: `log.write_all`.)
- An operation returns only once every record it wrote or saw is durable. Records are made
  durable in log order (a record is written with `O_DSYNC` only when all before it are durable,
  and a flush covers all written before it), so a crash loses a suffix of unacknowledged records.
- Every wait for the log's `flock` or the base's lock ends within `lock_timeout`.

The package, one part a module:

- `store.py`: `FileStore`, the public face: opens the parts, hands out namespaces, closes.
- `file_namespace.py`: `FileNamespace`, one namespace's reads and writes.
- `sections.py`: `Sections`, the locks every operation runs under, the catch-up on entry and the
  wait for durability on exit; the package-internal face the namespaces work through.
- `catch_up.py`: `LogFollower`, applying what other processes appended; following a new epoch.
- `append.py`: `Appender`, writing records and headers, and folding the log into the base.
- `group_commit.py`: `GroupCommit`, durable positions, shared flushes, the flusher lock.
- `epoch.py`: `Epoch`, this process's view of the live epoch and its pending state.
- `pending.py`: `Pending`, one namespace's changes in the epoch, over the base.
- `base.py`: `Base`, `kv.sqlite3`: schema, reads, and the fold's transaction.
- `log.py`: `LogFile`, `kv.log`: its lock, headers, records and flushes.
- `shm.py`: `ShmFile`, `kv.shm`: the change counter, the durable marks, the flusher lock.
- `lock_holders.py`: who holds a lock on or has open the store's files, from `/proc`.
- `log_records.py`: the bodies of the log's records.
"""

from pagekv.kv.file.file_namespace import FileNamespace
from pagekv.kv.file.store import DEFAULT_LOCK_TIMEOUT, DEFAULT_LOG_BYTES, FileStore

__all__ = ["DEFAULT_LOCK_TIMEOUT", "DEFAULT_LOG_BYTES", "FileNamespace", "FileStore"]
