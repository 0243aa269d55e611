"""Export, import and copy attacked: a copy of a namespace that keeps changing (its fallback
from a read-only snapshot), refusals that leave nothing behind, a resume from another source,
hostile import files, export paths from hostile names and keys, copies killed and raced."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from fixture_store import load_fixture
from transfer_defs import fill, order

from pagekv.actor import ActorContext, ActorExists, ActorNotFound, Registry, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE, actor_id, records_of
from pagekv.actor.tables.schema import SCHEMA_VERSION
from pagekv.actor.user_kv import USER_PREFIX
from pagekv.kv import FenceMismatch, MemoryStore, open_kv
from pagekv.transfer import (
    CopyProgress,
    FileShared,
    ImportRefused,
    ManifestFileShared,
    export_actor,
    export_all,
    exporter,
    import_actor,
    import_all,
    store_copy,
)
from pagekv.transfer.checksum import namespace_checksum
from pagekv.transfer.exporter import MANIFEST
from pagekv.transfer.importer import ImportInterrupted
from pagekv.transfer.store_copy import COPY_MARKER, COPY_PREFIX, copy_store
from pagekv.vfs import SnapshotExpired, open_database
from pagekv.vfs.format import base_key

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
_ACCOUNTS = 50


class _Hooked:
    """A store whose namespace `name` runs `hook(*args, **kwargs)` before each call of one of
    its `methods` (fault injection); `fired` counts the calls the hook acted on (it said so by
    returning True)."""

    def __init__(self, inner: MemoryStore, name: str, methods: tuple[str, ...], hook: Any) -> None:
        self.inner, self.name, self.methods, self.hook = inner, name, methods, hook
        self.fired = 0

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def namespace(self, name: str) -> Any:
        kv = self.inner.namespace(name)
        return _HookedKv(kv, self) if name == self.name else kv


class _HookedKv:
    def __init__(self, inner: Any, store: _Hooked) -> None:
        self.inner, self.store = inner, store

    def __getattr__(self, attr: str) -> Any:
        found = getattr(self.inner, attr)
        if attr not in self.store.methods:
            return found

        def hooked(*args: Any, **kwargs: Any) -> Any:
            if self.store.hook(*args, **kwargs):
                self.store.fired += 1
            return found(*args, **kwargs)

        return hooked


def _overtaken(inner: MemoryStore, name: str, committed: threading.Event) -> _Hooked:
    """`name` lets its busy writer commit once more before each `list` the copy makes (a
    writer faster than every read of the copy)."""

    def wait(**_: Any) -> bool:
        committed.clear()
        assert committed.wait(10), "the writer stopped committing"
        return True

    return _Hooked(inner, name, ("list",), wait)


def _once(hook: Any) -> Any:
    """`hook` run at the first call it accepts (it returns True) only."""
    done = []

    def first(*args: Any, **kwargs: Any) -> bool:
        if done or not hook(*args, **kwargs):
            return False
        done.append(True)
        return True

    return first


def _bank(kv: Any) -> None:
    with open_database(kv) as db:
        db.execute("CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER)")
        db.execute("CREATE TABLE moves(id INTEGER PRIMARY KEY, amount INTEGER)")
        with db.connection:
            db.connection.executemany(
                "INSERT INTO accounts VALUES (?, 1000)", [(i,) for i in range(_ACCOUNTS)]
            )


def _moves(kv: Any) -> int:
    """The moves of a copied bank, checked to be one committed state (no money made or lost)."""
    with open_database(kv, read_only=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        total = db.execute("SELECT sum(balance), count(*) FROM accounts").fetchall()
        assert total == [(1000 * _ACCOUNTS, _ACCOUNTS)], "one committed state"
        return int(db.execute("SELECT count(*) FROM moves").fetchall()[0][0])


def _busy(kv: Any, stop: threading.Event, committed: threading.Event) -> Iterator[int]:
    """Moves money between accounts, one commit each, a `ctx.kv` entry after each commit."""
    with open_database(kv) as db:
        i = 0
        while not stop.is_set():
            i += 1
            with db.connection:
                db.execute(
                    "UPDATE accounts SET balance = balance - 7 WHERE id = ?", (i % _ACCOUNTS,)
                )
                db.execute(
                    "UPDATE accounts SET balance = balance + 7 WHERE id = ?", ((i + 1) % _ACCOUNTS,)
                )
                db.execute("INSERT INTO moves(amount) VALUES (7)")
            kv.put([(USER_PREFIX + b"moves", b"%d" % i)], fence=db.generation)
            committed.set()
            yield i


def test_a_namespace_that_keeps_changing_is_copied_from_a_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above the one-`list` sizes (set down to 0 here) a namespace is copied entry by entry; a
    writer that commits during each of the three copies sends it to the snapshot copy, which
    holds one committed state of the database, and the copy verifies."""
    monkeypatch.setattr(store_copy, "FROZEN_COPY_BYTES", 0)
    monkeypatch.setattr(store_copy, "FROZEN_MAX_BYTES", 0)
    snapshot_copies = []
    real = store_copy._snapshot_copy

    def spied(source: Any, destination: Any) -> tuple[int, int, str]:
        snapshot_copies.append(source)
        return real(source, destination)

    monkeypatch.setattr(store_copy, "_snapshot_copy", spied)
    inner = MemoryStore()
    kv = inner.namespace("bank/main")
    _bank(kv)
    committed, stop = threading.Event(), threading.Event()
    source = _overtaken(inner, "bank/main", committed)
    commits = [0]

    def write() -> None:
        for commits[0] in _busy(kv, stop, committed):
            pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        target = MemoryStore()
        result = copy_store(source, target)  # type: ignore[arg-type]
    finally:
        stop.set()
        writer.join()
    assert source.fired >= store_copy.RAW_ATTEMPTS, "the writer overtook every raw copy"
    assert len(snapshot_copies) == 1
    assert result.snapshots == ["bank/main"] and result.changed == ["bank/main"]
    assert result.verified == 1
    copied = target.namespace("bank/main")
    moves = _moves(copied)
    assert 0 < moves < commits[0], "a state from while the writer ran"
    user = copied.get([USER_PREFIX + b"moves"])[0]
    assert user is not None and moves <= int(user) <= commits[0]
    entries = target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX)
    assert len(entries) == 1, "kept for the next run: the source changed"


