"""What only the PostgreSQL backend has: URLs, schema versions, connection failures, many hosts.

The KV contract itself runs against PostgreSQL in `test_conformance.py` and `test_stateful.py`.
Here the failure cases are made real: connections are killed by the server
(`pg_terminate_backend`), statements time out, and a TCP proxy between the store and the server
cuts the connection at a chosen moment — before a request reaches the server, or after the server
committed it but before its answer arrives. Each must surface as the right error: `KvUnavailable`
when nothing was applied, `KvIndeterminate` when a write may have been.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psycopg
import pytest

from pagekv.kv import (
    KvIndeterminate,
    KvLimits,
    KvUnavailable,
    PostgresStore,
    StorageQuotaExceeded,
    open_kv,
)
from pagekv.kv import postgres as pg
from pagekv.kv.postgres import parse_postgres_url

if TYPE_CHECKING:
    from conftest import PostgresServer


@pytest.fixture
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


@pytest.fixture
def open_pg(server: PostgresServer, tmp_path: Path) -> Iterator[Callable[..., PostgresStore]]:
    """`open_pg(key="main", limits=None, url=None, **options)`: a store in a schema of this test."""
    stores: list[PostgresStore] = []

    def opener(
        key: str = "main", limits: KvLimits | None = None, url: str | None = None, **options: Any
    ) -> PostgresStore:
        store = open_kv(url or server.store_url(f"{tmp_path}/{key}", **options), limits=limits)
        assert isinstance(store, PostgresStore)
        stores.append(store)
        return store

    yield opener
    for store in stores:
        store.close()


def admin(server: PostgresServer) -> psycopg.Connection[Any]:
    return psycopg.connect(server.url, autocommit=True)


# --- URLs ----------------------------------------------------------------------------------


def test_url_options_are_split_from_libpq_parameters() -> None:
    base, options = parse_postgres_url(
        "postgres://u:secret@db.example:6543/app?schema=kv_1&pool_max=4&pool_timeout=1.5"
        "&statement_timeout_ms=250&sslmode=require&connect_timeout=3"
    )
    assert base == "postgresql://u:secret@db.example:6543/app?sslmode=require&connect_timeout=3"
    assert (options.schema, options.pool_max, options.pool_timeout) == ("kv_1", 4, 1.5)
    assert options.statement_timeout_ms == 250
    assert options.libpq == {"sslmode": "require", "connect_timeout": "3"}
    assert parse_postgres_url("postgresql://h/db")[1].schema == "pagekv"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h/db?schema=bad-name",
        "postgresql://h/db?schema=x%22%3B",
        "postgresql://h/db?pool_max=0",
        "postgresql://h/db?pool_min=3&pool_max=2",
        "postgresql://h/db?pool_timeout=0",
        "postgresql://h/db?pool_max=many",
    ],
)
def test_bad_url_options_are_value_errors(url: str) -> None:
    with pytest.raises(ValueError):
        open_kv(url)


def test_both_url_schemes_open_the_same_store(server: PostgresServer, open_pg: Any) -> None:
    url = server.store_url("both-schemes")
    first = open_pg(url=url)
    first.namespace("a").put({b"k": b"v"})
    second = open_pg(url=url.replace("postgresql://", "postgres://", 1))
    assert second.namespace("a").get([b"k"]) == [b"v"]
    assert first.actor_ids() == second.actor_ids() == ["a"]


def test_unreachable_server_is_kv_unavailable_quickly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    started = time.monotonic()
    with pytest.raises(KvUnavailable, match=r"unreachable.*refused"):
        open_kv(f"postgresql://postgres@127.0.0.1:{port}/postgres?pool_timeout=1")
    assert time.monotonic() - started < 5


# --- schema versions -------------------------------------------------------------------------


def test_schema_is_created_on_first_use_and_versioned(server: PostgresServer, open_pg: Any) -> None:
    store = open_pg()
    schema = store.options.schema
    with admin(server) as conn:
        assert conn.execute(f"SELECT version FROM {schema}.schema_version").fetchall() == [
            (pg.SCHEMA_VERSION,)
        ]
    store.namespace("a").put({b"k": b"v"})
    again = open_pg()  # reopening finds the current version and changes nothing
    assert again.namespace("a").get([b"k"]) == [b"v"]


def test_a_newer_schema_is_refused_with_a_clear_error(server: PostgresServer, open_pg: Any) -> None:
    schema = open_pg().options.schema
    with admin(server) as conn:
        conn.execute(f"UPDATE {schema}.schema_version SET version = {pg.SCHEMA_VERSION + 1}")
    with pytest.raises(RuntimeError, match=rf"version {pg.SCHEMA_VERSION + 1}.*Upgrade pagekv"):
        open_pg()


def test_an_older_schema_is_upgraded_in_place(
    server: PostgresServer, open_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = open_pg()
    old.namespace("a").put({b"k": b"kept"})
    gen = old.namespace("a").takeover()
    schema = old.options.schema
    # A hypothetical version 2 that adds a column; the data of version 1 must survive it.
    step = "ALTER TABLE {s}.namespaces ADD COLUMN note text NOT NULL DEFAULT 'v2'"
    monkeypatch.setattr(pg, "_MIGRATIONS", [*pg._MIGRATIONS, step])
    monkeypatch.setattr(pg, "SCHEMA_VERSION", pg.SCHEMA_VERSION + 1)
    upgraded = open_pg()
    ns = upgraded.namespace("a")
    assert ns.get([b"k"]) == [b"kept"]
    assert ns.generation() == gen
    with admin(server) as conn:
        assert conn.execute(f"SELECT version FROM {schema}.schema_version").fetchall() == [
            (pg.SCHEMA_VERSION,)
        ]
        assert conn.execute(f"SELECT DISTINCT note FROM {schema}.namespaces").fetchall() == [
            ("v2",)
        ]


def test_a_tool_that_only_reads_creates_and_upgrades_no_schema(
    server: PostgresServer, open_pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`open_kv(url, create=False)` (`pagekv inspect`, `pagekv ui`): a missing schema is a
    `FileNotFoundError` and stays missing; an older one is refused, not upgraded under the
    servers using it; the current one opens."""
    missing = server.store_url(f"{tmp_path}/never")
    with pytest.raises(FileNotFoundError, match="no pagekv store"):
        open_kv(missing, create=False)
    schema = parse_postgres_url(missing)[1].schema
    with admin(server) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchall()
    assert found == []
    existing = open_pg()
    existing.namespace("a").put({b"k": b"v"})
    url = server.store_url(f"{tmp_path}/main")
    with open_kv(url, create=False) as reader:
        assert reader.namespace("a").get([b"k"]) == [b"v"]
    monkeypatch.setattr(pg, "SCHEMA_VERSION", pg.SCHEMA_VERSION + 1)
    with pytest.raises(FileNotFoundError, match="older than this pagekv's"):
        open_kv(url, create=False)
    with admin(server) as conn:
        version = conn.execute(
            f"SELECT version FROM {existing.options.schema}.schema_version"
        ).fetchall()
    assert version == [(pg.SCHEMA_VERSION - 1,)]


