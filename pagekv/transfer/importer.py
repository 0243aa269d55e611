"""`import_actor`: an actor made from a plain SQLite file (an export, or any SQLite database).

What the file must be, checked on a private working copy before the store is touched (the
user's file is only read, through SQLite, so a process writing it meanwhile cannot tear the
copy: it holds one committed state): a SQLite database (`ImportRefused` otherwise) that
passes `PRAGMA integrity_check`, with an internal schema no newer than this pagekv's
(`SchemaTooNew`) and internal tables exactly as the runtime makes them. What is converted,
and reported in `Imported.converted`: a WAL database is checkpointed and switched to a
rollback journal; a page size other than 4 KiB is rebuilt at 4 KiB (`VACUUM`, which may
renumber the rowids of tables without an INTEGER PRIMARY KEY); an older internal schema is
upgraded by the runtime's own migrations; a database with no internal tables gets them, and
becomes an actor created now with the state `state`. The actor's name and key in its metadata
become the ones it is imported as, and a `_pagekv_kv` table (an export's `ctx.kv` entries) is
moved back into the namespace: checked by SQLite (types, sizes, no key twice) and moved into a
side file, and the working copy rebuilt without the table's free pages (`VACUUM INTO`, which
keeps rowids), so the store does not hold the entries twice.

Writing it: the database goes into the actor's namespace through the VFS in one SQLite
transaction (the backup API), taking the namespace over first, so the KV limits and the quota
apply as to any commit, and the move of the head is the one point where the new database
becomes visible: readers see the old database or the new one, never a mix. Memory stays
bounded (the VFS stages a big transaction to the store as it goes; the `ctx.kv` entries are
read from their side file one batch at a time). The record of the actor in
the registry's index comes last, in one batch with its lease entry (`index_entries.enroll`):
until it is written no registry lists the actor or finds it with a `get`, so an import that
fails, or is killed, leaves no actor behind. A failed import of a new actor also drops what it
wrote (only if the index, read again after the takeover, still has no record of it: a registry
that created the actor meanwhile wrote the namespace, and the import is refused, leaving it);
a killed one leaves at most the unreferenced chunks of an interrupted commit, which the next
open of the namespace (a new import, or a wake) deletes, or, killed between the commit and the
record, a database no record names: an import treats an actor without a record as absent
(one never served a call: a create records an actor before it serves) and writes over it.

`replace=True` imports over an existing actor: the takeover fences off any live instance (its
next write fails and it is torn down; its registry wakes the actor again on the next call, on
the new database). The database's swap is the one visible step; the actor's `ctx.kv` entries
are swapped right after it, under the same generation. An instance that wakes meanwhile (a
call) takes the namespace over in turn, and the import's next write is refused:
`ImportInterrupted`, which says whether the database had been swapped (between the two swaps
the actor holds the new database with its old `ctx.kv` entries; no KV batch can hold both, as
the database's commit is the VFS's own). The quota must hold both databases until the commit
(and compaction) frees the old one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import apsw

from pagekv.actor.directory.enroll import TOOL_REGISTRY, enroll, forget
from pagekv.actor.directory.leases import Ownership
from pagekv.actor.directory.records import REGISTRY_NAMESPACE, ActorRecord, actor_id, records_of
from pagekv.actor.errors import ActorError, ActorExists
from pagekv.actor.inspect_reads import ListableStore, open_index
from pagekv.actor.tables.schema import (
    MIGRATIONS,
    PREFIX,
    SCHEMA_VERSION,
    has_table,
    migrate,
    stored_version,
)
from pagekv.actor.tables.sql import (
    due_types,
    earliest_due,
    encode_state,
    is_initialized,
    mark_initialized,
    name_actor,
    read_meta,
)
from pagekv.actor.user_kv import USER_PREFIX
from pagekv.actor.workflow.history import FINAL_STATES, describe
from pagekv.kv import (
    ActorKv,
    FenceMismatch,
    KeyTooLarge,
    KvError,
    KvLimits,
    KvStore,
    StorageQuotaExceeded,
    ValueTooLarge,
    check_name,
    prefix_end,
)
from pagekv.transfer.chunked_io import batches
from pagekv.transfer.exporter import MANIFEST, USER_KV_TABLE, copy_pages
from pagekv.vfs import PAGE_SIZE, Database, open_database
from pagekv.vfs.format import FRAME_BYTES

_MAGIC: Final = b"SQLite format 3\x00"
_HEADER_BYTES: Final = 100
_WAL_FORMAT_BYTE: Final = 18
_WAL_FORMAT: Final = 2
"""A database file's header: byte 18 (its read format) is 2 in WAL mode."""
_BUSY_MS: Final = 10_000
"""How long the read of a file waits for a writer of it to let go of its lock."""
_INTEGRITY_LINES: Final = 5
"""Lines of a failed `integrity_check` quoted in the refusal."""
_SHOWN_KEY_BYTES: Final = 32
"""Bytes of a `ctx.kv` key quoted in a refusal."""


