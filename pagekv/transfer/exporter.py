"""`export_actor`: an actor's database as a plain SQLite file, read from a snapshot.

The file is the database as committed in the store at one instant, page for page (SQLite's
backup API from a read-only snapshot): a standard SQLite database (4 KiB pages, rollback
journal) that any SQLite tool opens, holding every table, the runtime's own `_pagekv_` ones
(state, schedules, queue, workflow history, connections) included. The actor's `ctx.kv`
entries, which live beside the database in its namespace, are added as the table
`_pagekv_kv(key, value)` (only when it has some), which `import_actor` moves back.

An export never takes the actor over and never writes, so it is safe beside a live instance in this
process or another. An actor of up to 256 MiB is read in one `list` (`frozen_namespace.py`): its
database and `ctx.kv` entries as they were at one instant, whatever a writer does meanwhile. A
bigger one is read through a snapshot as the backup asks, and a writer that rewrites a page in place
before the snapshot read it overtakes it: the export then starts again on a fresh snapshot
(`SNAPSHOT_ATTEMPTS` in all, then `SnapshotExpired`), and its `ctx.kv` entries are read after it.
Either way the database in the file is one committed state, never a mix.

The file appears whole or not at all: it is written under a temporary name in its directory,
synced, and renamed over `path`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, cast
from urllib.parse import quote

import apsw

from pagekv.actor.directory.records import ActorRecord, find_actor, list_actors
from pagekv.actor.errors import ActorError, ActorNotFound
from pagekv.actor.inspect_reads import open_index, read_namespace
from pagekv.actor.user_kv import USER_PREFIX
from pagekv.kv import ActorKv, KvStore, prefix_end
from pagekv.transfer.chunked_io import scan
from pagekv.transfer.frozen_namespace import frozen_if_small
from pagekv.vfs import Database

USER_KV_TABLE: Final = "_pagekv_kv"
"""The table of an exported file that holds the actor's `ctx.kv` entries (keys without the
namespace's prefix); not a table of the actor's database."""
MANIFEST: Final = "actors.json"
"""The list of the files an `export_all` wrote, with each one's name and key."""
_LIST_PAGE: Final = 1000
_MAX_FILE_PART: Final = 200
_CUT: Final = "~"
"""Marks a `file_part` cut short, before its digest: the quoting escapes every `~` of the text
itself, so a part holds one only if it was cut."""


class FileShared(ActorError, ValueError):
    """Two actors of an `export_all` would be written to one file (one would overwrite the
    other); nothing was exported."""


@dataclass(frozen=True)
class Exported:
    """One exported actor: its file, its size and what it holds."""

    actor: ActorRecord
    path: Path
    bytes: int
    pages: int
    """Pages of the actor's database (the file's, less the `_pagekv_kv` table's)."""
    kv_entries: int
    """`ctx.kv` entries, in the table `_pagekv_kv`."""


def export_actor(store: KvStore, name: str, key: str, path: str | os.PathLike[str]) -> Exported:
    """Write the actor's database to `path` (replaced if it exists) as a plain SQLite file;
    `ActorNotFound` if the store has no such actor. Read-only on the store."""
    index = open_index(store)
    record = None if index is None else find_actor(index, name, key)
    if record is None:
        raise ActorNotFound(f"no actor {name!r} with key {key!r}")
    return export_record(store, record, Path(path))


def export_all(store: KvStore, directory: str | os.PathLike[str]) -> list[Exported]:
    """Export every actor of the store into `directory` (made if needed), one file each at
    `NAME/KEY.sqlite` (both percent-encoded), and list them in `actors.json` there. An actor
    destroyed after it was listed is left out. Every actor's file is named before any is
    written: two actors named to one file are `FileShared` (the names are unique by
    construction; this is what makes a digest collision, or a bug, refuse instead of overwrite)."""
    root = Path(directory)
    index = open_index(store)
    targets: dict[Path, ActorRecord] = {}
    after = None
    while index is not None:
        records = list_actors(index, limit=_LIST_PAGE, after=after)
        for record in records:
            target = root / _directory_part(record.name) / f"{file_part(record.key)}.sqlite"
            other = targets.setdefault(target, record)
            if other is not record:
                raise FileShared(
                    f"actors {other.actor_id!r} and {record.actor_id!r} would both be exported "
                    f"to {target}; nothing was exported"
                )
        if len(records) < _LIST_PAGE:
            break
        after = records[-1].actor_id
    root.mkdir(parents=True, exist_ok=True)
    exported = []
    for target, record in targets.items():
        target.parent.mkdir(exist_ok=True)
        try:
            exported.append(export_record(store, record, target))
        except ActorNotFound:
            continue  # destroyed since it was listed: not one of the actors any more
    manifest = [
        {"name": e.actor.name, "key": e.actor.key, "file": str(e.path.relative_to(root))}
        for e in exported
    ]
    _write_atomically(root / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1)))
    return exported


