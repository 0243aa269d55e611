"""The VFS on a real PostgreSQL server: round trips, two hosts, and a server that dies.

The rest of the VFS suite (workloads, the fault matrix) already runs on `postgresql://` through
the `ns` / `new_ns` fixtures; these tests need things only a real server has: the wire protocol
(counted with libpq's trace), several OS processes sharing one store, and a server process that
can be killed and restarted.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import apsw
import pytest
from psycopg import pq

from pagekv.kv import (
    CountingKv,
    FenceMismatch,
    KvIndeterminate,
    KvUnavailable,
    PostgresStore,
    open_kv,
)
from pagekv.kv.pg_cluster import TempCluster, find_pg_bin
from pagekv.vfs import Database, open_database

if TYPE_CHECKING:
    from conftest import PostgresServer


@pytest.fixture
def pg_store(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[PostgresStore]:
    """A store with exactly one connection, so that tracing it sees every request."""
    store = open_kv(postgres_server.store_url(str(tmp_path), pool_min=1, pool_max=1))
    assert isinstance(store, PostgresStore)
    yield store
    store.close()


@contextmanager
def trace_protocol(store: PostgresStore, path: Path) -> Iterator[None]:
    """Log every protocol message of the store's (single) connection to `path` (libpq PQtrace)."""
    with open(path, "w") as handle:
        conn = store._pool.getconn()
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        store._pool.putconn(conn)
        try:
            yield
        finally:
            conn = store._pool.getconn()
            conn.pgconn.untrace()  # flushes libpq's buffered trace stream
            store._pool.putconn(conn)


def count_messages(path: Path) -> dict[str, int]:
    """Messages by direction and type, e.g. `{"F Sync": 3, "B ReadyForQuery": 3}`."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 3:
            key = f"{fields[0]} {fields[2].split(' ')[0]}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_one_small_commit_is_one_server_round_trip(pg_store: PostgresStore, tmp_path: Path) -> None:
    """Counted on the wire: per one-row commit, one `Sync` sent and one `ReadyForQuery` back —
    no BEGIN/COMMIT, no extra read. (The fence check, quota and batch are one statement.)"""
    counting = CountingKv(pg_store.namespace("actor"))
    with open_database(counting) as db:
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        for i in range(10):  # warm up: past psycopg's prepare threshold, pages cached
            db.execute("INSERT INTO t(v) VALUES (?)", (f"warm-{i}",))
        trace_path = tmp_path / "trace.txt"
        counting.reset()
        commits = 25
        with trace_protocol(pg_store, trace_path):
            for i in range(commits):
                db.execute("INSERT INTO t(v) VALUES (?)", (f"row-{i}",))
        counts = count_messages(trace_path)
    assert counting.stats.round_trips == {"write": commits}
    assert counts.get("F Sync") == commits, counts
    assert counts.get("B ReadyForQuery") == commits, counts
    assert counts.get("F Query", 0) == 0, counts  # no simple-protocol BEGIN/COMMIT
    assert counts.get("F Execute") == commits, counts


# --- two hosts ---------------------------------------------------------------------------------

_HOST = r"""
import sys, traceback
import apsw
from pagekv.kv import open_kv
from pagekv.vfs import open_database

store = open_kv(sys.argv[1])  # this process's own connection pool
ns = store.namespace("actor")
db = None
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "open":
            if db is not None:
                db.close()
            db = open_database(ns)
            db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, host TEXT)")
            reply = f"opened {db.generation}"
        elif cmd == "commit":
            try:
                db.execute("INSERT INTO t(id, host) VALUES (?, ?)", (int(arg), sys.argv[2]))
                reply = "ok"
            except apsw.Error:
                err = db.take_last_kv_error()
                reply = f"failed {type(err).__name__} dead={db.is_dead}"
        elif cmd == "quit":
            break
        else:
            reply = f"unknown {cmd}"
    except Exception:
        reply = "error " + traceback.format_exc().replace("\n", " | ")
    print(reply, flush=True)
if db is not None:
    db.close()
store.close()
"""


class Host:
    """A separate OS process serving the actor through its own store and connection pool."""

    def __init__(self, url: str, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOST, url, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        assert not reply.startswith(("error", "unknown")), f"{self.name}: {reply}"
        return reply

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.ask("quit")
            self.proc.wait(timeout=30)
        finally:
            self.proc.kill()


def check_integrity(db: Database) -> None:
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_two_processes_alternate_takeovers_and_the_stale_one_is_fenced(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Two hosts take turns owning one actor. Each turn: the new owner opens the database (a
    takeover) and commits rows; then the previous owner — still holding its now-stale database —
    tries to commit: that commit must fail as fenced, kill its database, and never land."""
    url = postgres_server.store_url(str(tmp_path / "hosts"))
    hosts = [Host(url, "a"), Host(url, "b")]
    acknowledged: dict[int, str] = {}
    refused: list[int] = []
    next_id = 1
    generations: list[int] = []
    try:
        for turn in range(6):
            owner, stale = hosts[turn % 2], hosts[(turn + 1) % 2]
            generations.append(int(owner.ask("open").split()[1]))
            for _ in range(5):
                assert owner.ask(f"commit {next_id}") == "ok"
                acknowledged[next_id] = owner.name
                next_id += 1
            if turn > 0:
                reply = stale.ask(f"commit {next_id}")
                assert reply == "failed FenceMismatch dead=True", reply
                refused.append(next_id)
                next_id += 1
                # A dead database stays dead: no later call reaches the KV or succeeds.
                assert stale.ask(f"commit {next_id}").startswith("failed")
                refused.append(next_id)
                next_id += 1
        assert generations == sorted(generations) and len(set(generations)) == len(generations)
    finally:
        for host in hosts:
            host.stop()
    store = open_kv(url)
    try:
        with open_database(store.namespace("actor")) as db:
            rows = dict(db.execute("SELECT id, host FROM t").fetchall())
            check_integrity(db)
    finally:
        store.close()
    assert rows == acknowledged
    assert not set(refused) & set(rows)


