"""PostgreSQL high availability, on real servers: a primary and a synchronous standby on loopback
(`pagekv.kv.pg_cluster.ReplicatedPair`), the store given both hosts in one URL.

What must hold, and where it is shown:

- one URL names both hosts and the store writes only to the one that takes writes, whatever its
  place in the URL (`test_the_store_writes_to_the_primary_whichever_host_it_is`);
- the primary is lost mid-load (stopped with `-m immediate`, or its postmaster SIGKILLed), the
  standby promoted, the old primary rewound as the new standby — three times in a row. The same
  store objects reconnect by themselves; a write in flight is `KvIndeterminate` (its database dies
  and is reopened), never a silent success; every other database open before the failover is
  refused its next write unsent (`FailedOver`) and reopens; every acknowledged commit is there
  afterwards, nothing appears that was refused, every database is intact; nothing is
  acknowledged while the new primary has no standby; and a takeover made before the failover
  still fences the instance it superseded after it
  (`test_failovers_under_load_lose_no_acknowledged_commit`);
- with asynchronous replication a failover loses the unreplicated commits, and no database
  (`test_an_asynchronous_failover_loses_the_last_commits_and_no_database`);
- an actor of the runtime serves on after a failover, no call failing: the runtime runs the
  call that meets it again on a fresh instance (`test_an_actor_serves_on_after_a_failover`);
- a commit the server acknowledges with a warning that it may not have been replicated (its
  synchronous wait was cancelled) is reported indeterminate
  (`test_a_commit_whose_replication_wait_was_cancelled_is_indeterminate`);
- a host that accepts connections but never answers (a dead machine) costs `connect_timeout`
  once, not at every reconnection (`test_a_hanging_host_is_tried_once_then_passed_over`);
- every request has a client-side deadline (`request_timeout_ms`): on a frozen server (every
  process SIGSTOPped, its connections open) a read in flight returns `KvUnavailable` and a
  write `KvIndeterminate` at its deadline, with no thread, descriptor or pool slot left behind
  (`test_a_frozen_server_fails_each_request_at_its_deadline`); a frozen primary fails over
  under load with every writer's outstanding request returned at its deadline and nothing
  acknowledged lost (`test_a_frozen_primary_fails_over_within_the_deadline_under_load`); a
  commit whose synchronous standby is gone fails indeterminate instead of waiting for good, and
  the server's wait is cancelled
  (`test_a_commit_whose_synchronous_standby_is_gone_fails_at_its_deadline`);
- a connection attempt never holds a request past its `pool_timeout`; it runs on, and its
  connection joins the pool or its slot is freed
  (`test_a_connection_attempt_given_up_at_pool_timeout_joins_the_pool_later`,
  `test_a_connection_attempt_that_fails_after_its_request_gave_up_frees_its_slot`).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import apsw
import psycopg
import pytest
from test_postgres import run_in_thread

from pagekv.actor import ActorContext, Registry, actor
from pagekv.kv import FenceMismatch, KvError, KvIndeterminate, KvUnavailable, open_kv
from pagekv.kv.pg_cluster import ReplicatedPair, TempCluster, find_pg_bin
from pagekv.kv.pg_pool import ConnectionPool, NoConnection
from pagekv.kv.postgres import FailedOver, PostgresStore, parse_postgres_url
from pagekv.vfs import Database, open_database

if TYPE_CHECKING:
    from conftest import PostgresServer


@pytest.fixture(scope="module")
def pair(postgres_server: PostgresServer) -> Iterator[ReplicatedPair]:
    """A primary and a synchronous standby of this module's own (its tests kill servers); each
    test leaves it with a primary and a streaming standby."""
    if find_pg_bin() is None:
        pytest.skip("needs PostgreSQL binaries to start servers of its own")
    with ReplicatedPair() as started:
        yield started


@pytest.fixture
def open_store(pair: ReplicatedPair) -> Iterator[Callable[..., PostgresStore]]:
    """`open_store(schema, url=None, **options)`: a store on the pair, closed after the test."""
    stores: list[PostgresStore] = []

    def opener(schema: str, url: str | None = None, **options: object) -> PostgresStore:
        store = open_kv(url or pair.url(schema=schema, **options))
        assert isinstance(store, PostgresStore)
        stores.append(store)
        return store

    yield opener
    for store in stores:
        store.close()


def admin(node: TempCluster) -> psycopg.Connection[Any]:
    return psycopg.connect(node.url, autocommit=True)


# --- URLs ----------------------------------------------------------------------------------


def test_multi_host_urls_are_parsed_and_shown_without_the_password() -> None:
    url = "postgresql://u:s3cret@db1:5432,db2:5433/app?target_session_attrs=primary&pool_max=4"
    base, options = parse_postgres_url(url)
    assert base == "postgresql://u:s3cret@db1:5432,db2:5433/app?target_session_attrs=primary"
    assert options.pool_max == 4
    for refused in ("any", "read-only", "standby", "prefer-standby"):
        with pytest.raises(ValueError, match="only a host that takes writes") as info:
            open_kv(f"postgresql://u:s3cret@db1,db2/app?target_session_attrs={refused}")
        assert "s3cret" not in str(info.value)
    for bad, why in (
        ("db1,db2/app?port=1,2,3", "names 2 hosts but 3 ports"),
        ("db1,db2/app?hostaddr=10.0.0.1,10.0.0.2,10.0.0.3", "names 2 hosts but 3 hostaddrs"),
        ("db1:5432,db2:http/app", "port 'http' is not a TCP port number"),
        ("db1:5432,db2:65536/app", "port '65536' is not a TCP port number"),
        ("db1,db2/app?bogus=1", 'invalid URI query parameter: "bogus"'),
        ("db1,db2/app?password=s3cret&pool_max=x", "bad option pool_max='x'"),
    ):
        with pytest.raises(ValueError, match=why) as info:
            open_kv(f"postgresql://u:s3cret@{bad}")
        assert "s3cret" not in str(info.value)
        assert "postgresql://db1" in str(info.value)  # which servers, without the credentials
    with pytest.raises(ValueError, match=r"for postgresql:///app\?host=db1,db2&port=1,2:") as info:
        open_kv("postgresql:///app?host=db1,db2&port=1,2&password=s3cret&pool_max=x")
    assert "s3cret" not in str(info.value)


def test_no_reachable_host_is_unavailable_naming_every_host() -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])  # nothing listens there once closed
    url = f"postgresql://postgres:s3cret@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/postgres"
    with pytest.raises(KvUnavailable, match="refused") as info:
        open_kv(url + "?pool_timeout=2")
    message = str(info.value)
    assert f"postgresql://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/postgres" in message
    assert all(f"port: '{port}'" in message for port in ports), message
    assert "s3cret" not in message


# --- which host ----------------------------------------------------------------------------


def test_the_store_writes_to_the_primary_whichever_host_it_is(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """The standby first in the URL, then second: either way every connection is the primary's
    (libpq rejects the standby as read-only before anything is sent)."""
    assert pair.standby is not None
    for first, second in ((pair.standby, pair.primary), (pair.primary, pair.standby)):
        url = (
            f"postgresql://postgres@127.0.0.1:{first.port},127.0.0.1:{second.port}/postgres"
            "?schema=which_host&pool_min=2"
        )
        store = open_store("which_host", url=url)
        ns = store.namespace("a")
        ns.put({b"k": b"v"}, fence=ns.takeover())
        assert ns.get([b"k"]) == [b"v"]
        conns = [store._pool.getconn() for _ in range(2)]
        for conn in conns:
            store._pool.putconn(conn)
        assert {c.pagekv_host for c in conns} == {f"127.0.0.1:{pair.primary.port}"}


# --- synchronous replication ---------------------------------------------------------------


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_commit_whose_replication_wait_was_cancelled_is_indeterminate(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """With the standby stopped, a write waits for it after committing locally; cancelling the
    wait (`pg_cancel_backend`) makes the server answer "success" with a warning. The store must
    not report that as applied — a failover then would undo it — but as indeterminate."""
    assert pair.standby is not None
    store = open_store("cancelled", application_name="pagekv-ha-cancel", pool_max=1)
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"before"}, fence=gen)
    pair.standby.stop("fast")
    try:
        thread, errors = run_in_thread(lambda: ns.put({b"k": b"unreplicated"}, fence=gen))
        with admin(pair.primary) as conn:
            activity = (
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'pagekv-ha-cancel' "
                "AND wait_event = 'SyncRep'"
            )
            wait_for(lambda: bool(conn.execute(activity).fetchall()), "the commit's SyncRep wait")
            ((cancelled,),) = conn.execute(
                f"SELECT pg_cancel_backend(pid) FROM ({activity}) w"
            ).fetchall()
        assert cancelled is True
        thread.join(30)
    finally:
        pair.standby.start()
        pair.wait_for_standby()
    assert len(errors) == 1 and type(errors[0]) is KvIndeterminate, errors
    assert "may not have reached its synchronous standby" in str(errors[0])
    assert f"127.0.0.1:{pair.primary.port}" in str(errors[0])
    assert ns.get([b"k"]) == [b"unreplicated"]  # committed locally: indeterminate, not refused
    ns.put({b"k": b"after"}, fence=gen)  # the connection is as good as before
    assert ns.get([b"k"]) == [b"after"]


# --- a host that hangs ----------------------------------------------------------------------


def test_a_hanging_host_is_tried_once_then_passed_over(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """First in the URL, a host that accepts TCP connections and never answers (as a machine
    that died with its port still routed would, behind a load balancer): the first connection
    waits `connect_timeout` there and goes on to the primary; the ones made after the server
    ended every connection go to the primary directly."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as hung:  # never accepts
        url = (
            f"postgresql://postgres@127.0.0.1:{hung.getsockname()[1]},"
            f"127.0.0.1:{pair.primary.port}/postgres?schema=hanging&connect_timeout=2"
            "&application_name=pagekv-ha-hang&pool_min=1&pool_max=2"
        )
        store = open_store("hanging", url=url)
        ns = store.namespace("a")
        gen = ns.takeover()
        for round_ in range(3):
            with admin(pair.primary) as conn:
                killed = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'pagekv-ha-hang'"
                ).fetchall()
            assert killed, "the store had no connection to end"
            time.sleep(0.1)  # the termination notices arrive
            ns.put({b"round": b"%d" % round_}, fence=gen)
        hung.setblocking(False)
        attempts = 0
        while True:
            try:
                client, _ = hung.accept()
            except BlockingIOError:
                break
            client.close()
            attempts += 1
    assert ns.get([b"round"]) == [b"2"]
    assert store._pool.counts.connected >= 4  # the first, and one after each termination
    assert attempts == 1, f"the hanging host was tried {attempts} times"


