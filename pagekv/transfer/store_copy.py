"""`copy_store`: every namespace of one store (each actor's data) and the registry's index
into another store, e.g. from the embedded `file:` store to PostgreSQL.

**What is copied.** Each namespace entry by entry (its database's pages, deltas, head and
hints, and its `ctx.kv` entries), read `batches.READ_ROWS` entries a `list` and written in
batches the destination's limits accept, fenced by a takeover of the destination namespace.
Chunks and base pages carry the generation of the writer that wrote them, and a reader refuses
one later than its own, so they are stamped with the destination's generation on the way
(`restamp`: no CRC covers it). The registry's index is not copied entry by entry either: its
keys name the generations of the source. Each actor gets, at the destination, its record (with
its creation time) and a lease entry with no owner that keeps the source's wake time
(`enroll.enroll`), under the generation its data was written with; the member entries of
the source's registries are not copied.

**Consistency.** A namespace of up to 64 MiB is read in one `list`, which every backend answers from
one state (`frozen_namespace.py`): its database and `ctx.kv` entries as they were at one instant. A
bigger one is read in several, so it is copied whole only if it did not change meanwhile: its
fingerprint is read before and after (its generation, which a wake changes; its head record, which
every commit and compaction rewrites; and a digest of its entries outside the database, its `ctx.kv`
entries, which an awake actor writes without either), and it is copied again when they differ, three
times at most (`RAW_ATTEMPTS`). One that keeps changing is then read in one `list` after all if it
stores up to `FROZEN_MAX_BYTES` (one such namespace in memory at a time, beside the `THREADS`
smaller ones), and beyond that copied from a read-only snapshot through SQLite (one committed state
of its database; its `ctx.kv` entries read after it). A writer rewriting pages in place can overtake
such a snapshot too (`SnapshotExpired`, after `SNAPSHOT_ATTEMPTS`): the copy then fails, naming the
namespace, and the next run copies it again. A source that is served is refused (a registry's live
member entry, `directory/leases.py`) unless `allow_live`: then the actors that changed after their
copy are reported (`CopyResult.changed`).

**Resuming.** The destination's registry namespace holds a marker of the copy and, per copied
namespace, a progress entry written in the same batch as the actor's record: the source's
fingerprint, a digest of the entries read and the checksum of the content copied. Run again
after an interruption (even SIGKILL), a copy skips every namespace whose source still has the
same fingerprint and, read again, the same entries (a fingerprint alone does not tell another
source's namespace of the same name from this one's), and copies the others again from
scratch (its progress entry deleted first, then the destination namespace taken over and
dropped: a run interrupted after the drop leaves no entry claiming a copy); the namespaces the
source does not have (any more) are emptied and their index entries removed
(`CopyResult.removed`). So a resume, even from another source, ends with a copy of the source
it ran from. The marker names the process that runs the copy: a second copy into the store
while that one runs (on this host) is refused. A destination that holds anything else is
refused: a copy goes into an empty store.

**Verifying.** At the end the checksum of the logical content of every destination namespace
(`checksum.py`: schema, rows, `ctx.kv` entries) is compared with the source's, taken when it
was copied; a mismatch is `CopyMismatch` (its progress entry is removed, so the next run copies
it again). A copy that verified and saw nothing change removes its marker and progress entries.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import cbor2

from pagekv.actor.directory.enroll import TOOL_REGISTRY, enroll, forget
from pagekv.actor.directory.leases import Ownership
from pagekv.actor.directory.records import REGISTRY_NAMESPACE, ActorRecord, list_actors, records_of
from pagekv.actor.errors import ActorError
from pagekv.actor.inspect_reads import ListableStore, read_namespace
from pagekv.kv import ActorKv, KvStore, prefix_end
from pagekv.transfer.checksum import (
    EntriesDigest,
    combine,
    database_digest,
    namespace_checksum,
    other_entries,
)
from pagekv.transfer.chunked_io import batches, scan
from pagekv.transfer.exporter import copy_pages
from pagekv.transfer.frozen_namespace import FROZEN_MAX_BYTES, FrozenNamespace, frozen_if_small
from pagekv.vfs import Database, SnapshotExpired, open_database
from pagekv.vfs.format import HEAD_KEY, restamp

COPY_MARKER: Final = b"copy-run"
"""Destination registry entry: a copy into this store is under way (or was interrupted)."""
COPY_PREFIX: Final = b"copy/"
"""Destination registry entries `copy/<namespace>`: that namespace is copied (see above)."""
RAW_ATTEMPTS: Final = 3
"""Copies of a changing namespace entry by entry before it is copied from a snapshot."""
FROZEN_COPY_BYTES: Final = 64 * 2**20
"""Namespaces up to this many stored bytes are read in one `list` (`frozen_namespace.py`): one
consistent state, whatever writes them meanwhile (`THREADS` of them in memory at most)."""
THREADS: Final = 4
"""Namespaces copied at once: a remote store's round trips overlap."""