def test_concurrent_first_opens_create_the_schema_once(open_pg: Any) -> None:
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            store = open_pg(key="race")
            store.namespace("shared").write(put={b"k": b"v"})
            with lock:
                stores.append(store)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert stores[0].actor_ids() == ["shared"]


# --- binary keys, ordering, quota on the server ---------------------------------------------


def test_bytea_keys_sort_bytewise_on_the_server(open_pg: Any) -> None:
    ns = open_pg().namespace("a")
    keys = [
        b"\x00",
        b"\x00\x00",
        b"\x7f",
        b"\x80",
        b"\xff",
        b"\xff\x00",
        b"\xff\xff",
        b"a",
        b"a\x00",
    ]
    ns.put({k: k for k in keys})
    assert [k for k, _ in ns.list()] == sorted(keys)
    assert [k for k, _ in ns.list(start=b"a", end=b"\xff\x00")] == [
        b"a",
        b"a\x00",
        b"\x7f",
        b"\x80",
        b"\xff",
    ]


def test_the_longest_keys_and_names_the_indexes_hold_are_stored(open_pg: Any) -> None:
    """The store's bounds are exact: an incompressible key or name of that size is stored (one
    more byte failed the write), and limits past them are refused when the store is opened."""
    rnd = random.Random(11)
    limits = KvLimits(max_key_bytes=pg._MAX_KEY_BYTES, max_name_bytes=pg._MAX_NAME_BYTES)
    store = open_pg(limits=limits)
    key = rnd.randbytes(pg._MAX_KEY_BYTES)
    name = rnd.randbytes(pg._MAX_NAME_BYTES // 2).hex()
    store.namespace(name).put({key: b"v"})
    assert store.namespace(name).get([key]) == [b"v"]
    assert name in store.actor_ids()
    for field, most in (
        ("max_key_bytes", pg._MAX_KEY_BYTES),
        ("max_name_bytes", pg._MAX_NAME_BYTES),
    ):
        with pytest.raises(ValueError, match=field):
            open_pg(limits=replace(limits, **{field: most + 1}))


def test_actor_ids_are_in_code_point_order_whatever_the_collation(
    server: PostgresServer, open_pg: Any
) -> None:
    """In a database whose collation is linguistic ("a" < "B"), the names still sort by code
    point, as every other store sorts them."""
    database = "pagekv_icu_test"
    drop = f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"
    with admin(server) as conn:
        try:
            conn.execute(drop)  # left over by an interrupted run
            conn.execute(
                f"CREATE DATABASE {database} TEMPLATE template0 LOCALE 'C' "
                "LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
            )
        except psycopg.Error as e:  # PostgreSQL < 15, no ICU, or no CREATEDB right
            pytest.skip(f"this server cannot create an ICU database: {e}")
    try:
        url = urlsplit(server.store_url("icu"))._replace(path=f"/{database}").geturl()
        store = open_pg(url=url)
        names = ["B", "a", "_x", "\u00e9", "e", "Z"]
        for name in names:
            store.namespace(name)
        assert store.actor_ids() == sorted(names) == ["B", "Z", "_x", "a", "e", "\u00e9"]
        store.close()
    finally:
        with admin(server) as conn:
            conn.execute(drop)


def test_quota_is_exact_under_concurrent_writers(open_pg: Any) -> None:
    """Many threads race to fill one namespace: the quota holds exactly and usage stays exact."""
    limit = 10_000
    store = open_pg(limits=KvLimits(max_storage_bytes=limit), pool_max=8)
    ns = store.namespace("a")
    accepted: list[int] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(40):
            key = b"w%d-%03d" % (w, i)
            try:
                ns.put({key: b"x" * (100 - len(key))})
            except StorageQuotaExceeded:
                continue
            with lock:
                accepted.append(100)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(accepted) == limit == ns.used_bytes()
    assert sum(len(k) + len(v) for k, v in ns.list()) == limit


# --- connection failures ---------------------------------------------------------------------


def backend_pids(server: PostgresServer, application_name: str) -> list[int]:
    with admin(server) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchall()
    return [r[0] for r in rows]


def terminate(server: PostgresServer, application_name: str) -> int:
    with admin(server) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchall()
    return len(rows)


def test_a_connection_killed_while_idle_is_replaced_without_an_error(
    server: PostgresServer, open_pg: Any
) -> None:
    """The server ends a pooled connection between requests (as a restart does): the next write
    must neither fail as indeterminate nor be lost — the dead connection is noticed unsent."""
    store = open_pg(application_name="pagekv-idle-kill", pool_min=1, pool_max=1)
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"before": b"1"}, fence=gen)
    assert terminate(server, "pagekv-idle-kill") == 1
    time.sleep(0.2)  # let the termination notice arrive
    ns.put({b"after": b"2"}, fence=gen)
    assert ns.list() == [(b"after", b"2"), (b"before", b"1")]