# --- the pool ------------------------------------------------------------------------------


def test_a_request_waits_out_an_outage_and_goes_through(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """The primary stops and comes back (no failover) while a write is waiting for a
    connection: the write retries every host until it can, then goes through — no error, the
    same store. Meanwhile the standby is refused for being read-only, never written to."""
    store = open_store("outage", pool_max=1, pool_timeout=30)
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"before"}, fence=gen)
    failed = store._pool.counts.failed
    pair.primary.stop("fast")
    try:
        thread, errors = run_in_thread(lambda: ns.put({b"k": b"during"}, fence=gen))
        wait_for(lambda: store._pool.counts.failed >= failed + 3, "connection attempts to fail")
        assert "session is read-only" in str(store._pool.last_error)
        assert thread.is_alive()
    finally:
        pair.primary.start()
        pair.wait_for_standby()
    thread.join(30)
    assert errors == []
    assert ns.get([b"k"]) == [b"during"]


def test_the_pool_holds_at_most_pool_max_connections(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    store = open_store("bounded", application_name="pagekv-ha-bounded", pool_max=2)

    def write(i: int) -> None:
        ns = store.namespace(f"a{i}")
        gen = ns.takeover()
        for j in range(25):
            ns.put({b"k": b"%d" % j}, fence=gen)

    running = [run_in_thread(partial(write, i)) for i in range(8)]
    for thread, errors in running:
        thread.join(60)
        assert errors == []
    with admin(pair.primary) as conn:
        ((backends,),) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pagekv-ha-bounded'"
        ).fetchall()
    assert backends == store._pool.counts.connected == 2