class ImportRefused(ActorError, ValueError):
    """The file cannot become an actor (the message says why); nothing was written."""


class ImportInterrupted(ActorError):
    """Another instance took the actor over while it was imported (a call woke it there): the
    import's writes after that were refused. The message says whether its database had been
    swapped by then."""


class ManifestFileShared(ImportRefused):
    """An `export_all` manifest lists one file for two actors: one of them would be imported
    with the other's data. Nothing was imported."""


class DuplicateKvKey(ImportRefused):
    """The file's `_pagekv_kv` table holds a `ctx.kv` key more than once (an export never
    does; a hand-made table without its primary key can): which value is the actor's cannot
    be told."""


class SchemaTooNew(ImportRefused):
    """The file's internal schema is newer than this pagekv's: upgrade pagekv to import it."""


@dataclass(frozen=True)
class Imported:
    """One imported actor."""

    actor: ActorRecord
    generation: int
    """The namespace generation the import wrote as."""
    pages: int
    kv_entries: int
    replaced: bool
    """An existing actor's database was replaced."""
    converted: tuple[str, ...]
    """What was changed on the way in (journal mode, page size, internal schema), in words."""


@dataclass(frozen=True)
class UserKvFile:
    """The checked `ctx.kv` entries of a file to import, in a SQLite file of their own (table
    `kv(key, value)`, keys as `ctx.kv` sees them, in key order), read back in batches as
    they are written to the store: held in SQLite, never all in memory. The sizes let another
    store's limits and quota be checked without reading them again."""

    path: Path
    entries: int
    bytes: int
    """Keys and values, as the store counts them."""
    largest_key: int
    largest_value: int


@dataclass(frozen=True)
class PreparedImport:
    """A working copy of a file ready to be written as actor `(name, key)`: checked,
    converted, named as the actor (`prepare_import`)."""

    name: str
    key: str
    path: Path
    pages: int
    user_kv: UserKvFile | None
    """Its `ctx.kv` entries, moved out of the database into a file of their own."""
    created: float | None
    due: float | None
    converted: tuple[str, ...]
    limits: KvLimits
    """The limits its `ctx.kv` entries were checked against."""


def import_actor(
    store: KvStore,
    name: str,
    key: str,
    path: str | os.PathLike[str],
    *,
    replace: bool = False,
    state: Any = None,
) -> Imported:
    """Create actor `(name, key)` on `store` from the SQLite file at `path` (see the module's
    docstring). `ActorExists` if it exists, unless `replace`; `state` is the state of an actor
    made from a file with no internal tables (an export has its own)."""
    limits: KvLimits = getattr(store, "limits", None) or KvLimits()
    with prepare_import(path, name, key, state=state, limits=limits) as prepared:
        return import_prepared(store, prepared, replace=replace)


class ImportStopped(ActorError):
    """`import_all` stopped at an actor it could not import; `imported` are the ones before
    it, each whole (the cause says why that one failed)."""

    def __init__(self, message: str, imported: list[Imported]) -> None:
        super().__init__(message)
        self.imported = imported