def hold_namespace_lock(server: PostgresServer, schema: str) -> psycopg.Connection[Any]:
    """An open transaction holding every namespace row lock of `schema`: writes there block."""
    conn = psycopg.connect(server.url)
    conn.execute(f"SELECT * FROM {schema}.namespaces FOR UPDATE")
    return conn


def wait_for_lock_waiter(server: PostgresServer, application_name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with admin(server) as conn:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'",
                (application_name,),
            ).fetchall()[0][0]
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the write never blocked on the namespace lock")


def run_in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, errors


def test_connection_lost_mid_statement_is_indeterminate(
    server: PostgresServer, open_pg: Any
) -> None:
    store = open_pg(application_name="pagekv-mid-kill", pool_min=1, pool_max=1)
    ns = store.namespace("a")
    gen = ns.takeover()
    locker = hold_namespace_lock(server, store.options.schema)
    try:
        thread, errors = run_in_thread(lambda: ns.put({b"k": b"v"}, fence=gen))
        wait_for_lock_waiter(server, "pagekv-mid-kill")
        assert terminate(server, "pagekv-mid-kill") == 1
        thread.join(10)
    finally:
        locker.close()
    assert len(errors) == 1 and isinstance(errors[0], KvIndeterminate), errors
    assert "may or may not have been applied" in str(errors[0])
    # The store recovers by itself: the next request gets a fresh connection.
    assert ns.get([b"k"]) == [None]
    ns.put({b"k": b"again"}, fence=gen)
    assert ns.get([b"k"]) == [b"again"]