def test_closing_the_store_ends_a_request_waiting_for_a_connection(
    open_store: Callable[..., PostgresStore],
) -> None:
    store = open_store("closing", pool_max=1, pool_timeout=30)
    ns = store.namespace("a")
    held = store._pool.getconn()  # the one connection, lent out
    thread, errors = run_in_thread(lambda: ns.get([b"k"]))
    time.sleep(0.2)  # let it wait for the connection
    store.close()
    thread.join(10)
    assert not thread.is_alive(), "the waiting request outlived the store"
    assert len(errors) == 1 and type(errors[0]) is KvUnavailable, errors
    assert "closed" in str(errors[0])
    store._pool.putconn(held)
    assert held.closed


# --- failovers under load ------------------------------------------------------------------


@dataclass
class Writer:
    """One actor's database, committing one-row INSERTs with ids never reused.

    `acked`: ids whose commit returned; `unknown`: ids whose commit raised `KvIndeterminate`
    (its outcome unknown: the database died and was reopened); `refused`: ids whose commit
    raised `KvUnavailable` (nothing was applied, the database lived on) or `FailedOver`
    (nothing was sent, the database died and was reopened); `ack_times`: when each
    acknowledgement arrived; `errors`: the KV errors met, by type name, and `failures` each of
    them with when it was raised.
    """

    index: int
    store: PostgresStore
    acked: list[int] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    unknown: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[float, str]] = field(default_factory=list)
    failed: BaseException | None = None

    @property
    def actor(self) -> str:
        return f"writer-{self.index}"

    def _open(self) -> Database:
        """Open (take over) the database, waiting out an outage of up to 60 s."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return open_database(self.store.namespace(self.actor))
            except (apsw.Error, KvError) as e:
                self._count(e)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _count(self, error: BaseException | None) -> None:
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        self.failures.append((time.monotonic(), name))

    def run(self, stop: threading.Event) -> None:
        try:
            db = self._open()
            db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
            next_id = 0
            while not stop.is_set():
                next_id += 1
                try:
                    db.execute("INSERT INTO t(id, v) VALUES (?, randomblob(100))", (next_id,))
                except apsw.Error:
                    error = db.take_last_kv_error()
                    self._count(error)
                    if db.is_dead:
                        assert type(error) in (KvIndeterminate, FailedOver), error
                        (self.unknown if type(error) is KvIndeterminate else self.refused).add(
                            next_id
                        )
                        db.close()
                        db = self._open()
                    else:
                        assert type(error) is KvUnavailable, error
                        self.refused.add(next_id)
                    continue
                self.acked.append(next_id)
                self.ack_times.append(time.monotonic())
            db.close()
        except BaseException as e:
            self.failed = e

    def stored(self) -> set[int]:
        """The ids in the database now, read from a snapshot, which also checks its integrity."""
        with open_database(self.store.namespace(self.actor), read_only=True) as snap:
            assert snap.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            return {row[0] for row in snap.execute("SELECT id FROM t")}

    def first_ack_after(self, moment: float) -> float | None:
        return next((t for t in self.ack_times if t > moment), None)


def all_acked(writers: list[Writer], goals: list[int]) -> bool:
    return all(len(w.acked) >= n for w, n in zip(writers, goals, strict=True))


def all_acked_after(writers: list[Writer], moment: float) -> bool:
    return all(w.first_ack_after(moment) for w in writers)


@contextmanager
def committing(writers: list[Writer]) -> Iterator[None]:
    """Each writer committing in a thread of its own during the block; stopped and joined
    after it, whatever happens in it."""
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in writers]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def check_writers(writers: list[Writer]) -> None:
    """What losing a primary must leave each writer: it ran to the end, met only the KV errors
    a failover raises, and its database is intact and holds every commit acknowledged, none
    refused, and of the others only some whose outcome was unknown."""
    for w in writers:
        assert w.failed is None, f"{w.actor}: {w.failed!r}"
        assert set(w.errors) <= {"KvIndeterminate", "KvUnavailable", "FailedOver"}, w.errors
        stored = w.stored()
        missing = set(w.acked) - stored
        assert not missing, f"{w.actor} lost acknowledged commits {sorted(missing)[:5]}"
        assert not stored - set(w.acked) - w.unknown, "a refused commit was applied"
        assert not stored & w.refused


def test_failovers_under_load_lose_no_acknowledged_commit(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    store = open_store("failover", pool_max=8, pool_timeout=30)
    stale_store = open_store("failover", pool_max=1, pool_timeout=30)  # another host, as it were
    writers = [Writer(i, store) for i in range(4)]
    report: list[str] = []
    fences: list[FenceMismatch] = []
    with committing(writers):
        for round_, how in enumerate(("immediate", "kill", "immediate")):
            goals = [len(w.acked) + 20 for w in writers]
            wait_for(partial(all_acked, writers, goals), "every writer to commit under load")
            # An instance on another store, then superseded by a takeover through this one.
            stale = open_database(stale_store.namespace("fenced"))
            stale.execute("CREATE TABLE IF NOT EXISTS t(v TEXT)")
            stale.execute("INSERT INTO t VALUES (?)", (f"stale-{round_}",))
            stale_generation = stale.generation
            with open_database(store.namespace("fenced")) as current:
                current.execute("INSERT INTO t VALUES (?)", (f"current-{round_}",))
                generation = current.generation
            connected = store._pool.counts.connected

            killed_at = time.monotonic()
            acked_before = {w.index: set(w.acked) for w in writers}
            pair.fail_over(how)
            promoted_at = time.monotonic()
            standby_started_at = pair.rebuild_standby()
            rebuilt_at = time.monotonic()
            # Nothing was acknowledged while the new primary had no standby: its commits waited.
            assert all(
                (w.first_ack_after(promoted_at) or rebuilt_at) > standby_started_at for w in writers
            )
            wait_for(
                partial(all_acked_after, writers, rebuilt_at),
                "every writer to commit on the new primary",
            )
            for w in writers:
                missing = acked_before[w.index] - w.stored()
                assert not missing, f"{w.actor} lost acknowledged commits {sorted(missing)[:5]}"

            # The stale instance's next write is refused unsent: it was taken over on the old
            # timeline. Its fence, sent through its store from a namespace looked up after the
            # failover, reaches the new primary and is refused there: the takeover made
            # before the failover was replicated with the rest.
            with pytest.raises(apsw.Error):
                stale.execute("INSERT INTO t VALUES (?)", (f"stale-after-{round_}",))
            refused = stale.take_last_kv_error()
            assert type(refused) is FailedOver, refused
            assert (refused.fence, refused.current) == (stale_generation, generation)
            assert refused.now == refused.was + 1
            assert stale.is_dead
            stale.close()
            with pytest.raises(FenceMismatch) as info:
                stale_store.namespace("fenced").put({b"stale": b"x"}, fence=stale_generation)
            assert type(info.value) is FenceMismatch  # refused by the new primary
            assert (info.value.fence, info.value.current) == (stale_generation, generation)
            fences.append(info.value)
            assert store._pool.counts.connected > connected, "the store never reconnected"

            resumed = [(w.first_ack_after(promoted_at) or 0) - killed_at for w in writers]
            report.append(
                f"round {round_ + 1} ({how}): promoted {promoted_at - killed_at:.2f} s, standby "
                f"rebuilt {rebuilt_at - killed_at:.2f} s, first commit {min(resumed):.2f} s, "
                f"every writer {max(resumed):.2f} s after the kill"
            )
    check_writers(writers)
    for w in writers:
        # in flight at the kill, or refused unsent as taken over before the failover
        deaths = w.errors.get("KvIndeterminate", 0) + w.errors.get("FailedOver", 0)
        assert deaths >= 3, f"a database lived through a failover: {w.errors}"
    acked = sum(len(w.acked) for w in writers)
    with open_database(store.namespace("fenced"), read_only=True) as snap:
        values = [row[0] for row in snap.execute("SELECT v FROM t")]
    assert not [v for v in values if v.startswith("stale-after")]
    assert store.namespace("fenced").get([b"stale"]) == [None]
    assert [f.current for f in fences] == sorted({f.current for f in fences})
    unknown = sum(len(w.unknown) for w in writers)
    reopened = sum(w.errors.get("FailedOver", 0) for w in writers)
    print(
        f"\n{len(writers)} writers, 3 failovers: {acked} commits acknowledged, 0 lost, "
        f"{unknown} in flight (of unknown outcome), {reopened} refused unsent after a failover; "
        + "; ".join(report)
    )


def test_an_asynchronous_failover_loses_the_last_commits_and_no_database(
    postgres_server: PostgresServer,
) -> None:
    """What docs/deployment.md says asynchronous replication costs, shown: the standby is cut off,
    100 more commits are acknowledged by the primary alone, the primary dies and the standby is
    promoted. Those 100 are gone; the instance that was told they succeeded does not write on
    top of the older state (that corrupted its database: a page below EOF missing) — its next
    write is refused unsent, and the reopened database holds exactly the replicated commits,
    intact."""
    if find_pg_bin() is None:
        pytest.skip("needs PostgreSQL binaries to start servers of its own")
    with ReplicatedPair(synchronous=False) as pair:
        standby = pair.standby
        assert standby is not None
        store = open_kv(pair.url(schema="asynchronous", pool_timeout=30))
        try:
            db = open_database(store.namespace("a"))
            db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
            db.execute("CREATE INDEX t_v ON t(v)")
            for i in range(1, 101):
                db.execute("INSERT INTO t VALUES (?, randomblob(300))", (i,))
            lsn = pair.primary.sql("SELECT pg_current_wal_lsn()")
            received = f"SELECT pg_last_wal_receive_lsn() >= '{lsn}'"
            wait_for(lambda: standby.sql(received) == "t", "the standby to catch up")
            standby.sql("ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1'")
            standby.sql("SELECT pg_reload_conf()")
            streaming = "SELECT count(*) FROM pg_stat_replication"
            wait_for(lambda: pair.primary.sql(streaming) == "0", "the standby to be cut off")
            for i in range(101, 201):
                db.execute("INSERT INTO t VALUES (?, randomblob(300))", (i,))  # acknowledged
            pair.fail_over("immediate")
            with pytest.raises(apsw.Error):
                db.execute("INSERT INTO t VALUES (201, randomblob(300))")
            refused = db.take_last_kv_error()
            assert type(refused) is FailedOver, refused
            assert db.is_dead
            db.close()
            with open_database(store.namespace("a")) as again:
                assert again.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
                ids = [row[0] for row in again.execute("SELECT id FROM t ORDER BY id")]
                assert ids == list(range(1, 101)), "the replicated commits, and only them"
                again.execute("INSERT INTO t VALUES (101, randomblob(300))")
        finally:
            store.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


tally = actor("tally", state={"count": 0})


@tally.on_migrate
async def _tally_tables(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS adds(n INTEGER)")


@tally.action
async def add(ctx: ActorContext, n: int) -> int:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO adds(n) VALUES (?)", (n,))
        ctx.state["count"] += 1
    return int(ctx.state["count"])


@tally.action
async def note(ctx: ActorContext, n: int) -> list[bytes | None]:
    """Write only the actor's own KV entries (no database commit), then read them back."""
    await ctx.kv.put({b"note-%d" % n: b"%d" % n})
    return await ctx.kv.get([b"note-%d" % i for i in range(n + 1)])