def test_a_big_namespace_a_writer_keeps_rewriting_is_copied_from_one_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """6 MiB of blobs, then the accounts a writer rewrites in place: a read-only snapshot of it
    is overtaken before the backup reaches them (every read lets one more commit in), so the
    namespace that kept changing is copied from one `list` (up to `FROZEN_MAX_BYTES`)."""
    monkeypatch.setattr(store_copy, "FROZEN_COPY_BYTES", 0)
    inner = MemoryStore()
    kv = inner.namespace("bank/main")
    with open_database(kv) as db:
        db.execute("CREATE TABLE blobs(id INTEGER PRIMARY KEY, b BLOB)")
        with db.connection:
            for _ in range(1500):
                db.execute("INSERT INTO blobs(b) VALUES (randomblob(4000))")
    _bank(kv)
    with open_database(kv) as db:
        db.compact()  # a compacted head: the writer's commits rewrite base pages in place
    committed, stop = threading.Event(), threading.Event()
    source = _overtaken(inner, "bank/main", committed)
    writer = threading.Thread(target=lambda: [None for _ in _busy(kv, stop, committed)])
    writer.start()
    target = MemoryStore()
    try:
        result = copy_store(source, target)  # type: ignore[arg-type]
        monkeypatch.setattr(store_copy, "FROZEN_MAX_BYTES", 0)  # too big to read so
        with pytest.raises(SnapshotExpired) as expired:
            copy_store(source, MemoryStore())  # type: ignore[arg-type]
    finally:
        stop.set()
        writer.join()
    assert result.snapshots == ["bank/main"] and result.verified == 1
    assert _moves(target.namespace("bank/main")) > 0
    assert expired.value.__notes__ == ["while copying namespace 'bank/main'"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagekv", *args], cwd=ROOT, capture_output=True, text=True
    )


async def test_a_refused_copy_leaves_no_destination_behind(tmp_path: Path) -> None:
    source_url = (tmp_path / "src").resolve().as_uri()
    target = tmp_path / "dst"
    with open_kv(source_url) as source:
        async with Registry([order], kv=source).run() as client:
            await fill(client, "a", items=1)
            refused = await anyio.to_thread.run_sync(
                lambda: _cli("copy", "--from", source_url, "--to", target.resolve().as_uri())
            )
    assert refused.returncode == 1 and "being served by 1 registry" in refused.stderr
    assert not target.exists(), "the destination was never opened"