def test_a_read_on_a_lost_connection_is_unavailable(server: PostgresServer, open_pg: Any) -> None:
    store = open_pg(application_name="pagekv-read-kill", pool_min=1, pool_max=1)
    ns = store.namespace("a")
    locker = psycopg.connect(server.url)
    locker.execute(f"LOCK TABLE {store.options.schema}.entries IN ACCESS EXCLUSIVE MODE")
    try:
        thread, errors = run_in_thread(lambda: ns.get([b"k"]))
        wait_for_lock_waiter(server, "pagekv-read-kill")
        terminate(server, "pagekv-read-kill")
        thread.join(10)
    finally:
        locker.close()
    assert len(errors) == 1 and type(errors[0]) is KvUnavailable, errors
    assert ns.get([b"k"]) == [None]


def test_statement_timeout_is_unavailable_and_applies_nothing(
    server: PostgresServer, open_pg: Any
) -> None:
    store = open_pg(statement_timeout_ms=300)
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"old": b"1"}, fence=gen)
    locker = hold_namespace_lock(server, store.options.schema)
    try:
        with pytest.raises(KvUnavailable, match="57014") as info:
            ns.write(put={b"new": b"x"}, delete=[b"old"], fence=gen)
        assert type(info.value) is KvUnavailable
    finally:
        locker.close()
    assert ns.list() == [(b"old", b"1")]
    assert ns.used_bytes() == 4