@pytest.mark.anyio
async def test_an_actor_serves_on_after_a_failover(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """Two awake actors of the runtime, their primary failed over while they were idle. The call
    that meets the failover has its write refused unsent (`FailedOver`) — one through its
    database, the other through its own KV entries — and the runtime, as after a takeover, runs
    it again on a fresh instance, which has every acknowledged commit. No call fails."""
    store = open_store("actors", pool_timeout=30)
    registry = Registry([tally], kv=store)
    async with registry.run() as client:
        rows, notes = client.get_or_create("tally", "rows"), client.get_or_create("tally", "notes")
        assert [await rows.add(n) for n in range(5)] == [1, 2, 3, 4, 5]
        assert await notes.note(0) == [b"0"]
        takeovers = registry.metrics().get("takeovers", 0)
        await anyio.to_thread.run_sync(pair.fail_over, "immediate")
        await anyio.to_thread.run_sync(pair.rebuild_standby)
        assert [await rows.add(n) for n in range(5, 8)] == [6, 7, 8]
        assert await notes.note(1) == [b"0", b"1"]
        assert await notes.note(2) == [b"0", b"1", b"2"]
        assert registry.metrics().get("takeovers", 0) == takeovers + 2  # one per actor
    (actor_id,) = [a for a in store.actor_ids() if a.startswith("tally/rows")]
    with open_database(store.namespace(actor_id), read_only=True) as snap:
        assert snap.execute("SELECT n FROM adds").fetchall() == [(n,) for n in range(8)]


# --- a server that stops answering: every request has a deadline --------------------------


@contextmanager
def frozen(node: TempCluster) -> Iterator[None]:
    """`node` frozen (every process SIGSTOPped) for the block and thawed after it, whatever
    happens in it: a failing test leaves no stopped server behind. A node killed in the block
    (`fail_over("frozen")`) is thawed already."""
    node.freeze()
    try:
        yield
    finally:
        node.thaw()


def pg_threads() -> list[threading.Thread]:
    """The threads of the PostgreSQL store: deadline watchdogs, cancels, connection attempts."""
    return [t for t in threading.enumerate() if t.name.startswith("pagekv-pg-")]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def assert_no_slot_leaked(store: PostgresStore) -> None:
    """Every connection the pool counts is idle (nothing is lent out or being connected)."""
    pool = store._pool
    with pool._cond:
        assert pool._size == len(pool._idle), (pool._size, len(pool._idle))


@pytest.fixture(scope="module")
def lone_server(postgres_server: PostgresServer) -> Iterator[TempCluster]:
    """A server of this module's own, to freeze (`TempCluster.destroy` thaws it first)."""
    if find_pg_bin() is None:
        pytest.skip("needs PostgreSQL binaries to start servers of its own")
    with TempCluster() as cluster:
        yield cluster


def test_request_timeout_ms_defaults_to_a_little_above_the_statement_timeout() -> None:
    def parsed(query: str) -> int:
        return parse_postgres_url(f"postgresql://u@db1,db2/app?{query}")[1].request_timeout_ms

    assert parsed("") == 65_000
    assert parsed("statement_timeout_ms=2000") == 7_000
    assert parsed("statement_timeout_ms=0") == 65_000  # the server's limit off; the client's not
    assert parsed("statement_timeout_ms=2000&request_timeout_ms=500") == 500
    for bad in ("0", "-1"):
        with pytest.raises(ValueError, match=f"request_timeout_ms must be > 0.*not {bad}"):
            parse_postgres_url(f"postgresql://u:s3cret@db1/app?request_timeout_ms={bad}")
    with pytest.raises(ValueError, match=r"bad option request_timeout_ms='1\.5'") as info:
        open_kv("postgresql://u:s3cret@db1/app?request_timeout_ms=1.5")
    assert "s3cret" not in str(info.value)


def test_a_frozen_server_fails_each_request_at_its_deadline(lone_server: TempCluster) -> None:
    """SIGSTOP of every process of the server: the kernel keeps the connections open and
    acknowledges what is sent, and nothing answers. A read, a small write and a write of nearly
    a whole batch (976 KiB) in flight each return once their deadline passes: the read
    `KvUnavailable`, the writes `KvIndeterminate` (each may have been applied: thawed, the
    server runs what it had received, unless the cancel sent for it comes first). Each
    connection is discarded, its pool slot freed; the cancel sent for each is taken once the
    server is thawed; and once the store is closed no thread or descriptor of it is left."""
    fds = open_fds()
    store = open_kv(f"{lone_server.url}?schema=frozen&request_timeout_ms=500&pool_min=3&pool_max=3")
    assert isinstance(store, PostgresStore)
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"before"}, fence=gen)
    big = {b"big-%03d" % i: os.urandom(7600) for i in range(128)}  # 128 entries, ~950 KiB
    with frozen(lone_server):
        requests = [
            run_in_thread(lambda: ns.get([b"k"])),
            run_in_thread(lambda: ns.put({b"k": b"during"}, fence=gen)),
            run_in_thread(lambda: ns.put(big, fence=gen)),
        ]
        for thread, _ in requests:
            thread.join(30)
            assert not thread.is_alive(), "a request outlived its deadline on a frozen server"
        assert store._deadlines.counts.abandoned == 3
        assert_no_slot_leaked(store)
        assert store._pool.counts.discarded == 3
    (read,), (small,), (batch,) = (errors for _, errors in requests)
    assert type(read) is KvUnavailable, read
    assert "get: no answer from PostgreSQL" in str(read) and "nothing was written" in str(read)
    for write in (small, batch):
        assert type(write) is KvIndeterminate, write
        assert "within 0.5 s (request_timeout_ms)" in str(write)
        assert "may be waiting for a synchronous standby" in str(write)
    assert ns.get([b"k"]) in ([b"before"], [b"during"])
    wait_for(lambda: not [t for t in pg_threads() if t.name == "pagekv-pg-cancel"], "cancels")
    assert store._deadlines.counts.cancelled == 3, store._deadlines.counts
    store.close()
    wait_for(lambda: not pg_threads(), "the store's threads to end")
    assert open_fds() == fds