def test_a_copy_that_fails_names_the_namespace(tmp_path: Path) -> None:
    source_url = (tmp_path / "src").resolve().as_uri()
    with open_kv(source_url) as source:
        for name in ("good/a", "bad/b"):
            with open_database(source.namespace(name)) as db:
                db.execute("CREATE TABLE t(v)")
                db.execute("INSERT INTO t VALUES ('x')")
                db.compact()
        bad = source.namespace("bad/b")
        (key, value), *_ = bad.list(prefix=base_key(1)[:-4])
        bad.put([(key, value[:-1] + bytes([value[-1] ^ 1]))])  # a bit of page 1 flipped
    failed = _cli("copy", "--from", source_url, "--to", (tmp_path / "dst").resolve().as_uri())
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.strip().endswith("(while copying namespace 'bad/b')"), failed.stderr


def _interrupted(inner: MemoryStore, at: str) -> _Hooked:
    """A destination whose registry namespace fails the write of the progress entry of `at`
    (a copy interrupted there)."""
    key = COPY_PREFIX + at.encode()

    def interrupt(*args: Any, **kwargs: Any) -> bool:
        if key in dict(kwargs.get("put", args[0] if args else ())):
            raise KeyboardInterrupt
        return False

    return _Hooked(inner, REGISTRY_NAMESPACE, ("write", "put"), interrupt)


def _orders(keys: list[str]) -> MemoryStore:
    store = MemoryStore()
    _populate_orders(store, keys)
    return store


def _populate_orders(store: Any, keys: list[str]) -> None:
    async def make() -> None:
        async with Registry([order], kv=store).run() as client:
            for key in keys:
                await fill(client, key, items=1)

    anyio.run(make)


def _content(store: Any) -> dict[str, tuple[str, list[tuple[str, float]]]]:
    """Each namespace that holds anything: its checksum and its records in the index."""
    index = store.namespace(REGISTRY_NAMESPACE)
    names = [n for n in store.actor_ids() if n != REGISTRY_NAMESPACE]
    return {
        n: (
            namespace_checksum(store.namespace(n)),
            [(r.key, r.created) for r in records_of(index, n)],
        )
        for n in names
        if store.namespace(n).used_bytes() > 0 or records_of(index, n)
    }


def test_a_copy_resumed_from_another_source_ends_a_copy_of_that_source() -> None:
    """The first source's copy is interrupted; a resume from a second one (the same actors made
    by the same calls: the same generations and head records, other contents, one actor fewer)
    copies again each namespace whose content differs and removes the one it lacks."""
    first, second = _orders(["a", "b", "only-first"]), _orders(["a", "b"])
    for n in ("order/a", "order/b"):
        assert (
            store_copy._fingerprint(first.namespace(n))[:2]
            == store_copy._fingerprint(second.namespace(n))[:2]
        ), "what the old resume compared"
    target = MemoryStore()
    with pytest.raises(KeyboardInterrupt):
        copy_store(first, _interrupted(target, "order/only-first"), threads=1)  # type: ignore[arg-type]
    assert COPY_PREFIX + b"order/b" in dict(target.namespace(REGISTRY_NAMESPACE).list())
    result = copy_store(second, target)
    assert (result.copied, result.skipped, result.verified) == (2, 0, 2)
    assert result.removed == ["order/only-first"]
    assert _content(target) == _content(second)


def test_a_store_without_a_registry_is_copied_and_resumed() -> None:
    source = MemoryStore()
    for name in ("raw/a", "raw/b"):
        with open_database(source.namespace(name)) as db:
            db.execute("CREATE TABLE t(v)")
            db.execute("INSERT INTO t VALUES (?)", (name,))
    target = MemoryStore()
    with pytest.raises(KeyboardInterrupt):
        copy_store(source, _interrupted(target, "raw/b"), threads=1)  # type: ignore[arg-type]
    result = copy_store(source, target)
    assert (result.copied, result.skipped, result.removed) == (1, 1, [])
    assert _content(target) == _content(source)


notes = actor("notes")


@notes.action
async def note(ctx: ActorContext, text: str) -> None:
    await ctx.kv.put({b"note": text.encode()})  # no commit of its database