class CuttingProxy:
    """A TCP proxy to the server that can cut a connection at a chosen moment.

    `cut_before_next_request()`: the next bytes from the client are dropped and the connection is
    closed — the server never sees the request. `cut_before_next_answer()`: the next request goes
    through, and the server's answer is dropped instead — the server has done the work, the client
    never learns it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode: str | None = None
        self.cuts = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_before_next_request(self) -> None:
        self.mode = "request"

    def cut_before_next_answer(self) -> None:
        self.mode = "answer"

    def _take(self, direction: str) -> bool:
        with self._lock:
            if self.mode == direction:
                self.mode = None
                self.cuts += 1
                return True
            return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            pair = (client, upstream)
            threading.Thread(target=self._pump, args=(client, upstream, "request", pair)).start()
            threading.Thread(target=self._pump, args=(upstream, client, "answer", pair)).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, direction: str, pair: tuple[Any, Any]
    ) -> None:
        try:
            while data := src.recv(65536):
                if self._take(direction):
                    if direction == "answer":
                        time.sleep(0.05)  # the server has committed: its answer follows Sync
                    for s in pair:
                        s.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy(server: PostgresServer) -> Iterator[CuttingProxy]:
    if server.cluster is None:
        pytest.skip("needs the throwaway cluster's port")
    p = CuttingProxy(server.cluster.port)
    yield p
    p.close()


def test_answer_lost_after_commit_is_indeterminate_and_was_applied(
    server: PostgresServer, proxy: CuttingProxy, open_pg: Any
) -> None:
    url = server.store_url("proxied").replace(
        f":{server.cluster.port}/",
        f":{proxy.port}/",  # type: ignore[union-attr]
    )
    ns = open_pg(url=url + "&pool_min=1&pool_max=1").namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"1"}, fence=gen)
    proxy.cut_before_next_answer()
    with pytest.raises(KvIndeterminate):
        ns.put({b"k": b"2"}, fence=gen)
    assert proxy.cuts == 1
    assert ns.get([b"k"]) == [b"2"], "the server committed the write whose answer was lost"


def test_request_that_never_left_is_unavailable_for_reads_and_indeterminate_for_writes(
    server: PostgresServer, proxy: CuttingProxy, open_pg: Any
) -> None:
    """A cut on the way *to* the server looks, from the client, exactly like a cut on the way
    back, so a write must still be reported as indeterminate (never guessed as unapplied); a
    read is simply unavailable. Neither changes anything."""
    url = server.store_url("proxied-2").replace(
        f":{server.cluster.port}/",
        f":{proxy.port}/",  # type: ignore[union-attr]
    )
    ns = open_pg(url=url + "&pool_min=1&pool_max=1").namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"1"}, fence=gen)
    proxy.cut_before_next_request()
    with pytest.raises(KvIndeterminate):
        ns.put({b"k": b"2"}, fence=gen)
    assert ns.get([b"k"]) == [b"1"]  # (the pool has connected again through the proxy)
    proxy.cut_before_next_request()
    with pytest.raises(KvUnavailable) as info:
        ns.get([b"k"])
    assert type(info.value) is KvUnavailable
    assert ns.get([b"k"]) == [b"1"]


# --- takeovers across hosts --------------------------------------------------------------------

_RACER = """
import sys
from pagekv.kv import FenceMismatch, open_kv
store = open_kv(sys.argv[1])
ns = store.namespace("raced")
print("ready", flush=True)
sys.stdin.readline()
gens = [ns.takeover() for _ in range(int(sys.argv[2]))]
print(",".join(map(str, gens)), flush=True)
sys.stdin.readline()
try:
    ns.put({b"writer-" + sys.argv[3].encode(): b"1"}, fence=gens[-1])
    print("live", flush=True)
except FenceMismatch:
    print("fenced", flush=True)
store.close()
"""


def test_two_processes_racing_takeovers_leave_exactly_one_live_writer(
    server: PostgresServer, tmp_path: Path
) -> None:
    """Two OS processes, each with its own pool, take one namespace over 30 times each at the
    same moment; then both write with their latest generation. Exactly one may succeed: the one
    that took over last."""
    url = server.store_url(f"{tmp_path}/race")
    open_kv(url).close()  # create the schema first, so both racers start at once
    rounds = 30
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, url, str(rounds), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:

        def say(line: str) -> None:
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(line + "\n")
                p.stdin.flush()

        def hear() -> list[str]:
            return [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]

        assert hear() == ["ready", "ready"]
        say("go")
        last_gens = [[int(g) for g in line.split(",")] for line in hear()]
        say("write")
        results = hear()
        for p in procs:
            assert p.wait(timeout=30) == 0
    finally:
        for p in procs:
            p.kill()
    gens = sorted(g for mine in last_gens for g in mine)
    assert gens == list(range(gens[0], gens[0] + 2 * rounds)), "generations must be distinct"
    assert sorted(results) == ["fenced", "live"]
    winner = results.index("live")
    assert last_gens[winner][-1] == gens[-1], "the live writer must hold the latest generation"
    with open_kv(url) as store:  # type: ignore[attr-defined]
        ns = store.namespace("raced")
        assert ns.generation() == gens[-1]
        assert ns.list() == [(b"writer-" + b"ab"[winner : winner + 1], b"1")]