# --- the server dies ---------------------------------------------------------------------------


@pytest.fixture
def own_cluster(postgres_server: PostgresServer) -> Iterator[TempCluster]:
    """A cluster of this test's own, so that stopping it disturbs no other test."""
    if find_pg_bin() is None:
        pytest.skip("needs PostgreSQL binaries to start and kill a server of its own")
    cluster = TempCluster()
    cluster.start()
    yield cluster
    cluster.destroy()


def test_server_killed_mid_run_loses_nothing_acknowledged(own_cluster: TempCluster) -> None:
    """A writer commits rows non-stop while the server is killed (`pg_ctl stop -m immediate`,
    i.e. no clean shutdown) and started again. Commits in that window fail — `KvUnavailable`
    (nothing sent: non-fatal) or a fatal error (the database dies and is reopened) — and once the
    server is back, every acknowledged row is there and the database is intact."""
    url = f"{own_cluster.url}?schema=killed&pool_timeout=1&pool_max=2"
    store = open_kv(url)
    ns = store.namespace("actor")
    acknowledged: set[int] = set()
    failures: list[str] = []
    stop = threading.Event()
    restarted = threading.Event()
    after_restart = 0

    def open_when_possible() -> Database:
        while True:
            try:
                return open_database(ns)
            except (apsw.Error, KvUnavailable, KvIndeterminate) as e:
                failures.append(f"open: {type(e).__name__}")
                time.sleep(0.1)

    def writer() -> None:
        nonlocal after_restart
        db = open_when_possible()
        db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
        i = 0
        while not stop.is_set():
            i += 1
            try:
                db.execute("INSERT INTO t(id, v) VALUES (?, randomblob(200))", (i,))
                acknowledged.add(i)
                if restarted.is_set():
                    after_restart += 1
            except apsw.Error:
                err = db.take_last_kv_error()
                failures.append(f"{type(err).__name__} dead={db.is_dead}")
                if db.is_dead:
                    db.close()
                    db = open_when_possible()
                else:
                    time.sleep(0.05)
        db.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.5)
        own_cluster.stop("immediate")
        time.sleep(1.0)
        own_cluster.start()
        restarted.set()
        deadline = time.monotonic() + 30
        while after_restart < 50 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(60)
    assert after_restart >= 50, f"no progress after the restart: {failures[-5:]}"
    assert failures, "the outage went unnoticed"
    assert all(f.startswith(("KvUnavailable", "KvIndeterminate", "open: ")) for f in failures), (
        failures
    )
    with open_database(ns) as db:
        stored = {r[0] for r in db.execute("SELECT id FROM t")}
        check_integrity(db)
    missing = acknowledged - stored
    assert not missing, f"acknowledged commits lost: {sorted(missing)[:10]}"
    store.close()


def test_unavailable_server_before_a_commit_is_not_fatal(own_cluster: TempCluster) -> None:
    """With the server down (cleanly stopped), a commit fails with `KvUnavailable` before anything
    is sent; the database stays alive and commits again once the server is back."""
    store = open_kv(f"{own_cluster.url}?schema=down&pool_timeout=1")
    try:
        db = open_database(store.namespace("actor"))
        db.execute("CREATE TABLE t(v TEXT)")
        own_cluster.stop("fast")
        with pytest.raises(apsw.Error):
            db.execute("INSERT INTO t VALUES ('lost')")
        assert isinstance(db.take_last_kv_error(), KvUnavailable)
        assert not db.is_dead
        own_cluster.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                db.execute("INSERT INTO t VALUES ('kept')")
                break
            except apsw.Error:
                assert not db.is_dead, db.take_last_kv_error()
                assert time.monotonic() < deadline, db.take_last_kv_error()
                time.sleep(0.2)
        assert db.execute("SELECT v FROM t").fetchall() == [("kept",)]
        db.close()
        with open_database(store.namespace("actor")) as again:
            assert again.execute("SELECT v FROM t").fetchall() == [("kept",)]
            check_integrity(again)
    finally:
        store.close()


def test_fence_mismatch_is_reported_through_the_vfs(pg_store: PostgresStore) -> None:
    first = open_database(pg_store.namespace("actor"))
    first.execute("CREATE TABLE t(v)")
    second = open_database(pg_store.namespace("actor"))
    with pytest.raises(apsw.Error):
        first.execute("INSERT INTO t VALUES (1)")
    assert isinstance(first.take_last_kv_error(), FenceMismatch)
    second.execute("INSERT INTO t VALUES (2)")
    assert second.execute("SELECT v FROM t").fetchall() == [(2,)]
    first.close()
    second.close()