async def test_a_live_copy_reports_an_actor_that_wrote_only_ctx_kv_after_its_copy() -> None:
    source = MemoryStore()
    async with Registry([notes], kv=source).run() as client:
        handle = client.get_or_create("notes", "n")
        await handle.note("before")
        wrote = []
        token = anyio.lowlevel.current_token()

        def progress(p: CopyProgress) -> None:  # on a thread of the copy's
            if p.phase == "copy" and p.done == p.total:
                anyio.from_thread.run(handle.note, "after", token=token)
                wrote.append(p)

        target = MemoryStore()
        result = await anyio.to_thread.run_sync(
            lambda: copy_store(source, target, allow_live=True, progress=progress)
        )
    assert wrote and result.changed == ["notes/n"] and result.verified == 1
    copied = target.namespace("notes/n").get([USER_PREFIX + b"note"])
    assert copied == [b"before"], "the state it was copied in"


def _created_first(inner: MemoryStore, aid: str) -> _Hooked:
    """A registry creates actor `aid`, and serves a call of it, just before the first takeover
    of its namespace (a server that creates the actor an import is about to create, between
    the import's look at the index and its takeover)."""

    def create() -> bool:
        async def serve() -> None:
            async with Registry([order], kv=inner).run() as client:
                await client.get_or_create("order", "race").add("acknowledged")

        anyio.run(serve)
        return True

    return _Hooked(inner, aid, ("takeover",), _once(create))


def test_an_import_that_loses_the_race_to_create_the_actor_leaves_it_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite"
    export_actor(_orders(["src"]), "order", "src", path)
    inner = MemoryStore()
    store = _created_first(inner, actor_id("order", "race"))
    with pytest.raises(ActorExists, match="created meanwhile"):
        import_actor(store, "order", "race", path)  # type: ignore[arg-type]
    assert store.fired == 1

    async def view() -> dict[str, Any]:
        async with Registry([order], kv=inner).run() as client:
            return await client.get("order", "race").view()  # type: ignore[no-any-return]

    assert anyio.run(view)["items"] == ["acknowledged"], "the server's actor, as it made it"


def _destroyed_first(inner: MemoryStore, aid: str) -> _Hooked:
    """A registry destroys actor `aid` at the first look at its namespace's size (between an
    export's look at the index and its read)."""

    def destroy() -> bool:
        async def serve() -> None:
            async with Registry([order], kv=inner).run() as client:
                await client.registry.destroy(*aid.split("/"))

        anyio.run(serve)
        return True

    return _Hooked(inner, aid, ("used_bytes",), _once(destroy))


def test_an_actor_destroyed_while_it_is_exported_is_not_found(tmp_path: Path) -> None:
    store = _destroyed_first(_orders(["gone"]), actor_id("order", "gone"))
    path = tmp_path / "gone.sqlite"
    with pytest.raises(ActorNotFound, match="destroyed while it was exported"):
        export_actor(store, "order", "gone", path)  # type: ignore[arg-type]
    assert store.fired == 1 and list(tmp_path.iterdir()) == [], "no file, no temporary file"
    store = _destroyed_first(_orders(["gone", "kept"]), actor_id("order", "gone"))
    exported = export_all(store, tmp_path / "all")  # type: ignore[arg-type]
    assert [e.actor.key for e in exported] == ["kept"]
    manifest = json.loads((tmp_path / "all" / MANIFEST).read_text())
    assert [m["key"] for m in manifest] == ["kept"]
    assert sorted(p.name for p in (tmp_path / "all" / "order").iterdir()) == ["kept.sqlite"]


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        (
            "CREATE TRIGGER t AFTER INSERT ON _pagekv_state BEGIN "
            "INSERT OR REPLACE INTO _pagekv_schedule VALUES ('x', 0, 'add', x'f6', NULL, 0); END",
            "trigger 't' on _pagekv_state",
        ),
        ("CREATE TRIGGER t AFTER INSERT ON _PAGEKV_QUEUE BEGIN SELECT 1; END", "trigger 't'"),
        (
            "ALTER TABLE _pagekv_state RENAME TO old_state; "
            "CREATE VIEW _pagekv_state AS SELECT * FROM old_state",
            "view '_pagekv_state'",
        ),
        ("CREATE TABLE _pagekv_extra(v)", "table '_pagekv_extra'"),
        ("CREATE INDEX lines_on_state ON _pagekv_state(data)", "index 'lines_on_state'"),
        ("DROP TABLE _pagekv_state; CREATE TABLE _pagekv_state(id, data)", "'_pagekv_state'"),
        ("CREATE TRIGGER t AFTER INSERT ON _pagekv_kv BEGIN SELECT 1; END", "trigger 't'"),
    ],
    ids=["trigger", "trigger-upper-case", "view", "table", "index", "columns", "trigger-kv"],
)
def test_internal_tables_the_runtime_did_not_make_are_refused(
    tmp_path: Path, sql: str, why: str
) -> None:
    """The runtime never lets an actor's SQL create anything on its `_pagekv_` tables: a
    trigger there would run the file's SQL inside the runtime's own writes (and may write them),
    a view or a changed table in the place of one breaks them."""
    path = tmp_path / "o.sqlite"
    export_actor(_orders(["src"]), "order", "src", path)
    with sqlite3.connect(path) as db:
        db.executescript(sql)
    store = MemoryStore()
    with pytest.raises(ImportRefused, match=re.escape(why)):
        import_actor(store, "order", "x", path)
    assert store.actor_ids() == []