def read_manifest(directory: str | os.PathLike[str]) -> list[tuple[str, str, Path]]:
    """The actors an `export_all` directory lists in its manifest: `(name, key, file)`, each
    file inside `directory`, each actor once, each file once (`ManifestFileShared`);
    `ImportRefused` naming what is wrong otherwise (a hand-edited manifest, or one an older
    export wrote with two actors in one file, must not make an import read a file elsewhere or
    give one actor another's data)."""
    root = Path(directory)
    try:
        listed = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise ImportRefused(f"{root} holds no {MANIFEST}: it is no export --all") from None
    except (OSError, ValueError) as e:
        raise ImportRefused(f"{root / MANIFEST} cannot be read as JSON: {e}") from None
    if not isinstance(listed, list):
        raise ImportRefused(f"{root / MANIFEST} must be a list of actors")
    inside, seen, entries = root.resolve(), set(), []
    files: dict[Path, int] = {}
    for n, entry in enumerate(listed):
        fields = entry if isinstance(entry, dict) else {}
        name, key, file = fields.get("name"), fields.get("key"), fields.get("file")
        if not (isinstance(name, str) and isinstance(key, str) and isinstance(file, str)):
            raise ImportRefused(f"{MANIFEST} entry {n} needs string name, key and file")
        path = root / file
        resolved = path.resolve()
        if not resolved.is_relative_to(inside):
            raise ImportRefused(f"{MANIFEST} entry {n} names a file outside {root}: {file!r}")
        if (name, key) in seen:
            raise ImportRefused(f"{MANIFEST} lists actor {name!r} with key {key!r} twice")
        first = files.setdefault(resolved, n)
        if first != n:
            raise ManifestFileShared(
                f"{MANIFEST} entries {first} and {n} name one file, {file!r}, for two actors; "
                "nothing was imported"
            )
        seen.add((name, key))
        entries.append((name, key, path))
    return entries


def import_all(
    store: KvStore, directory: str | os.PathLike[str], *, replace: bool = False
) -> list[Imported]:
    """Import every actor an `export_all` wrote to `directory`, in its manifest's order. Each
    actor is one `import_actor`, with all it guarantees; the whole is not one step. Nothing is
    imported if the manifest is malformed or, without `replace`, if any actor it lists exists
    already (`ActorExists` naming them); an import that fails stops the rest (`ImportStopped`,
    saying which actors were imported before it)."""
    entries = read_manifest(directory)
    index = open_index(store)
    if not replace and index is not None:
        there = [actor_id(n, k) for n, k, _ in entries if records_of(index, actor_id(n, k))]
        if there:
            shown = ", ".join(there[:5]) + (f" and {len(there) - 5} more" if len(there) > 5 else "")
            raise ActorExists(
                f"{len(there)} actor(s) of the export exist already ({shown}); nothing was "
                "imported (use replace)"
            )
    imported: list[Imported] = []
    for name, key, path in entries:
        try:
            imported.append(import_actor(store, name, key, path, replace=replace))
        except (ActorError, KvError, OSError) as e:
            raise ImportStopped(
                f"the import of {actor_id(name, key)} from {path} failed ({e}); "
                f"{len(imported)} of the {len(entries)} actor(s) were imported before it",
                imported,
            ) from e
    return imported


@contextmanager
def prepare_import(
    path: str | os.PathLike[str],
    name: str,
    key: str,
    *,
    state: Any = None,
    limits: KvLimits | None = None,
) -> Iterator[PreparedImport]:
    """Check and convert the file at `path` into a private working copy, without a store:
    `ImportRefused` (and the rest of the file's refusals) before a store is even opened, so a
    tool that would create the store can refuse first. The copy is removed on leaving."""
    checked = limits or KvLimits()
    check_name(checked, actor_id(name, key))
    with tempfile.TemporaryDirectory(prefix="pagekv-import-") as work:
        yield _prepare(Path(path), Path(work), name, key, state, checked)