class CopyRefused(ActorError, ValueError):
    """The copy cannot start as asked (the message says why); nothing was written."""


class CopyMismatch(ActorError):
    """Destination namespaces whose content differs from what was copied (`namespaces`)."""

    def __init__(self, namespaces: list[str]) -> None:
        self.namespaces = namespaces
        shown = ", ".join(namespaces[:10]) + (" ..." if len(namespaces) > 10 else "")
        super().__init__(
            f"{len(namespaces)} namespace(s) differ from the source after the copy: {shown}; "
            "copy again to copy them anew"
        )


@dataclass(frozen=True)
class CopyProgress:
    """Where a copy stands: `phase` "copy" or "verify", `done` of `total` namespaces."""

    phase: str
    done: int
    total: int
    skipped: int
    bytes: int
    elapsed: float


@dataclass(frozen=True)
class CopyResult:
    copied: int
    """Namespaces copied by this run."""
    skipped: int
    """Namespaces an earlier, interrupted run had copied and that had not changed since."""
    bytes: int
    """Bytes of keys and values written to the destination by this run."""
    verified: int
    changed: list[str]
    """Namespaces whose source changed after they were copied (a live source): the copy holds
    a committed state from before the change. Empty unless `allow_live`, or a registry started
    on the source during the copy."""
    snapshots: list[str]
    """Namespaces that kept changing entry by entry and were copied from one consistent read
    instead (one `list`, or a read-only snapshot above `FROZEN_MAX_BYTES`)."""
    removed: list[str]
    """Namespaces of the destination that the source does not have (a resumed copy: the source
    lost them since the interrupted run, or that run copied another source), now emptied."""
    seconds: float


Fingerprint = tuple[int, bytes | None, str]


@dataclass
class _Run:
    """One run's shared state: the stores, the progress entries found, counts for progress."""

    source: KvStore
    destination: KvStore
    src_index: ActorKv | None
    dst_index: ActorKv
    resumed: dict[str, dict[str, Any]]
    existing: set[str]
    progress: Callable[[CopyProgress], None] | None
    total: int
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    big: threading.Lock = field(default_factory=threading.Lock)
    """Held while a namespace over `FROZEN_COPY_BYTES` is read whole into memory."""
    done: int = 0
    skipped: int = 0
    bytes: int = 0
    snapshots: list[str] = field(default_factory=list)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    targets: dict[str, tuple[ActorKv, int]] = field(default_factory=dict)
    """The destination namespaces this run wrote, and the bytes written to each."""

    def report(self, phase: str, *, copied: int = 0, skipped: bool = False) -> None:
        with self.lock:
            self.done += 1
            self.bytes += copied
            self.skipped += skipped
            if self.progress is not None:
                elapsed = time.monotonic() - self.started
                self.progress(
                    CopyProgress(phase, self.done, self.total, self.skipped, self.bytes, elapsed)
                )