def test_a_plain_file_with_a_table_named_like_an_internal_one_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plain.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE _Pagekv_Schedule(v)")
        db.execute("CREATE TABLE t(v)")
    store = MemoryStore()
    with pytest.raises(ImportRefused, match="table '_Pagekv_Schedule'"):
        import_actor(store, "plain", "x", path)
    assert store.actor_ids() == []


def test_files_that_are_no_regular_sqlite_file_are_refused_clearly(tmp_path: Path) -> None:
    store = MemoryStore()
    (tmp_path / "zero.sqlite").write_bytes(b"")
    (tmp_path / "dev-zero.sqlite").symlink_to("/dev/zero")
    (tmp_path / "dir.sqlite").mkdir()
    cases = {
        "zero.sqlite": "is not a SQLite database",
        "dev-zero.sqlite": "is not a regular file",
        "dir.sqlite": "is not a regular file",
        "missing.sqlite": "no such file",
    }
    for name, why in cases.items():
        with pytest.raises(ImportRefused, match=why):
            import_actor(store, "plain", "x", tmp_path / name)
    assert store.actor_ids() == []


@pytest.mark.parametrize(("version", "name"), [(1, "notes"), (2, "orders")])
def test_an_actor_of_every_released_schema_exports_and_imports(
    tmp_path: Path, version: int, name: str
) -> None:
    """Made by the released runtimes (`fixtures/`): their internal tables pass the check."""
    path = tmp_path / "old.sqlite"
    store = load_fixture(version)
    for _ in range(10):  # the fixture's entries, not its generation: back above their stamps
        store.namespace(f"{name}/fixture").takeover()
    export_actor(store, name, "fixture", path)
    imported = import_actor(MemoryStore(), name, "fixture", path)
    assert imported.converted == (f"internal schema {version} -> {SCHEMA_VERSION}",)


_ROWS = 2000
_WRITER = f"""
import random, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA synchronous = OFF")
print("ready", flush=True)
while True:
    db.execute("BEGIN IMMEDIATE")
    for account, amount in ((random.randrange({_ROWS}), -7), (random.randrange({_ROWS}), 7)):
        db.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, account))
    db.execute("COMMIT")
"""


def _accounts(path: Path, mode: str) -> None:
    """`_ROWS` accounts of 1000 on ~500 pages: a transfer mostly writes two far apart."""
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA journal_mode = {mode}")
        db.execute("CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER, pad BLOB)")
        db.executemany(
            "INSERT INTO accounts VALUES (?, 1000, randomblob(900))", [(i,) for i in range(_ROWS)]
        )


def _imported_total(store: MemoryStore, key: str) -> tuple[int, int]:
    with open_database(store.namespace(actor_id("plain", key)), read_only=True) as db:
        return tuple(db.execute("SELECT sum(balance), count(*) FROM accounts").fetchall()[0])