def import_prepared(store: KvStore, prepared: PreparedImport, *, replace: bool = False) -> Imported:
    """`import_actor` of a file `prepare_import` checked and converted."""
    name, key = prepared.name, prepared.key
    aid = actor_id(name, key)
    limits: KvLimits = getattr(store, "limits", None) or KvLimits()
    if limits != prepared.limits:
        check_name(limits, aid)
        if prepared.user_kv is not None:
            _check_sizes(limits, prepared.user_kv)
    index = open_index(store)
    existed = index is not None and bool(records_of(index, aid))
    if existed and not replace:
        raise ActorExists(f"actor {name!r} with key {key!r} already exists (use replace)")
    _check_quota(store, aid, prepared, limits)
    if index is None:
        index = store.namespace(REGISTRY_NAMESPACE)
    Ownership(index, TOOL_REGISTRY, None).check_fits(aid)
    kv = store.namespace(aid)
    database = open_database(kv)
    try:
        generation = database.generation
        if records_of(index, aid) and not existed:  # created since the first look
            if not replace:
                raise ActorExists(f"actor {name!r} with key {key!r} was created meanwhile")
            existed = True
        try:
            _swap(database, prepared)
            _swap_user_kv(kv, generation, prepared)
            enroll(
                index,
                aid,
                name,
                key,
                generation,
                created=prepared.created,
                due=prepared.due,
                fresh=False,
            )
        except ImportInterrupted:
            raise  # the namespace is another instance's now: nothing of it is the import's
        except BaseException as e:
            if not existed:
                _drop_new(kv, index, aid, generation, e)
            raise
    finally:
        database.close()
    record = ActorRecord(name, key, prepared.created or time.time(), generation)
    return Imported(
        record,
        generation,
        prepared.pages,
        0 if prepared.user_kv is None else prepared.user_kv.entries,
        existed,
        prepared.converted,
    )


def _prepare(
    source: Path, work: Path, name: str, key: str, state: Any, limits: KvLimits
) -> PreparedImport:
    """Copy `source` into `work` (`_read`), check and convert it."""
    if not source.exists():
        raise ImportRefused(f"{source}: no such file")
    if not source.is_file():
        raise ImportRefused(f"{source} is not a regular file")
    with open(source, "rb") as f:
        header = f.read(_HEADER_BYTES)
    if header[: len(_MAGIC)] != _MAGIC:
        raise ImportRefused(f"{source} is not a SQLite database (no 'SQLite format 3' header)")
    copy = work / "actor.sqlite"
    try:
        _read(source, copy, wal=header[_WAL_FORMAT_BYTE] == _WAL_FORMAT)
        connection = apsw.Connection(str(copy))
    except (apsw.CorruptError, apsw.NotADBError) as e:
        raise ImportRefused(f"{source} is corrupt: {e}") from e
    except apsw.Error as e:
        raise ImportRefused(f"{source} cannot be opened as a SQLite database: {e}") from e
    try:
        return _convert(connection, source, copy, name, key, state, limits)
    except (apsw.CorruptError, apsw.NotADBError) as e:
        raise ImportRefused(f"{source} is corrupt: {e}") from e
    except apsw.Error as e:  # e.g. a `_pagekv_` table without the runtime's columns
        raise ImportRefused(f"{source} cannot be read as an actor's database: {e}") from e
    finally:
        connection.close()


def _read(source: Path, copy: Path, *, wal: bool) -> None:
    """The database in `source` as of one committed state, into the new file `copy`: through
    SQLite's backup API from a read-only connection, whose read transaction no writer of the
    file (in any process) can tear, as a copy of its bytes can. Two cases are copied as bytes
    instead: a WAL database with no WAL beside it (the file is the whole database, and a
    connection would leave a -wal and a -shm file beside the user's), and a hot journal (a
    writer died mid-commit; a read-only connection cannot roll it back, the copy does when it
    is opened)."""
    if wal and not Path(f"{source}-wal").exists():
        shutil.copyfile(source, copy)
        return
    reader = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        reader.set_busy_timeout(_BUSY_MS)
        target = apsw.Connection(str(copy))
        try:
            copy_pages(target, reader)
        finally:
            target.close()
    except apsw.ReadOnlyError as e:
        if getattr(e, "extendedresult", None) != apsw.SQLITE_READONLY_ROLLBACK:  # not stubbed
            raise
        shutil.copyfile(source, copy)
        try:
            shutil.copyfile(f"{source}-journal", f"{copy}-journal")
        except FileNotFoundError:
            raise ImportRefused(
                f"{source} was being written while it was read (its journal went); try again"
            ) from None
    finally:
        reader.close()