def test_requests_racing_their_deadline_answer_or_fail_typed_and_leak_nothing(
    lone_server: TempCluster,
) -> None:
    """Four writers against a 50 ms deadline while another session holds their namespaces' row
    locks for 0 to 100 ms at a time: each write waits on the server, and its answer races the
    deadline, the socket's shutdown and the cancel sent after it. Each request answers or
    fails typed (a write `KvIndeterminate`, a read `KvUnavailable`); each namespace then holds
    its last acknowledged value or one written after it whose outcome was unknown; and the
    store leaves no pool slot, thread or descriptor behind."""
    fds = open_fds()
    url = f"{lone_server.url}?schema=racing"
    open_kv(url).close()  # the schema, made under the default deadline
    store = open_kv(f"{url}&request_timeout_ms=50&pool_max=4&pool_timeout=10")
    assert isinstance(store, PostgresStore)
    names = [f"n{i}" for i in range(4)]
    spaces = [store.namespace(name) for name in names]
    fences = [ns.takeover() for ns in spaces]
    stop = threading.Event()

    def hold_locks() -> None:
        rng = random.Random(7)
        with psycopg.connect(lone_server.url) as conn:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute(
                        "SELECT 1 FROM racing.namespaces WHERE name = ANY (%s) FOR UPDATE",
                        (names,),
                    )
                    time.sleep(rng.uniform(0, 0.1))
                time.sleep(rng.uniform(0, 0.02))

    outcomes: dict[str, int] = {}
    last: dict[int, tuple[int, list[int]]] = {}

    def write(i: int) -> None:
        acked, unknown = 0, []
        for value in range(1, 41):
            try:
                spaces[i].put({b"k": b"%d" % value}, fence=fences[i])
                acked, unknown, outcome = value, [], "put acknowledged"
            except KvIndeterminate:
                unknown.append(value)
                outcome = "put indeterminate"
            try:
                spaces[i].get([b"k"])
                read = "get answered"
            except KvUnavailable:
                read = "get unavailable"
            for name in (outcome, read):
                outcomes[name] = outcomes.get(name, 0) + 1
        last[i] = (acked, unknown)

    locker = threading.Thread(target=hold_locks)
    locker.start()
    try:
        writers = [run_in_thread(partial(write, i)) for i in range(len(spaces))]
        for thread, errors in writers:
            thread.join(60)
            assert errors == []
    finally:
        stop.set()
        locker.join(10)
    counts = store._deadlines.counts
    failed = outcomes.get("put indeterminate", 0) + outcomes.get("get unavailable", 0)
    assert outcomes.get("put indeterminate") and outcomes["put acknowledged"], outcomes
    # each failure is an abandoned request; one abandoned as its answer arrived succeeded
    assert 0 < failed <= counts.abandoned, (outcomes, counts)
    assert_no_slot_leaked(store)
    with open_kv(url) as check:
        for i, name in enumerate(names):
            acked, unknown = last[i]
            (stored,) = check.namespace(name).get([b"k"])
            assert stored is not None and int(stored) in (acked, *unknown), (stored, acked, unknown)
    wait_for(lambda: counts.cancelled + counts.cancel_failed == counts.abandoned, "the cancels")
    assert counts.cancel_failed == 0, counts
    store.close()
    wait_for(lambda: not pg_threads(), "the store's threads to end")
    assert open_fds() == fds
    print(f"\n50 ms deadline racing lock waits: {outcomes}, {counts.abandoned} abandoned")