def copy_store(
    source: KvStore,
    destination: KvStore,
    *,
    allow_live: bool = False,
    threads: int = THREADS,
    progress: Callable[[CopyProgress], None] | None = None,
) -> CopyResult:
    """Copy every namespace of `source` and its registry's index into `destination` (see the
    module's docstring); `CopyRefused` before anything is written if it cannot start."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    started = time.monotonic()
    names, src_index = _check_source(source, allow_live)
    if not isinstance(destination, ListableStore):
        raise CopyRefused("the destination store cannot list its namespaces (no actor_ids())")
    dst_index, resumed = _open_destination(destination)
    run = _Run(
        source,
        destination,
        src_index,
        dst_index,
        resumed,
        set(destination.actor_ids()),  # type: ignore[attr-defined]
        progress,
        total=0,
    )
    todo = [n for n in names if n != REGISTRY_NAMESPACE]
    gone = run.existing - set(names) - {REGISTRY_NAMESPACE}
    removed = [n for n in sorted(gone) if _remove(run, n)]
    run.total = len(todo)
    _each(threads, todo, lambda name: _copy_one(run, name))
    copied, skipped, written = run.done - run.skipped, run.skipped, run.bytes
    run.done = run.skipped = run.bytes = 0
    changed: list[str] = []
    mismatched: list[str] = []
    _each(threads, sorted(run.entries), lambda name: _verify_one(run, name, changed, mismatched))
    if mismatched:
        dst_index.delete([COPY_PREFIX + n.encode() for n in mismatched])
        raise CopyMismatch(sorted(mismatched))
    if not changed:
        end = prefix_end(COPY_PREFIX)
        assert end is not None
        dst_index.delete_range(COPY_PREFIX, end)
        dst_index.delete([COPY_MARKER])
    return CopyResult(
        copied,
        skipped,
        written,
        len(run.entries),
        sorted(changed),
        sorted(run.snapshots),
        removed,
        time.monotonic() - started,
    )


def check_source(source: KvStore, *, allow_live: bool = False) -> None:
    """`CopyRefused` if `copy_store` would refuse `source` (read only): for a caller to ask
    before it opens, and so creates, the destination, which a refusal must leave as it was."""
    _check_source(source, allow_live)


def _check_source(source: KvStore, allow_live: bool) -> tuple[list[str], ActorKv | None]:
    """The source's namespaces and its registry namespace (None if it has none), or
    `CopyRefused`."""
    if not isinstance(source, ListableStore):
        raise CopyRefused("the source store cannot list its namespaces (no actor_ids())")
    names = source.actor_ids()
    src_index = source.namespace(REGISTRY_NAMESPACE) if REGISTRY_NAMESPACE in names else None
    if src_index is not None and not allow_live:
        _refuse_served(src_index, "source", "stop them first, or allow a live copy")
    return names, src_index


def _refuse_served(index: ActorKv, what: str, advice: str) -> None:
    """`CopyRefused` if a registry runs on the store of `index` (a live member entry)."""
    members = Ownership(index, TOOL_REGISTRY, None).members(time.time(), prune=False)
    if members:
        where = ", ".join(f"{m.address or 'in-process'} (pid {m.pid} on {m.host})" for m in members)
        raise CopyRefused(
            f"the {what} store is being served by {len(members)} registry(ies): {where}; {advice}"
        )


def _open_destination(destination: KvStore) -> tuple[ActorKv, dict[str, dict[str, Any]]]:
    """The destination's registry namespace, marked as the target of a copy, and the progress
    entries of an interrupted copy into it; refused if it is served or holds anything else."""
    names = destination.actor_ids()  # type: ignore[attr-defined]
    index = destination.namespace(REGISTRY_NAMESPACE)
    _refuse_served(index, "destination", "copy into a store nothing serves")
    marker = index.get([COPY_MARKER])[0]
    if marker is not None:
        _refuse_running(cbor2.loads(marker))
        entries = {
            key[len(COPY_PREFIX) :].decode(): cbor2.loads(value)
            for key, value in scan(index, COPY_PREFIX, prefix_end(COPY_PREFIX))
        }
    else:
        others = [n for n in names if n != REGISTRY_NAMESPACE]
        if others or list_actors(index, limit=1):
            raise CopyRefused(
                f"the destination store is not empty ({len(others)} namespace(s)"
                f"{', e.g. ' + others[0] if others else ''}); copy into an empty store"
            )
        entries = {}
    mine = {"started": time.time(), "pid": os.getpid(), "host": socket.gethostname()}
    index.put([(COPY_MARKER, cbor2.dumps(mine))])
    return index, entries


def _refuse_running(marker: dict[str, Any]) -> None:
    """`CopyRefused` if the copy that wrote `marker` still runs: two copies into one store
    take each other's namespaces over and leave index entries of both. Only a process of this
    host can be seen to run; a copy from another host that still runs is not detected."""
    pid, host = marker.get("pid"), marker.get("host")
    if host != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # it was interrupted: this copy resumes it
    except PermissionError:
        pass  # a process of another user's runs under that pid
    raise CopyRefused(
        f"another copy into this store is running (pid {pid} on {host}); let it finish, or "
        "stop it and copy again to resume it"
    )


def _each(threads: int, items: list[str], fn: Callable[[str], None]) -> None:
    """`fn(item)` for every item on `threads` threads; the first failure stops the items not
    yet begun and is raised, naming its item. So does a Ctrl-C (`KeyboardInterrupt`, raised in
    this thread while it waits): the items under way finish, the others are dropped (leaving
    the pool would otherwise wait for every item submitted, the whole phase)."""
    failed = threading.Event()

    def guarded(item: str) -> None:
        if failed.is_set():
            return
        try:
            fn(item)
        except BaseException as e:
            failed.set()
            e.add_note(f"while copying namespace {item!r}")
            raise

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pagekv-copy") as pool:
        try:
            for future in [pool.submit(guarded, item) for item in items]:
                future.result()
        except BaseException:
            failed.set()
            pool.shutdown(cancel_futures=True)
            raise


def _fingerprint(kv: ActorKv) -> Fingerprint:
    """What changes whenever the namespace does: its generation (a takeover), its head record
    (a commit, a compaction) and a digest of its entries outside the database (an awake
    actor's `ctx.kv` writes change nothing else)."""
    return kv.generation(), kv.get([HEAD_KEY])[0], combine(b"", other_entries(kv))


def _unchanged(source: ActorKv, done: dict[str, Any]) -> bool:
    """Whether `source` still holds what an earlier run copied from it (`done`): the same
    fingerprint, and then the same entries, read again, as another store's namespace of the
    same name may have the same fingerprint (a resume from another source). One copied from a
    snapshot has no digest of its entries and is copied again."""
    if done.get("digest") is None or tuple(done["fingerprint"]) != _fingerprint(source):
        return False
    return combine(b"", scan(frozen_if_small(source, FROZEN_COPY_BYTES))) == done["digest"]


def _remove(run: _Run, name: str) -> bool:
    """Empty the destination namespace `name`, which the source does not have (an interrupted
    run copied it from a source that has since lost it, or from another source), and remove
    its index entries; whether it held anything."""
    kv = run.destination.namespace(name)
    held = kv.used_bytes() > 0 or bool(records_of(run.dst_index, name)) or name in run.resumed
    _forget_progress(run, name)
    generation = kv.takeover()
    kv.drop(fence=generation)
    forget(run.dst_index, name, generation)
    return held


def _forget_progress(run: _Run, name: str) -> None:
    """Delete the progress entry of `name` before its destination namespace is taken over and
    emptied: a run interrupted after the drop must not leave an entry saying the namespace
    holds a copy, or a resume from the source that entry names skips it, and its check fails
    (`CopyMismatch`)."""
    if name in run.resumed:
        run.dst_index.delete([COPY_PREFIX + name.encode()])


def _copy_one(run: _Run, name: str) -> None:
    source = run.source.namespace(name)
    done = run.resumed.get(name)
    if done is not None and _unchanged(source, done):
        with run.lock:
            run.entries[name] = done
        run.report("copy", skipped=True)
        return
    _forget_progress(run, name)
    destination = run.destination.namespace(name)
    clear = name in run.existing
    copied = None
    for _ in range(RAW_ATTEMPTS):
        copied = _consistent_copy(frozen_if_small(source, FROZEN_COPY_BYTES), destination, clear)
        clear = True
        if copied is not None:
            break
    if copied is None:
        with run.lock:
            run.snapshots.append(name)
        if source.used_bytes() <= FROZEN_MAX_BYTES:
            with run.big:
                copied = _consistent_copy(FrozenNamespace(source), destination, True)
            assert copied is not None, "a frozen namespace never changes"
        else:
            before = _fingerprint(source)
            copied = _Copied(before, *_snapshot_copy(source, destination), None)
    before, generation, written, checksum, digest = copied
    entry = {"fingerprint": list(before), "checksum": checksum, "digest": digest}
    _enroll(run, name, generation, entry, empty=written == 0, fresh=name not in run.existing)
    with run.lock:
        run.entries[name] = entry
        run.targets[name] = (destination, written)
    run.report("copy", copied=written)


class _Copied(NamedTuple):
    """One namespace copied: its source's fingerprint before, the destination's generation,
    the bytes written, the checksum of the content copied and the digest of the entries read
    (None: copied from a snapshot)."""

    fingerprint: Fingerprint
    generation: int
    written: int
    checksum: str
    digest: str | None


def _consistent_copy(view: ActorKv, destination: ActorKv, clear: bool) -> _Copied | None:
    """`_raw_copy` of `view`, with the checksum of what it copied; None if `view` changed
    meanwhile (the checksum is taken between the copy and the second fingerprint, so it is of
    the state copied; a snapshot the writer overtook means a change too)."""
    before = _fingerprint(view)
    generation, written, digest = _raw_copy(view, destination, clear=clear)
    if isinstance(view, FrozenNamespace):  # one state: it cannot have changed
        return _Copied(before, generation, written, namespace_checksum(view), digest)
    if _fingerprint(view) != before:
        return None
    try:
        checksum = namespace_checksum(view)
    except SnapshotExpired:
        return None
    if _fingerprint(view) != before:
        return None
    return _Copied(before, generation, written, checksum, digest)


def _raw_copy(source: ActorKv, destination: ActorKv, *, clear: bool) -> tuple[int, int, str]:
    """Take `destination` over, empty it if `clear`, and write every entry of `source` into it,
    restamped with its generation; returns the generation, the bytes written and the digest of
    the entries as read (`combine(b"", ...)`)."""
    generation = destination.takeover()
    if clear:
        destination.drop(fence=generation)
    written = 0
    digest = EntriesDigest()

    def read() -> Iterator[tuple[bytes, bytes]]:
        for key, value in scan(source):
            digest.add(key, value)
            yield key, restamp(key, value, generation)

    for batch in batches(read(), destination.limits):
        destination.write(put=batch, fence=generation)
        written += sum(len(k) + len(v) for k, v in batch.items())
    return generation, written, digest.hexdigest()


def _snapshot_copy(source: ActorKv, destination: ActorKv) -> tuple[int, int, str]:
    """Copy the database of a namespace that keeps changing from a read-only snapshot (SQLite's
    backup into the destination, one transaction), then its other entries; returns the
    generation, the bytes the destination holds and the checksum of what was copied."""

    def copy(snapshot: Database) -> tuple[int, bytes]:
        fence = destination.takeover()
        destination.drop(fence=fence)
        target = open_database(destination)
        try:
            copy_pages(target.connection, snapshot.connection)
            return target.generation, database_digest(snapshot.connection)
        finally:
            target.close()

    generation, digest = read_namespace(source, copy)
    others = list(other_entries(source))
    for batch in batches(others, destination.limits):
        destination.write(put=batch, fence=generation)
    return generation, destination.used_bytes(), combine(digest, others)


def _enroll(
    run: _Run, name: str, generation: int, entry: dict[str, Any], *, empty: bool, fresh: bool
) -> None:
    """The actor's record and lease entry at the destination (from the source's newest
    record and wake time), with its progress entry in the record's batch. A namespace with
    no record (no actor: written without the registry), or an `empty` one (a destroyed actor
    whose destroyer died before its record went: the data decides), gets only its progress
    entry."""
    progress = {COPY_PREFIX + name.encode(): cbor2.dumps(entry)}
    record = None if empty else _record(run.src_index, name)
    if record is None:
        if not fresh:  # what the destination recorded of it is of another source's data
            forget(run.dst_index, name, generation)
        run.dst_index.put(list(progress.items()))
        return
    assert run.src_index is not None
    due = Ownership(run.src_index, TOOL_REGISTRY, None).due(name)
    enroll(
        run.dst_index,
        name,
        record.name,
        record.key,
        generation,
        created=record.created,
        due=due,
        fresh=fresh,
        extra=progress,
    )


def _record(index: ActorKv | None, name: str) -> ActorRecord | None:
    records = [] if index is None else records_of(index, name)
    return records[-1] if records else None


def _verify_one(run: _Run, name: str, changed: list[str], mismatched: list[str]) -> None:
    entry = run.entries[name]
    target = run.targets.get(name)
    if target is None:  # copied by an earlier run
        copied = frozen_if_small(run.destination.namespace(name), FROZEN_COPY_BYTES)
    else:
        kv, written = target
        copied = FrozenNamespace(kv) if written <= FROZEN_COPY_BYTES else kv
    checksum = namespace_checksum(copied)
    now = _fingerprint(run.source.namespace(name))
    with run.lock:
        if checksum != entry["checksum"]:
            mismatched.append(name)
        if now != tuple(entry["fingerprint"]):
            changed.append(name)
    run.report("verify")