def _convert(
    connection: apsw.Connection,
    source: Path,
    copy: Path,
    name: str,
    key: str,
    state: Any,
    limits: KvLimits,
) -> PreparedImport:
    converted = []
    mode = cast(str, connection.execute("PRAGMA journal_mode").fetchall()[0][0])
    if mode.lower() == "wal":
        connection.execute("PRAGMA journal_mode = DELETE")
        converted.append("journal mode WAL -> DELETE (its WAL checkpointed into the file)")
    problems = [row[0] for row in connection.execute("PRAGMA integrity_check")]
    if problems != ["ok"]:
        shown = "; ".join(problems[:_INTEGRITY_LINES])
        raise ImportRefused(f"{source} is corrupt (integrity_check: {shown})")
    page_size = connection.execute("PRAGMA page_size").fetchall()[0][0]
    if page_size != PAGE_SIZE:
        connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        connection.execute("VACUUM")
        converted.append(f"page size {page_size} -> {PAGE_SIZE} (VACUUM)")
    converted.extend(_internal_tables(connection, source, name, key, state))
    user_kv = _take_user_kv(connection, source, copy.parent / "ctx-kv.sqlite", limits)
    created = read_meta(connection).created_at
    due = _due(connection, source)
    if user_kv is not None:
        copy = _compacted(connection, copy)
    reader = apsw.Connection(str(copy), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        pages = cast(int, reader.execute("PRAGMA page_count").fetchall()[0][0])
    finally:
        reader.close()
    return PreparedImport(
        name,
        key,
        copy,
        pages,
        user_kv,
        created if isinstance(created, int | float) else None,
        due,
        tuple(converted),
        limits,
    )


def _internal_tables(
    connection: apsw.Connection, source: Path, name: str, key: str, state: Any
) -> list[str]:
    """Bring the runtime's tables to this pagekv's schema (or create them, with the record of
    a creation, for a plain database) and name the actor in them; what changed, in words."""
    if not has_table(connection, "_pagekv_meta"):
        _check_internal_schema(connection, source, 0)
        mark_initialized(connection, name, key, encode_state(state), fresh=True)
        return ["plain SQLite database: the runtime's tables created, with the given state"]
    version = stored_version(connection)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ImportRefused(f"{source} has an internal schema version of {version!r}")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{source} has internal schema version {version!r}; this pagekv knows up to "
            f"{SCHEMA_VERSION}. Upgrade pagekv to import it."
        )
    _check_internal_schema(connection, source, version)
    if not is_initialized(connection):
        raise ImportRefused(f"{source} holds the tables of an actor that was never created")
    before = migrate(connection)
    with connection:
        name_actor(connection, name, key)
    return [] if before == SCHEMA_VERSION else [f"internal schema {before} -> {SCHEMA_VERSION}"]


_Object = tuple[str, str, str, str | None]
"""A schema object of the runtime's, as compared: type, name and table (lower case, as SQLite
reads names) and its SQL with blanks collapsed."""


def _check_internal_schema(connection: apsw.Connection, source: Path, version: int) -> None:
    """Refuse a file whose objects named with, or on a table named with, the reserved prefix
    are not exactly those the runtime's migrations make up to `version` (an export's
    `_pagekv_kv` table aside). The runtime never lets an actor's SQL make any: a trigger on an
    internal table would run the file's SQL inside the runtime's own writes, with their right
    to write internal tables, and a view or a changed table in the place of one breaks them."""
    found = _internal_schema(connection)
    expected = _expected_schema(version)
    odd = [found[o] for o in sorted(found.keys() - expected.keys())]
    missing = [expected[o] for o in sorted(expected.keys() - found.keys())]
    if not odd and not missing:
        return
    parts = ([f"not the runtime's (or changed): {', '.join(odd[:5])}"] if odd else []) + (
        [f"missing (or changed): {', '.join(missing[:5])}"] if missing else []
    )
    what = f"schema version {version}" if version else "a database with no _pagekv_meta table"
    raise ImportRefused(
        f"{source}: its internal schema objects are not those of {what}; " + "; ".join(parts)
    )