@pytest.mark.parametrize("mode", ["delete", "wal"])
def test_a_file_another_process_writes_is_imported_as_one_committed_state(
    tmp_path: Path, mode: str
) -> None:
    """A process commits transfers to the file all through the imports: each import holds one
    committed state of it (a copy of its bytes tore between commits, and its journal could
    vanish between a look and a copy)."""
    path = tmp_path / "live.sqlite"
    _accounts(path, mode)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        store = MemoryStore()
        totals = []
        for n in range(8):
            import_actor(store, "plain", f"k{n}", path)
            totals.append(_imported_total(store, f"k{n}"))
        assert writer.poll() is None, "the writer ran all through"
    finally:
        writer.kill()
        writer.wait()
    assert totals == [(1000 * _ROWS, _ROWS)] * 8


def test_a_file_whose_writer_died_mid_commit_is_imported_rolled_back(tmp_path: Path) -> None:
    """A hot journal (SIGKILLed mid-transaction, its pages already in the file): the import
    holds the state before that transaction, and the user's files are left as they were."""
    path = tmp_path / "hot.sqlite"
    _accounts(path, "delete")
    script = (
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size = 10')\n"  # pages spill into the file before the commit
        "db.execute('BEGIN')\n"
        "db.execute('UPDATE accounts SET balance = 0, pad = randomblob(900)')\n"
        "print('written', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "written\n"
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    journal = Path(f"{path}-journal")
    before = (path.read_bytes(), journal.read_bytes())
    store = MemoryStore()
    import_actor(store, "plain", "hot", path)
    assert _imported_total(store, "hot") == (1000 * _ROWS, _ROWS)
    assert (path.read_bytes(), journal.read_bytes()) == before, "only read"


manifest_named = actor("actors.json")


@manifest_named.action
async def touch(ctx: ActorContext) -> None:
    await ctx.kv.put({b"k": b"v"})


_HOSTILE_KEYS = [
    "../../outside",
    "a/b/../../c",
    "..",
    ".",
    "",
    ".hidden",
    "ünïcødé/名前",
    "%2E%2E%2F",
    "back\\slash",
    "x" * 600,
    "x" * 600 + "y",
]


async def test_export_all_writes_only_inside_its_directory(tmp_path: Path) -> None:
    """Names and keys that look like paths, hidden files, encodings, the manifest's name, or
    are long enough to be cut: each actor gets a file of its own inside the directory."""
    store = MemoryStore()
    async with Registry([manifest_named], kv=store).run() as client:
        for key in _HOSTILE_KEYS:
            await client.get_or_create("actors.json", key).touch()
    root = tmp_path / "out" / "all"
    exported = await anyio.to_thread.run_sync(lambda: export_all(store, root))
    files = [p.resolve() for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.is_relative_to(root.resolve()) for p in files), files
    assert sorted(e.actor.key for e in exported) == sorted(_HOSTILE_KEYS)
    assert len({e.path.resolve() for e in exported}) == len(_HOSTILE_KEYS), "one file each"
    manifest = json.loads((root / MANIFEST).read_text())
    assert sorted(m["key"] for m in manifest) == sorted(_HOSTILE_KEYS)
    for entry in manifest:
        target = MemoryStore()
        import_actor(target, entry["name"], entry["key"], root / entry["file"])
        kv = target.namespace(actor_id("actors.json", entry["key"]))
        assert kv.get([USER_PREFIX + b"k"]) == [b"v"]


@manifest_named.action
async def mark(ctx: ActorContext, value: str) -> None:
    await ctx.kv.put({b"k": value.encode()})


async def test_a_key_that_reads_like_a_cut_file_name_gets_a_file_of_its_own(
    tmp_path: Path,
) -> None:
    """A long key is cut to its first characters, `~` and a digest; a second actor whose key
    is that cut text got the same file (`~` was not encoded), and `import --all` gave it the
    first one's data. Each gets its own file now, and each its own data back."""
    long = "x" * 600
    store = MemoryStore()
    async with Registry([manifest_named], kv=store).run() as client:
        await client.get_or_create("actors.json", long).mark("long")
        cut = exporter.file_part(long)
        assert "~" in cut and len(cut) < len(long)
        await client.get_or_create("actors.json", cut).mark("cut")
        await client.get_or_create("actors.json", "a~b").mark("tilde")
    exported = await anyio.to_thread.run_sync(lambda: export_all(store, tmp_path / "all"))
    assert len({e.path for e in exported}) == 3, [e.path.name for e in exported]
    manifest = json.loads((tmp_path / "all" / MANIFEST).read_text())
    assert len({m["file"] for m in manifest}) == 3
    assert "~" not in exporter.file_part("a~b")
    target = MemoryStore()
    import_all(target, tmp_path / "all")
    for key, value in [(long, b"long"), (cut, b"cut"), ("a~b", b"tilde")]:
        kv = target.namespace(actor_id("actors.json", key))
        assert kv.get([USER_PREFIX + b"k"]) == [value], key


async def test_two_actors_named_to_one_file_are_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name collision (a digest collision, or a bug) is `FileShared` before the first file
    is written; a manifest that lists one file for two actors (such as the old export wrote)
    is `ManifestFileShared`, and nothing is imported, from Python or the command."""
    store = MemoryStore()
    async with Registry([manifest_named], kv=store).run() as client:
        for key in ("one", "two"):
            await client.get_or_create("actors.json", key).mark(key)
    monkeypatch.setattr(exporter, "file_part", lambda text: "same")
    with pytest.raises(
        FileShared, match=r"'actors.json/one' and 'actors.json/two' .*/same/same\.sqlite"
    ):
        export_all(store, tmp_path / "refused")
    assert not (tmp_path / "refused").exists(), "nothing written"
    monkeypatch.undo()

    root = tmp_path / "all"
    entries = export_all(store, root)
    shared = [
        {"name": e.actor.name, "key": e.actor.key, "file": str(entries[0].path.relative_to(root))}
        for e in entries
    ]
    (root / MANIFEST).write_text(json.dumps(shared))
    target = MemoryStore()
    with pytest.raises(ManifestFileShared, match=r"entries 0 and 1 name one file"):
        import_all(target, root)
    assert target.actor_ids() == [], "nothing imported"
    url = (tmp_path / "store").resolve().as_uri()
    refused = _cli("import", "--kv", url, "--all", str(root))
    assert refused.returncode == 1 and "name one file" in refused.stderr, refused.stderr
    assert not (tmp_path / "store").exists(), "refused before the store was made"


def _taken_over_at(inner: MemoryStore, aid: str, method: str, when: Any) -> _Hooked:
    """Another instance takes actor `aid` over at the first call of `method` on its namespace
    that `when` accepts (a call wakes the actor elsewhere while an import writes it)."""
    kv = inner.namespace(aid)

    def take(*args: Any, **kwargs: Any) -> bool:
        if not when(*args, **kwargs):
            return False
        kv.takeover()
        return True

    return _Hooked(inner, aid, (method,), _once(take))


def _big_file(tmp_path: Path) -> Path:
    path = tmp_path / "big.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE big(b)")
        db.executemany("INSERT INTO big VALUES (randomblob(4000))", [()] * 1500)
    return path


def test_an_import_whose_actor_is_taken_over_while_it_writes_fails_clearly(
    tmp_path: Path,
) -> None:
    """Another instance takes the namespace over while the import stages its pages (6 MiB: the
    slow path): the import is refused, one typed error that says so, and nothing is left."""
    inner = MemoryStore()
    aid = actor_id("plain", "x")
    store = _taken_over_at(inner, aid, "write", lambda **kw: bool(kw.get("put")))
    with pytest.raises(ImportInterrupted, match=r"taken over .* while it was imported") as caught:
        import_actor(store, "plain", "x", _big_file(tmp_path))  # type: ignore[arg-type]
    assert store.fired == 1 and isinstance(caught.value.__cause__, FenceMismatch)
    assert "nothing of the import is visible" in str(caught.value)
    assert not getattr(caught.value, "__notes__", None), "no drop of another's namespace tried"
    assert records_of(inner.namespace(REGISTRY_NAMESPACE), aid) == []


def test_a_replace_whose_actor_wakes_between_its_database_and_its_ctx_kv_says_so(
    tmp_path: Path,
) -> None:
    """The one window --replace has: a call wakes the actor after the database's swap, before
    its `ctx.kv` entries'. The import fails saying which half it swapped."""
    path = tmp_path / "o.sqlite"
    export_actor(_orders(["src"]), "order", "src", path)
    inner = _orders(["live"])
    aid = actor_id("order", "live")
    store = _taken_over_at(
        inner, aid, "delete_range", lambda start, end, **kw: start == USER_PREFIX
    )
    with pytest.raises(ImportInterrupted, match="after its database was replaced") as caught:
        import_actor(store, "order", "live", path, replace=True)  # type: ignore[arg-type]
    assert store.fired == 1 and isinstance(caught.value.__cause__, FenceMismatch)
    with open_database(inner.namespace(aid), read_only=True) as db:
        assert db.execute("SELECT item FROM lines").fetchall() == [("item-0",)]


def test_a_copy_into_postgres_killed_again_and_again_ends_verified(
    tmp_path: Path, postgres_server: Any
) -> None:
    """`pagekv copy` (2 threads) into a real PostgreSQL, SIGKILLed as soon as it marked the
    destination, then after 5 and after 20 namespaces, each time resumed by a new process:
    the last run verifies every namespace, and the destination equals the source."""
    source_url = (tmp_path / "src").resolve().as_uri()
    keys = [f"k-{i:02}" for i in range(40)]
    with open_kv(source_url) as source:
        _populate_orders(source, keys)
        expected = _content(source)
    target_url = postgres_server.store_url(str(tmp_path / "pg"))
    command = [sys.executable, "-m", "pagekv", "copy", "--from", source_url, "--to", target_url]
    killed_at = []
    for done in (0, 5, 20):
        child = subprocess.Popen([*command, "--threads", "2"], cwd=ROOT, stderr=subprocess.PIPE)
        try:
            with open_kv(target_url) as target:
                index = target.namespace(REGISTRY_NAMESPACE)
                deadline = time.monotonic() + 60
                while True:
                    assert child.poll() is None, "the copy ended before the kill"
                    assert time.monotonic() < deadline, "the copy did not get there in 60 s"
                    marked = index.get([COPY_MARKER])[0] is not None
                    copied = len(index.list(prefix=COPY_PREFIX))
                    if marked and copied >= done:
                        break
                    time.sleep(0.002)
                child.send_signal(signal.SIGKILL)
                assert child.wait() == -signal.SIGKILL
                killed_at.append(len(index.list(prefix=COPY_PREFIX)))
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert killed_at[0] < killed_at[-1] < len(keys), killed_at
    last = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert last.returncode == 0, last.stderr
    assert f"{len(keys)} verified" in last.stdout
    with open_kv(target_url) as target:
        assert _content(target) == expected
        index = target.namespace(REGISTRY_NAMESPACE)
        assert index.get([COPY_MARKER]) == [None] and index.list(prefix=COPY_PREFIX) == []


def test_a_refused_import_makes_no_store(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all")
    store = tmp_path / "new-store"
    refused = _cli("import", "--kv", store.resolve().as_uri(), "plain/x", str(junk))
    assert refused.returncode == 1 and "is not a SQLite database" in refused.stderr
    assert not store.exists(), "no store made for a file it refused"
    good = tmp_path / "good.sqlite"
    with sqlite3.connect(good) as db:
        db.execute("CREATE TABLE t(v)")
    imported = _cli("import", "--kv", store.resolve().as_uri(), "plain/x", str(good))
    assert imported.returncode == 0, imported.stderr
    assert store.is_dir()


def test_a_second_copy_into_a_store_a_running_copy_fills_is_refused(tmp_path: Path) -> None:
    """Two copies into one store would take each other's namespaces over and leave index
    entries of both: the second is refused while the first runs, and resumes it once the
    first is gone (SIGKILLed here)."""
    source_url = (tmp_path / "src").resolve().as_uri()
    target_url = (tmp_path / "dst").resolve().as_uri()
    with open_kv(source_url) as source:
        _populate_orders(source, [f"k-{i:02}" for i in range(20)])
        expected = _content(source)
    slow = f"{target_url}?flush_delay_ms=25"  # it outlasts the second copy on a loaded machine
    command = [sys.executable, "-m", "pagekv", "copy", "--from", source_url, "--to"]
    first = subprocess.Popen([*command, slow, "--threads", "1"], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "dst").exists() or not _copied(target_url):
            assert first.poll() is None and time.monotonic() < deadline, "it copied nothing"
            time.sleep(0.01)
        second = subprocess.run([*command, target_url], cwd=ROOT, capture_output=True, text=True)
        assert first.poll() is None, "the first ran all through the second"
        assert second.returncode == 1, second.stderr
        assert f"another copy into this store is running (pid {first.pid}" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = subprocess.run([*command, target_url], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    with open_kv(target_url) as target:
        assert _content(target) == expected


def _copied(url: str) -> int:
    with open_kv(url) as target:
        return len(target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX))