def test_a_connection_attempt_given_up_at_pool_timeout_joins_the_pool_later(
    lone_server: TempCluster,
) -> None:
    """A request needing a new connection while the server is frozen gives up at its
    `pool_timeout` (0.3 s) although libpq's attempt waits `connect_timeout` (2 s): the attempt
    runs on in its thread, holding the request's pool slot; when the server is thawed it ends
    with a connection, which the pool keeps for the next request (no new connection made)."""
    store = open_kv(
        f"{lone_server.url}?schema=frozen_connect&connect_timeout=2&pool_timeout=0.3"
        "&pool_min=1&pool_max=2"
    )
    assert isinstance(store, PostgresStore)
    ns = store.namespace("a")
    held = store._pool.getconn()  # the one connection: the next request must make another
    connected = store._pool.counts.connected
    try:
        with frozen(lone_server):
            with pytest.raises(KvUnavailable, match=r"no connection within 0\.3 s") as info:
                ns.get([b"k"])
            assert "a connection attempt was still waiting" in str(info.value)
            assert [t.name for t in pg_threads()].count("pagekv-pg-connect") == 1
            assert store._pool._size == 2  # held + the attempt's
        wait_for(lambda: len(store._pool._idle) == 1, "the attempt's connection to join the pool")
        assert store._pool.counts.connected == connected + 1
        assert ns.get([b"k"]) == [None]
        assert store._pool.counts.connected == connected + 1  # it was the attempt's connection
    finally:
        store._pool.putconn(held)
        store.close()