def _internal_schema(connection: apsw.Connection) -> dict[_Object, str]:
    """The runtime's schema objects of a database, each with its description for a message."""
    found = {}
    for kind, name, table, sql in connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema"
    ):
        key = (kind, name.lower(), table.lower(), " ".join(sql.split()).lower() if sql else None)
        if not (key[1].startswith(PREFIX) or key[2].startswith(PREFIX)):
            continue
        if key[2] == USER_KV_TABLE and kind in ("table", "index"):
            continue
        found[key] = f"{kind} {name!r}" + (f" on {table}" if table != name else "")
    return found


@functools.cache
def _expected_schema(version: int) -> dict[_Object, str]:
    """What the runtime's migrations make up to `version`, in an empty database."""
    fresh = apsw.Connection(":memory:")
    try:
        for step in range(1, version + 1):
            for sql in MIGRATIONS[step]:
                fresh.execute(sql)
        return _internal_schema(fresh)
    finally:
        fresh.close()


def _take_user_kv(
    connection: apsw.Connection, source: Path, side: Path, limits: KvLimits
) -> UserKvFile | None:
    """Move the `ctx.kv` entries of an export's `_pagekv_kv` table out of the working copy
    into the file `side`, checked on the way: each a non-empty blob key and a blob value within
    the store's limits, no key twice (`DuplicateKvKey`: one would silently replace the other).
    SQLite does the checking and the moving, so an import holds none of them in memory. None if
    the file has no such table (one it has is dropped from the working copy, even empty)."""
    exists = connection.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND lower(name) = ?", (USER_KV_TABLE,)
    ).fetchall()
    if not exists:
        return None
    entries, odd, largest_key, largest_value, total = cast(
        tuple[int, float, int | None, int | None, float],
        connection.execute(
            "SELECT count(*), "
            "total(typeof(key) != 'blob' OR typeof(value) != 'blob' OR length(key) = 0), "
            f"max(length(key)), max(length(value)), total(length(key) + length(value)) "
            f"FROM {USER_KV_TABLE}"
        ).fetchall()[0],
    )
    if odd:
        raise ImportRefused(
            f"{source}: {USER_KV_TABLE} holds a key or value that is not a non-empty blob"
        )
    found = UserKvFile(
        side,
        entries,
        int(total) + entries * len(USER_PREFIX),
        (largest_key or 0) + len(USER_PREFIX),
        largest_value or 0,
    )
    _check_sizes(limits, found)
    connection.execute("ATTACH ? AS side", (str(side),))
    try:
        with connection:
            connection.execute(
                "CREATE TABLE side.kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
            )
            try:
                connection.execute(
                    f"INSERT INTO side.kv SELECT key, value FROM main.{USER_KV_TABLE} ORDER BY key"
                )
            except apsw.ConstraintError:
                raise _duplicate(connection, source) from None
            connection.execute(f"DROP TABLE main.{USER_KV_TABLE}")
    finally:
        connection.execute("DETACH side")
    return found


def _duplicate(connection: apsw.Connection, source: Path) -> DuplicateKvKey:
    """The refusal of a `_pagekv_kv` table that holds a key twice, naming one such key."""
    key = cast(
        bytes,
        connection.execute(
            f"SELECT key FROM {USER_KV_TABLE} GROUP BY key HAVING count(*) > 1 LIMIT 1"
        ).fetchall()[0][0],
    )
    shown = key[:_SHOWN_KEY_BYTES].hex() + ("..." if len(key) > _SHOWN_KEY_BYTES else "")
    return DuplicateKvKey(
        f"{source}: {USER_KV_TABLE} holds the key {shown} (hex) more than once; an export "
        "holds each ctx.kv key once"
    )


def _check_sizes(limits: KvLimits, user_kv: UserKvFile) -> None:
    """`ctx.kv` entries that the store would refuse are refused before anything is written."""
    if user_kv.largest_key > limits.max_key_bytes:
        raise KeyTooLarge(
            f"ctx.kv key of {user_kv.largest_key} bytes",
            user_kv.largest_key,
            limits.max_key_bytes,
        )
    if user_kv.largest_value > limits.max_value_bytes:
        raise ValueTooLarge(
            f"ctx.kv value of {user_kv.largest_value} bytes",
            user_kv.largest_value,
            limits.max_value_bytes,
        )