def file_part(text: str) -> str:
    """`text` as one safe file name part: percent-encoded (no `/`, no NUL), a leading dot
    encoded too (no `.` or `..`, no hidden file), and a long one cut, with a digest of it.

    Distinct texts get distinct parts. Percent-encoding is undone by decoding, so whole parts
    differ; `~`, which `quote` keeps, is encoded too, so a whole part never holds the `~` that
    marks a cut one (a text that reads like a cut part is not taken for one); two cut parts
    differ in their digest of the whole text (64 bits)."""
    part = quote(text, safe="").replace(_CUT, "%7E")
    if part.startswith("."):
        part = "%2E" + part[1:]
    if len(part) > _MAX_FILE_PART or not part:
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        part = part[: _MAX_FILE_PART - len(_CUT) - len(digest)] + _CUT + digest
    return part


def _directory_part(name: str) -> str:
    """`file_part` of an actor's name, the directory of its actors' files: never the
    manifest's name (an actor may be named `actors.json`), whatever the file system's case."""
    part = file_part(name)
    return part.replace(".", "%2E") if part.lower() == MANIFEST else part


def export_record(store: KvStore, record: ActorRecord, path: Path) -> Exported:
    """`export_actor` of an actor whose record is known."""
    kv = frozen_if_small(store.namespace(record.actor_id))
    counts: list[int] = []

    def write(tmp: Path) -> None:
        counts.append(read_namespace(kv, partial(_backup, tmp, record)))
        counts.append(_add_user_kv(tmp, kv))

    _write_atomically(path, write)
    return Exported(record, path, path.stat().st_size, counts[0], counts[1])


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Run `write(tmp)` on a temporary file beside `path`, sync it, and rename it over `path`;
    on any failure remove it (and a journal SQLite left beside it) and raise."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}-journal").unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _backup(tmp: Path, record: ActorRecord, database: Database) -> int:
    """Copy the snapshot's pages into the file `tmp` (emptied first: a snapshot that expired
    may have left part of a copy); returns its page count. `ActorNotFound` if the snapshot holds
    no database: the actor was destroyed after its record was read (a recorded actor was
    created, which wrote its database)."""
    if not database.connection.execute("PRAGMA page_count").fetchall()[0][0]:
        raise ActorNotFound(
            f"actor {record.name!r} with key {record.key!r} was destroyed while it was exported"
        )
    tmp.write_bytes(b"")
    target = apsw.Connection(str(tmp))
    try:
        copy_pages(target, database.connection)
        return cast(int, target.execute("PRAGMA page_count").fetchall()[0][0])
    finally:
        target.close()


def copy_pages(target: apsw.Connection, source: apsw.Connection) -> None:
    """Every page of `source`'s main database into `target`'s, in one step of SQLite's backup
    API. A failed step raises its own error: the backup's `finish` then reports the same
    failure again, which apsw's context manager turns into a `SystemError` that hides it."""
    backup = target.backup("main", source, "main")
    try:
        backup.step(-1)
    except apsw.Error as e:
        try:
            backup.finish()
        except apsw.Error as again:
            e.add_note(f"finishing the backup failed too: {again}")
        raise
    backup.finish()


def _add_user_kv(tmp: Path, kv: ActorKv) -> int:
    """Add the actor's `ctx.kv` entries to the file as the table `_pagekv_kv`, if it has
    any; returns their number. They go from the store into SQLite a page of `scan` at a time
    (`READ_ROWS` entries): an export holds a page of them in memory, never all of them."""
    entries = scan(kv, USER_PREFIX, prefix_end(USER_PREFIX))
    first = next(entries, None)
    if first is None:
        return 0
    count = 0

    def rows() -> Iterator[tuple[bytes, bytes]]:
        nonlocal count
        for key, value in itertools.chain([first], entries):
            count += 1
            yield key[len(USER_PREFIX) :], value

    target = apsw.Connection(str(tmp))
    try:
        with target:
            target.execute(
                f"CREATE TABLE {USER_KV_TABLE}(key BLOB PRIMARY KEY, value BLOB NOT NULL) "
                "WITHOUT ROWID"
            )
            target.executemany(f"INSERT INTO {USER_KV_TABLE} VALUES (?, ?)", rows())
    finally:
        target.close()
    return count