def test_a_connection_attempt_that_fails_after_its_request_gave_up_frees_its_slot() -> None:
    """A host that accepts TCP connections and never answers: the request gives up at its
    0.3 s; the attempt fails later, at libpq's `connect_timeout`, and frees the slot."""
    with socket.create_server(("127.0.0.1", 0), backlog=4) as hung:
        conninfo = f"host=127.0.0.1 port={hung.getsockname()[1]} connect_timeout=2"
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            partial(psycopg.Connection.connect, conninfo), min_size=0, max_size=1, timeout=0.3
        )
        with pytest.raises(NoConnection, match="a connection attempt was still waiting"):
            pool.getconn()
        assert pool._size == 1 and pool.counts.failed == 0  # the attempt runs on
        wait_for(lambda: pool._size == 0, "the attempt to fail and free its slot")
        assert pool.counts.failed == 1
        assert isinstance(pool.last_error, psycopg.errors.ConnectionTimeout)
        with pytest.raises(NoConnection):  # the slot is usable again, for another attempt
            pool.getconn()
        pool.close()
    wait_for(lambda: not pg_threads(), "the attempts' threads to end")


def syncrep_waiters(node: TempCluster, application: str) -> list[tuple[Any, ...]]:
    with admin(node) as conn:
        return conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event = 'SyncRep'",
            (application,),
        ).fetchall()