def _compacted(connection: apsw.Connection, copy: Path) -> Path:
    """The working copy without the free pages its dropped `_pagekv_kv` table left (they would
    go into the store too, holding the entries twice): `VACUUM INTO` a new file, which, unlike
    `VACUUM`, keeps every rowid."""
    compact = copy.with_name("compact.sqlite")
    connection.execute("VACUUM INTO ?", (str(compact),))
    return compact


def _due(connection: apsw.Connection, source: Path) -> float | None:
    """When the actor must run next: its first schedule, or now if its workflow is not over
    (it resumes as soon as a registry's poll sees it)."""
    if due_types(connection) - {"real", "integer"}:
        raise ImportRefused(f"{source}: a schedule of _pagekv_schedule is due at no time")
    due = earliest_due(connection)
    workflow = describe(connection)
    if workflow is not None and workflow["state"] not in FINAL_STATES:
        now = time.time()
        due = now if due is None else min(due, now)
    return due


def _check_quota(store: KvStore, aid: str, prepared: PreparedImport, limits: KvLimits) -> None:
    """Refuse, before anything is written, a database that cannot fit the actor's quota: its
    pages as the deltas of one commit, its `ctx.kv` entries, and what the namespace holds
    already (an old database stays until the commit). The store enforces the exact sum."""
    used = 0
    if not isinstance(store, ListableStore) or aid in store.actor_ids():
        used = store.namespace(aid).used_bytes()
    needed = prepared.pages * FRAME_BYTES + (prepared.user_kv.bytes if prepared.user_kv else 0)
    if used + needed > limits.max_storage_bytes:
        raise StorageQuotaExceeded(
            f"import of {prepared.pages} pages ({needed} bytes) beside {used} bytes stored",
            used + needed,
            limits.max_storage_bytes,
        )


def _swap(database: Database, prepared: PreparedImport) -> None:
    """The working copy's pages into the namespace, in one transaction (one visible step). A
    storage failure is raised as the store's own typed error, a lost takeover as
    `ImportInterrupted`."""
    source = apsw.Connection(str(prepared.path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        copy_pages(database.connection, source)
    except apsw.Error as e:
        cause = database.take_last_kv_error()
        if isinstance(cause, FenceMismatch):
            raise ImportInterrupted(
                f"actor {prepared.name!r} with key {prepared.key!r} was taken over by another "
                "instance (a call woke it) while it was imported: nothing of the import is "
                f"visible ({cause}); stop its callers and import again"
            ) from cause
        if cause is not None:
            raise cause from e
        raise
    finally:
        source.close()


def _swap_user_kv(kv: ActorKv, generation: int, prepared: PreparedImport) -> None:
    """Replace the namespace's `ctx.kv` entries with the prepared ones, fenced by the import's
    generation, read from their file as they are written (one batch in memory at a time); a
    lost takeover is `ImportInterrupted`, which says the database was swapped."""
    end = prefix_end(USER_PREFIX)
    assert end is not None
    try:
        kv.delete_range(USER_PREFIX, end, fence=generation)
        if prepared.user_kv is None:
            return
        reader = apsw.Connection(str(prepared.user_kv.path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = reader.execute("SELECT key, value FROM kv ORDER BY key")
            entries = ((USER_PREFIX + key, value) for key, value in rows)
            for batch in batches(entries, kv.limits):
                kv.write(put=batch, fence=generation)
        finally:
            reader.close()
    except FenceMismatch as e:
        raise ImportInterrupted(
            f"actor {prepared.name!r} with key {prepared.key!r} was taken over by another "
            "instance (a call woke it) after its database was replaced, before its ctx.kv "
            f"entries were: it holds the imported database with the ctx.kv entries it had ({e}); "
            "import again to replace both"
        ) from e


def _drop_new(kv: ActorKv, index: ActorKv, aid: str, generation: int, error: BaseException) -> None:
    """Remove what a failed import of a new actor wrote: its namespace's data and any index
    entry of its generation. A failure of that is noted on the import's own error."""
    try:
        kv.drop(fence=generation)
        forget(index, aid, generation)
    except Exception as cleanup:
        error.add_note(f"cleaning up after the failed import failed too: {cleanup!r}")