def test_a_commit_whose_synchronous_standby_is_gone_fails_at_its_deadline(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """The standby SIGKILLed for good: every commit waits for it, which `statement_timeout`
    does not cover. The write returns `KvIndeterminate` at its 1 s deadline, saying the commit
    may be waiting for a synchronous standby; reads go on; and the cancel sent for the
    abandoned request ends the server's wait, so no backend is left holding the namespace's
    row lock (the commit is then on the primary alone: indeterminate it was)."""
    standby = pair.standby
    assert standby is not None
    store = open_store(
        "lost_standby", application_name="pagekv-ha-lost", request_timeout_ms=1000, pool_max=2
    )
    ns = store.namespace("a")
    gen = ns.takeover()
    ns.put({b"k": b"before"}, fence=gen)
    standby.kill()
    try:
        with pytest.raises(KvIndeterminate, match="may be waiting for a synchronous standby"):
            ns.put({b"k": b"unreplicated"}, fence=gen)
        assert store._deadlines.counts.abandoned == 1
        assert ns.get([b"k"]) in ([b"before"], [b"unreplicated"])  # reads wait for no standby
        wait_for(lambda: store._deadlines.counts.cancelled == 1, "the cancel to be taken")
        wait_for(
            lambda: not syncrep_waiters(pair.primary, "pagekv-ha-lost"), "the wait to be ended"
        )
        assert ns.get([b"k"]) == [b"unreplicated"]  # committed on the primary, not replicated
        assert_no_slot_leaked(store)
        with pytest.raises(KvIndeterminate):  # and the next commit waits the same way
            ns.put({b"k": b"again"}, fence=gen)
    finally:
        standby.start()
        pair.wait_for_standby()
    ns.put({b"k": b"after"}, fence=gen)
    assert ns.get([b"k"]) == [b"after"]
    assert store._deadlines.counts.abandoned == 2


def test_a_frozen_primary_fails_over_within_the_deadline_under_load(
    pair: ReplicatedPair, open_store: Callable[..., PostgresStore]
) -> None:
    """Four writers committing; the primary frozen mid-load (every process SIGSTOPped, its
    connections open). With a 1 s deadline each writer's outstanding request returns, as
    `KvIndeterminate` (a write) or `KvUnavailable` (a read), its database dies and reopens;
    then the standby is promoted, the old primary killed where it stands, rebuilt as the new
    standby, and the writers go on. No acknowledged commit is lost, none was acknowledged while
    the new primary had no standby, every database is intact, and the deadline never fired
    before the freeze."""
    store = open_store(
        "frozen_failover", request_timeout_ms=1000, pool_max=8, pool_timeout=30, connect_timeout=2
    )
    writers = [Writer(i, store) for i in range(4)]
    with committing(writers):
        wait_for(partial(all_acked, writers, [20] * len(writers)), "every writer to commit")
        assert store._deadlines.counts.abandoned == 0  # a healthy server under load
        with frozen(pair.primary):
            frozen_at = time.monotonic()

            def all_failed() -> bool:
                return all(any(at > frozen_at for at, _ in w.failures) for w in writers)

            wait_for(all_failed, "every writer's outstanding request to return", timeout=15)
            first = [next((at, name) for at, name in w.failures if at > frozen_at) for w in writers]
            assert {name for _, name in first} <= {"KvIndeterminate", "KvUnavailable"}, first
            assert store._deadlines.counts.abandoned >= len(writers)
            pair.fail_over("frozen")
        promoted_at = time.monotonic()
        standby_started_at = pair.rebuild_standby()
        rebuilt_at = time.monotonic()
        wait_for(partial(all_acked_after, writers, rebuilt_at), "every writer to go on")
        assert all(
            (w.first_ack_after(promoted_at) or rebuilt_at) > standby_started_at for w in writers
        )
    check_writers(writers)
    assert_no_slot_leaked(store)
    returned = [at - frozen_at for at, _ in first]
    resumed = [(w.first_ack_after(promoted_at) or 0) - frozen_at for w in writers]
    print(
        f"\nfrozen primary, deadline 1 s: every outstanding request returned "
        f"{min(returned):.2f}-{max(returned):.2f} s after the freeze ({[n for _, n in first]}); "
        f"promoted {promoted_at - frozen_at:.2f} s, "
        f"standby rebuilt {rebuilt_at - frozen_at:.2f} s, "
        f"every writer committing {max(resumed):.2f} s after the freeze; "
        f"{sum(len(w.acked) for w in writers)} acknowledged, 0 lost, "
        f"{store._deadlines.counts.abandoned} requests abandoned"
    )
