"""The shared backend: a PostgreSQL server through psycopg 3, for many hosts serving one store.

Why it is built this way:

- **One round trip, one transaction per write.** A write is one call of a PL/pgSQL function,
  `kv_write`, on an autocommit connection: the server runs it as one implicit transaction that
  locks the namespace row (`FOR NO KEY UPDATE`), checks the fence and the exact quota against
  that locked row, applies the deletes and the upserts, and updates the usage. A mismatched fence
  or a full quota is reported back as a status and nothing is changed, so the typed error is raised
  here (through `check_fence` / `check_quota`, the one rule every backend shares). Keys and values
  travel as binary `bytea[]` parameters (text parameters measured 5x slower). No `BEGIN`/`COMMIT`
  statements are sent: the extended-protocol `Sync` that ends the call commits it.
- **Ordered keys on the server.** `entries` has the primary key `(ns, key)`; `bytea` compares
  bytewise (memcmp, then length) whatever the collation, which is exactly the contract's order.
  `list`, `delete_range` and `drop` are single range statements on that key.
- **Fencing across hosts.** Every data-changing statement takes the namespace row lock first, and
  `takeover()` is one `UPDATE ... SET generation = generation + 1 RETURNING`, which takes the same
  lock. A write and a takeover therefore serialize on the server: a write that committed did so
  under the generation it names; any write after the takeover sees the new one and fails.
- **Errors say whether anything may have been applied.** A request that never left this process
  (no connection could be made, or the pooled connection was found dead before sending) raises
  `KvUnavailable`. A request that reached the server and got an error back on a connection that
  is still healthy was rolled back (an error always aborts the implicit transaction), so it is
  `KvUnavailable` as well. A *write* whose connection broke after it was sent is `KvIndeterminate`:
  the server may have committed it before the connection died, and the caller must not resend it.
  Reads never change anything, so a read that fails in any way is `KvUnavailable`.
- **A commit the server did not replicate is not acknowledged.** With synchronous replication the
  server commits locally, then waits for the standby; if that wait is cancelled (an administrator's
  `pg_cancel_backend`), the server still answers "success", with a warning that the commit may not
  have reached the standby — a success a failover could take back. A write answered with that
  warning (recognised by its source, `syncrep.c`, whatever the server's language) raises
  `KvIndeterminate` instead. A wait ended by a terminated connection or a dying server sends no
  success at all: the connection breaks, which is indeterminate already.
- **A failover ends every ownership taken before it.** Each connection learns its server's
  timeline, which a promotion changes; a fenced write of a namespace taken over on another
  timeline is refused unsent (`FailedOver`, a `FenceMismatch`), so an instance reopens instead
  of writing on top of a state that may have lost its last commits (see `PostgresNamespace`).
- **Every request has a deadline in the client** (`request_timeout_ms`, see `pg_deadline`): a
  server that stops answering with its connections open (frozen), or a commit waiting for a
  synchronous standby that is gone, would otherwise hold a request for good. Past the deadline
  the connection's socket is shut down under the blocked call and the connection discarded; an
  abandoned read is `KvUnavailable`, an abandoned write `KvIndeterminate` (it may have committed).
- **Pooled, bounded connections, any number of hosts.** A pool per store (`pg_pool`) makes
  connections on demand, retrying with a bounded backoff until `pool_timeout`; connect, TCP and
  pool-wait timeouts all default to finite values so that a dead server surfaces as an error
  instead of a hang. Before a pooled connection is used, its socket is polled (no round trip): an
  idle connection with bytes to read has been closed or told to terminate by the server (a
  restart or failover sends exactly that), so it is discarded instead of turning the next write
  into an indeterminate one. A URL may name several hosts (libpq's `h1:p1,h2:p2`);
  `target_session_attrs=read-write` (the default here) makes each connection skip a standby, so
  after a failover the same store reconnects to the promoted one without a restart.

The schema (tables and functions) lives in one PostgreSQL schema, `pagekv` unless the URL names
another (`?schema=`), is created on first use and carries a version number; older versions are
upgraded in place under an advisory lock, and a newer one is refused.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.pq.abc import PGcancelConn

from pagekv.kv.errors import FenceMismatch, KvError, KvIndeterminate, KvUnavailable
from pagekv.kv.fence import check_fence
from pagekv.kv.limits import KvLimits, WriteBatch, check_name, check_quota
from pagekv.kv.namespace import KvNamespace
from pagekv.kv.pg_deadline import Deadlines, Request
from pagekv.kv.pg_pool import ConnectionPool, HostOrder, NoConnection, PoolClosed
from pagekv.kv.redact import redact_url

SCHEMA_VERSION = 1
"""The version of the tables and functions this code reads and writes."""

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")

# The longest key and namespace name the unique indexes hold whatever their bytes: a btree entry
# is at most 2704 bytes (a third of an 8 KiB page), less an 8-byte tuple header, a 4-byte bytea
# or text header and, for a key, the 8-byte `ns`. A longer one that does not compress failed its
# write (measured on PostgreSQL 15: a 2684-byte random key is stored, a 2686-byte one is not).
_MAX_KEY_BYTES = 2704 - 8 - 8 - 4
_MAX_NAME_BYTES = 2704 - 8 - 4

# Statuses returned by kv_write / kv_delete_range.
_OK, _FENCED, _OVER_QUOTA, _MISSING = 0, 1, 2, 3

# Each entry upgrades the schema from version i to i + 1. `{s}` is the quoted schema name. An
# entry is never edited once released: a change is a new entry (and `SCHEMA_VERSION` + 1).
_MIGRATIONS: list[str] = [
    # 0 -> 1: tables, and the functions that make each request one statement.
    """
    CREATE TABLE {s}.namespaces (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE,
        generation bigint NOT NULL DEFAULT 0,
        used bigint NOT NULL DEFAULT 0
    );
    CREATE TABLE {s}.entries (
        ns bigint NOT NULL,
        key bytea NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (ns, key)
    );
    -- MAIN: compress a value if that helps, but keep it in the row rather than in the TOAST
    -- table unless it cannot fit a heap page. A 4 KiB page then costs one heap tuple instead of
    -- three TOAST chunks and their index entries: measured on a 128-key get, 1.2-1.4 ms vs
    -- 1.9-5.6 ms, and ~10% less server time per 128 x 4 KiB write (benchmarks/RESULTS.md).
    ALTER TABLE {s}.entries ALTER COLUMN value SET STORAGE MAIN;

    -- The id of a namespace, created on first use. The loop covers a concurrent creator:
    -- ON CONFLICT DO NOTHING waits for it, and the next SELECT (a new snapshot) sees its row.
    CREATE FUNCTION {s}.kv_namespace(p_name text) RETURNS bigint
    LANGUAGE plpgsql AS $$
    DECLARE
        v_id bigint;
    BEGIN
        LOOP
            SELECT n.id INTO v_id FROM {s}.namespaces n WHERE n.name = p_name;
            IF FOUND THEN
                RETURN v_id;
            END IF;
            INSERT INTO {s}.namespaces (name) VALUES (p_name)
                ON CONFLICT (name) DO NOTHING RETURNING id INTO v_id;
            IF FOUND THEN
                RETURN v_id;
            END IF;
        END LOOP;
    END $$;

    -- One atomic batch. Returns status 0 (applied), 1 (stale fence), 2 (over quota) or
    -- 3 (namespace missing); for 1 and 2 nothing was changed. `used_before`/`delta` let the caller
    -- apply the shared quota rule (and message) itself; the condition here is the same rule.
    CREATE FUNCTION {s}.kv_write(
        p_ns bigint, p_fence bigint, p_keys bytea[], p_values bytea[], p_deletes bytea[],
        p_max_used bigint,
        OUT status int, OUT gen bigint, OUT used_before bigint, OUT delta bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        v_old bigint;
        v_new bigint;
    BEGIN
        SELECT n.generation, n.used INTO gen, used_before
            FROM {s}.namespaces n WHERE n.id = p_ns FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            status := 3;
            RETURN;
        END IF;
        IF p_fence IS NOT NULL AND p_fence <> gen THEN
            status := 1;
            RETURN;
        END IF;
        -- A new statement, so a new snapshot: it sees every write committed before the lock.
        SELECT coalesce(sum(octet_length(e.key) + octet_length(e.value)), 0) INTO v_old
            FROM {s}.entries e WHERE e.ns = p_ns AND e.key = ANY (p_keys || p_deletes);
        SELECT coalesce(sum(octet_length(t.k) + octet_length(t.v)), 0) INTO v_new
            FROM unnest(p_keys, p_values) AS t(k, v);
        delta := v_new - v_old;
        IF delta > 0 AND used_before + delta > p_max_used THEN
            status := 2;
            RETURN;
        END IF;
        IF cardinality(p_deletes) > 0 THEN
            DELETE FROM {s}.entries e WHERE e.ns = p_ns AND e.key = ANY (p_deletes);
        END IF;
        IF cardinality(p_keys) > 0 THEN
            INSERT INTO {s}.entries AS e (ns, key, value)
                SELECT p_ns, t.k, t.v FROM unnest(p_keys, p_values) AS t(k, v)
                ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value;
        END IF;
        IF delta <> 0 THEN
            UPDATE {s}.namespaces SET used = used_before + delta WHERE id = p_ns;
        END IF;
        status := 0;
    END $$;

    -- Delete [p_start, p_end), or everything when both are NULL (drop); fenced like kv_write.
    CREATE FUNCTION {s}.kv_delete_range(
        p_ns bigint, p_fence bigint, p_start bytea, p_end bytea,
        OUT status int, OUT gen bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        v_freed bigint;
    BEGIN
        SELECT n.generation INTO gen FROM {s}.namespaces n WHERE n.id = p_ns FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            status := 3;
            RETURN;
        END IF;
        IF p_fence IS NOT NULL AND p_fence <> gen THEN
            status := 1;
            RETURN;
        END IF;
        status := 0;
        IF p_start IS NULL THEN
            DELETE FROM {s}.entries e WHERE e.ns = p_ns;
            UPDATE {s}.namespaces SET used = 0 WHERE id = p_ns AND used <> 0;
        ELSIF p_start < p_end THEN
            WITH d AS (
                DELETE FROM {s}.entries e
                WHERE e.ns = p_ns AND e.key >= p_start AND e.key < p_end
                RETURNING octet_length(e.key) + octet_length(e.value) AS n
            )
            SELECT coalesce(sum(d.n), 0) INTO v_freed FROM d;
            IF v_freed <> 0 THEN
                UPDATE {s}.namespaces SET used = used - v_freed WHERE id = p_ns;
            END IF;
        END IF;
    END $$;
    """,
]

# Connection parameters pagekv sets unless the URL does: a dead or unreachable server must end in
# an error, not a hang. keepalives detect a peer that vanished while we wait for an answer;
# tcp_user_timeout bounds how long sent data may stay unacknowledged; connect_timeout bounds each
# host's attempt (libpq's minimum is 2 s). A store writes, so it connects only to a host that
# takes writes: with several hosts, to whichever is the primary now.
_LIBPQ_DEFAULTS = {
    "target_session_attrs": "read-write",
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
    "application_name": "pagekv",
}


@dataclass(frozen=True)
class PostgresOptions:
    """The pagekv-side options of a `postgresql://` URL (removed before libpq sees the URL).

    `schema`: the PostgreSQL schema holding pagekv's tables. `pool_min`: connections made when
    the store opens (so that opening fails on an unreachable server); `pool_max`: the most at
    once. `pool_timeout`: seconds a request waits for a connection — retrying every host while a
    failover is under way — before `KvUnavailable`. `statement_timeout_ms`: server-side limit per
    statement (a timed-out statement is rolled back, so it is `KvUnavailable`, never applied; a
    commit waiting for a synchronous standby is not a statement any more, and it does not cover
    that wait). `request_timeout_ms`: the client's own limit per request, from sending it to its
    answer (a server that stops answering enforces nothing): past it the request is abandoned,
    a read as `KvUnavailable`, a write as `KvIndeterminate`. By default 5 s more than
    `statement_timeout_ms` (or than its default where that is 0, off), so that on a server that
    answers, the server's limit ends a slow statement first and rolls it back.
    """

    schema: str = "pagekv"
    pool_min: int = 1
    pool_max: int = 16
    pool_timeout: float = 10.0
    statement_timeout_ms: int = 60_000
    request_timeout_ms: int = 65_000
    libpq: dict[str, str] = field(default_factory=dict)


def parse_postgres_url(url: str) -> tuple[str, PostgresOptions]:
    """Split a `postgresql://` or `postgres://` URL into the libpq URL and pagekv's options.

    Errors name the option and the servers (`_where`), never the whole URL: its query may hold
    libpq's `password=`."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {redact_url(url)!r}")
    known: dict[str, Any] = {}
    libpq: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        try:
            match name:
                case "schema":
                    if not _SCHEMA_NAME.match(value):
                        raise ValueError("expected an identifier of letters, digits and _")
                    known["schema"] = value
                case "pool_min" | "pool_max" | "statement_timeout_ms" | "request_timeout_ms":
                    known[name] = int(value)
                case "pool_timeout":
                    known[name] = float(value)
                case "target_session_attrs":
                    if value not in _WRITABLE_SESSIONS:
                        raise ValueError(
                            "pagekv writes to its store, so only a host that takes writes will "
                            f"do: use one of {', '.join(_WRITABLE_SESSIONS)}"
                        )
                    libpq[name] = value
                case _:
                    libpq[name] = value
        except ValueError as e:
            raise ValueError(f"bad option {name}={value!r} for {_where(url)}: {e}") from None
    statement_timeout_ms = known.get("statement_timeout_ms", _DEFAULT_STATEMENT_TIMEOUT_MS)
    known.setdefault(
        "request_timeout_ms", (statement_timeout_ms or _DEFAULT_STATEMENT_TIMEOUT_MS) + 5_000
    )
    options = PostgresOptions(**known, libpq=libpq)
    if not 0 <= options.pool_min <= options.pool_max or options.pool_max < 1:
        raise ValueError(f"need 0 <= pool_min <= pool_max and pool_max >= 1 for {_where(url)}")
    if options.pool_timeout <= 0 or options.statement_timeout_ms < 0:
        raise ValueError(
            f"pool_timeout must be > 0 and statement_timeout_ms >= 0 for {_where(url)}"
        )
    if options.request_timeout_ms <= 0:
        raise ValueError(
            f"request_timeout_ms must be > 0 (every request has a deadline), not "
            f"{options.request_timeout_ms}, for {_where(url)}"
        )
    base = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(libpq), ""))
    return base, options


_WRITABLE_SESSIONS = ("read-write", "primary")
_DEFAULT_STATEMENT_TIMEOUT_MS = PostgresOptions.statement_timeout_ms

# The timeline the server writes its WAL on: the first 8 hex digits of the current WAL file's
# name. Promoting a standby starts a new one; restarting a server keeps it. (Unprivileged.)
_TIMELINE = "SELECT pg_walfile_name(pg_current_wal_lsn())"


def _where(url: str) -> str:
    """The servers and database of a libpq URL, without credentials, for error messages:
    `postgresql://h1:5432,h2:5433/db` (one host or several; `?host=&port=` when the URL gives
    them there instead)."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        query = dict(parse_qsl(parts.query))
        shown: dict[str, str] = {k: query[k] for k in ("host", "port") if k in query}
        if not shown:
            return f"postgresql://localhost{parts.path or '/'}"
        return f"postgresql://{parts.path or '/'}?{urlencode(shown, safe='/,')}"
    return f"postgresql://{hosts}{parts.path or '/'}"


class PostgresStore:
    """All namespaces of one PostgreSQL schema. Thread-safe; one connection pool per store.

    Several stores — in this process or on other hosts — may share one server and schema: every
    guarantee (atomic batches, fencing, exact quota) is enforced by the server.
    """

    def __init__(self, url: str, *, limits: KvLimits | None = None, create: bool = True) -> None:
        self.limits = limits or KvLimits()
        if self.limits.max_key_bytes > _MAX_KEY_BYTES:
            raise ValueError(
                f"the PostgreSQL store holds keys of up to {_MAX_KEY_BYTES} bytes, "
                f"not max_key_bytes={self.limits.max_key_bytes}"
            )
        if self.limits.max_name_bytes > _MAX_NAME_BYTES:
            raise ValueError(
                f"the PostgreSQL store holds namespace names of up to {_MAX_NAME_BYTES} bytes, "
                f"not max_name_bytes={self.limits.max_name_bytes}"
            )
        libpq_url, self.options = parse_postgres_url(url)
        self.where = _where(libpq_url)
        self._closed = False
        opts = self.options
        try:
            self._hosts = HostOrder(libpq_url)
        except (psycopg.ProgrammingError, ValueError) as e:
            raise ValueError(f"bad PostgreSQL URL for {self.where}: {e}") from None
        kwargs: dict[str, Any] = {
            key: value for key, value in _LIBPQ_DEFAULTS.items() if key not in opts.libpq
        }
        if opts.statement_timeout_ms:
            timeouts = f"-c statement_timeout={opts.statement_timeout_ms}"
            kwargs["options"] = f"{opts.libpq.get('options', '')} {timeouts}".strip()
        # autocommit: each request is one statement, committed by the server at its Sync.
        kwargs["autocommit"] = True
        self._connect_kwargs = kwargs
        self._deadlines = Deadlines(opts.request_timeout_ms / 1000)
        self._pool: ConnectionPool[_Connection] = ConnectionPool(
            self._connect,
            min_size=opts.pool_min,
            max_size=opts.pool_max,
            timeout=opts.pool_timeout,
        )
        self._sql = _Statements(sql.Identifier(opts.schema))
        try:
            try:
                self._pool.open()
            except NoConnection as e:
                raise self._unreachable(e) from e
            if create:
                self._ensure_schema()
            else:
                self._require_schema()
        except BaseException:
            self.close()
            raise

    # --- connections ---------------------------------------------------------------------

    def _connect(self) -> _Connection:
        """One new connection, to the host that answered last if it still takes writes, else to
        the next one that does; it records the commits the server warns were not replicated.
        Its first request, which learns the timeline, has the deadline of any other: a server
        that froze after accepting it fails the attempt (`OperationalError`, retried)."""
        conn = _Connection.connect(self._hosts.conninfo(), **self._connect_kwargs)
        try:
            conn.pagekv_host = f"{conn.info.host}:{conn.info.port}"
            conn.pagekv_socket = socket.socket(fileno=os.dup(conn.pgconn.socket))
            conn.pagekv_cancel = _cancel_connection(conn)
            with self._deadline(conn):
                ((walfile,),) = conn.execute(_TIMELINE).fetchall()
        except BaseException:
            conn.close()
            raise
        conn.pagekv_timeline = int(walfile[:8], 16)
        self._hosts.answered(conn)
        conn.pagekv_unreplicated = []
        conn.add_notice_handler(partial(_note_unreplicated, conn.pagekv_unreplicated))
        return conn

    @contextmanager
    def _deadline(self, conn: _Connection) -> Iterator[Request]:
        """Run requests on `conn` under the deadline; an error of an abandoned one becomes
        `_Abandoned` (an `OperationalError`), and the connection is closed."""
        request = self._deadlines.start(conn.pagekv_socket, conn.pagekv_cancel)
        try:
            yield request
        except psycopg.Error as e:
            if self._deadlines.finish(request):
                raise _Abandoned(self._no_answer(conn)) from e
            raise
        finally:
            if self._deadlines.finish(request):
                conn.close()

    @contextmanager
    def _lent(self) -> Iterator[tuple[_Connection, Request]]:
        """A pooled connection (see `_acquire`) for requests under the deadline, given back
        after them; closed instead if one of them was abandoned."""
        conn = self._acquire()
        try:
            with self._deadline(conn) as request:
                yield conn, request
        finally:
            self._pool.putconn(conn)

    def _no_answer(self, conn: _Connection) -> str:
        return (
            f"no answer from PostgreSQL at {conn.pagekv_host} ({self.where}) within "
            f"{self._deadlines.timeout:g} s (request_timeout_ms): the request was abandoned and "
            "its connection closed"
        )

    def _acquire(self) -> _Connection:
        """A pooled connection that was idle and healthy, or a new one; else `KvUnavailable`
        (nothing sent)."""
        if self._closed:
            raise KvUnavailable(f"the store for {self.where} is closed")
        try:
            return self._pool.getconn()
        except NoConnection as e:
            raise self._unreachable(e) from e
        except PoolClosed:
            raise KvUnavailable(f"the store for {self.where} is closed") from None
        except psycopg.Error as e:
            raise KvUnavailable(f"PostgreSQL at {self.where} is unreachable: {e}") from e

    def _unreachable(self, error: NoConnection) -> KvUnavailable:
        last = error.last_error or "every connection busy"
        return KvUnavailable(
            f"PostgreSQL at {self.where} is unreachable: no connection within "
            f"{error.waited:g} s ({last}); nothing was sent"
        )

    def _run(
        self,
        op: str,
        query: str,
        params: Sequence[object],
        *,
        write: bool,
        timeline: int | None = None,
    ) -> tuple[list[Any], int]:
        """Send one statement (one round trip); return its rows and the server's timeline,
        mapping failures to KV errors. With `timeline`, a connection to a server on another
        timeline sends nothing and raises `_OtherTimeline` (see `PostgresNamespace`).

        Invariant: on an autocommit connection one `execute` is one implicit transaction, so an
        error reported on a connection that is still usable means it was rolled back.
        """
        with self._lent() as (conn, request):
            if timeline is not None and conn.pagekv_timeline != timeline:
                raise _OtherTimeline(conn.pagekv_timeline, f"{conn.pagekv_host} ({self.where})")
            try:
                rows = _cursor(conn).execute(query, params).fetchall()
            except psycopg.Error as e:
                if self._deadlines.finish(request):
                    raise self._abandoned(op, conn, write) from e
                broken = conn.broken or conn.closed
                if write and broken:
                    raise KvIndeterminate(
                        f"{op} was sent to PostgreSQL at {conn.pagekv_host} ({self.where}) but "
                        f"the connection was lost before the answer ({e}); it may or may not "
                        "have been applied"
                    ) from e
                state = "connection lost" if broken else f"SQLSTATE {e.sqlstate}"
                raise KvUnavailable(
                    f"{op} failed on PostgreSQL at {conn.pagekv_host} ({self.where}) ({state}: "
                    f"{e}); nothing was applied"
                ) from e
            if conn.pagekv_unreplicated:
                warning = "; ".join(conn.pagekv_unreplicated)
                conn.pagekv_unreplicated.clear()
                if write:
                    raise KvIndeterminate(
                        f"{op} was committed by PostgreSQL at {conn.pagekv_host} ({self.where}), "
                        f"which warned that it may not have reached its synchronous standby "
                        f"({warning}): a failover may undo it"
                    )
            return rows, conn.pagekv_timeline

    def _abandoned(self, op: str, conn: _Connection, write: bool) -> KvError:
        """The error of a request abandoned at its deadline: a write may have committed."""
        if write:
            return KvIndeterminate(
                f"{op}: {self._no_answer(conn)}. It may or may not have been applied: the server "
                "may have stopped answering, or the commit may be waiting for a synchronous "
                "standby (with none streaming, every commit waits)"
            )
        return KvUnavailable(f"{op}: {self._no_answer(conn)}; nothing was written")

    # --- schema ---------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        """Create or upgrade the schema; refuse one newer than this code knows."""
        schema = self.options.schema
        try:
            version = self._schema_version_fast()
            if version == SCHEMA_VERSION:
                return
            with self._lent() as (conn, _), conn.transaction():
                # One creator/upgrader at a time, across every host sharing the server.
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"pagekv schema {schema}",),
                )
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(self._sql.s))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {}.schema_version (version int NOT NULL)"
                    ).format(self._sql.s)
                )
                rows = conn.execute(
                    sql.SQL("SELECT version FROM {}.schema_version").format(self._sql.s)
                ).fetchall()
                version = rows[0][0] if rows else 0
                self._refuse_newer(version)
                for step in range(version, SCHEMA_VERSION):
                    conn.execute(sql.SQL(_MIGRATIONS[step]).format(s=self._sql.s))
                if not rows:
                    conn.execute(
                        sql.SQL("INSERT INTO {}.schema_version VALUES (%s)").format(self._sql.s),
                        (SCHEMA_VERSION,),
                    )
                elif version != SCHEMA_VERSION:
                    conn.execute(
                        sql.SQL("UPDATE {}.schema_version SET version = %s").format(self._sql.s),
                        (SCHEMA_VERSION,),
                    )
        except psycopg.Error as e:
            raise KvUnavailable(
                f"cannot set up the pagekv schema {schema!r} on PostgreSQL at {self.where}: {e}"
            ) from e

    def _require_schema(self) -> None:
        """For tools that only read (`create=False`): the schema must be there, at this code's
        version; nothing is created or upgraded under the servers that use it."""
        try:
            version = self._schema_version_fast()
        except psycopg.Error as e:
            raise KvUnavailable(
                f"cannot read the pagekv schema on PostgreSQL at {self.where}: {e}"
            ) from e
        schema = self.options.schema
        if version is None:
            raise FileNotFoundError(
                f"no pagekv store (schema {schema!r}) on PostgreSQL at {self.where}"
            )
        if version != SCHEMA_VERSION:
            raise FileNotFoundError(
                f"the pagekv schema {schema!r} on PostgreSQL at {self.where} is version {version}, "
                f"older than this pagekv's {SCHEMA_VERSION}: a server of this pagekv upgrades it "
                "when it opens the store; a tool that only reads does not"
            )

    def _schema_version_fast(self) -> int | None:
        """The stored version in one round trip, or None if the schema is not there yet."""
        try:
            with self._lent() as (conn, _):
                rows = conn.execute(
                    sql.SQL("SELECT version FROM {}.schema_version").format(self._sql.s)
                ).fetchall()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        version = rows[0][0] if rows else None
        if version is not None:
            self._refuse_newer(version)
        return version

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"the pagekv schema {self.options.schema!r} on PostgreSQL at {self.where} is "
                f"version {version}; this pagekv supports up to version {SCHEMA_VERSION}. "
                "Upgrade pagekv on this host (never downgrade a shared store)."
            )

    # --- the store ------------------------------------------------------------------------

    def namespace(self, actor_id: object) -> PostgresNamespace:
        name = check_name(self.limits, actor_id)
        rows, timeline = self._run("namespace", self._sql.namespace, (name,), write=True)
        return PostgresNamespace(name, self, rows[0][0], timeline)

    def actor_ids(self) -> list[str]:
        rows, _ = self._run("actor_ids", self._sql.actor_ids, (), write=False)
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close every pooled connection; later requests raise `KvUnavailable`. A request
        still in flight keeps its deadline."""
        self._closed = True
        self._pool.close()
        self._deadlines.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FailedOver(FenceMismatch):
    """A fenced write refused, unsent, because the server failed over (a standby was promoted:
    a new timeline) since the namespace was taken over. An instance must reopen (take over
    again) rather than write on what it believes is there: with asynchronous replication the
    new primary may lack its last commits. A `FenceMismatch`, so that whatever stops a stale
    instance stops this one; `current` is the namespace's generation on the new primary."""

    def __init__(self, fence: int, current: int, was: int, now: int, where: str) -> None:
        KvError.__init__(
            self,
            f"fence {fence} was taken over on timeline {was} of PostgreSQL; {where} is on "
            f"timeline {now} (it failed over since, and what was written under that fence may "
            f"have been lost); nothing was written: take the namespace (at generation {current}) "
            "over again",
        )
        self.fence = fence
        self.current = current
        self.was = was
        self.now = now


@dataclass
class _OtherTimeline(Exception):
    """`_run` refused to send a fenced write to a server on another timeline."""

    timeline: int
    where: str


class _Abandoned(psycopg.OperationalError):
    """A request of the store's own (the schema's, a new connection's first) was abandoned at
    its deadline."""


class _Connection(psycopg.Connection[Any]):
    """A pooled connection: its one cursor, the host it reached and that server's timeline, the
    warnings of not replicated commits the server sent since the last request
    (`_note_unreplicated`), and for its requests' deadlines (`pg_deadline`) a socket on a
    duplicate of libpq's descriptor and the cancel connection of its backend.

    The duplicate is closed with the connection: it holds the TCP connection open until then.
    """

    pagekv_cursor: psycopg.Cursor[Any] | None = None
    pagekv_host: str = ""
    pagekv_timeline: int = 0
    pagekv_unreplicated: list[str]
    pagekv_socket: socket.socket
    pagekv_cancel: PGcancelConn | None = None

    def close(self) -> None:
        super().close()
        sock = getattr(self, "pagekv_socket", None)
        if sock is not None:
            sock.close()


def _cancel_connection(conn: _Connection) -> PGcancelConn | None:
    """A cancel connection for `conn`'s backend, made now while this thread owns `conn` (it
    is used after the request is abandoned, from another thread); None before libpq 17, where
    a cancel cannot be bounded in time, and so is not sent."""
    if not psycopg.capabilities.has_cancel_safe():
        return None
    return conn.pgconn.cancel_conn()


def _cursor(conn: _Connection) -> psycopg.Cursor[Any]:
    """The connection's one binary cursor, made once: a new cursor per request costs more CPU
    than the rest of the client side of a small write. (A connection serves one thread at a
    time — the pool hands it out exclusively — so one cursor per connection is safe.)"""
    cur = conn.pagekv_cursor
    if cur is None or cur.closed:
        cur = conn.cursor(binary=True)
        conn.pagekv_cursor = cur
    return cur


def _note_unreplicated(warnings: list[str], notice: psycopg.errors.Diagnostic) -> None:
    """Keep a server warning that a commit's wait for its synchronous standby was cancelled.

    Recognised by the server source file that raises it, which no translation changes; both of
    its messages say "The transaction has already committed locally, but might not have been
    replicated to the standby."
    """
    if notice.source_file == "syncrep.c":
        warnings.append(f"{notice.severity_nonlocalized}: {notice.message_primary}")


class _Statements:
    """The SQL of one schema, formatted once (psycopg caches the parsed form by string)."""

    def __init__(self, s: sql.Identifier) -> None:
        self.s = s

        def q(text: str) -> str:
            return sql.SQL(text).format(s=s).as_string(None)

        self.namespace = q("SELECT {s}.kv_namespace(%b::text)")
        # "C": code point order, as the other stores sort, whatever the database's collation.
        self.actor_ids = q('SELECT name FROM {s}.namespaces ORDER BY name COLLATE "C"')
        self.write = q(
            "SELECT status, gen, used_before, delta FROM {s}.kv_write("
            "%b::bigint, %b::bigint, %b::bytea[], %b::bytea[], %b::bytea[], %b::bigint)"
        )
        self.delete_range = q(
            "SELECT status, gen FROM {s}.kv_delete_range(%b::bigint, %b::bigint, %b::bytea, "
            "%b::bytea)"
        )
        self.get = q("SELECT key, value FROM {s}.entries WHERE ns = %b AND key = ANY (%b::bytea[])")
        self.takeover = q(
            "UPDATE {s}.namespaces SET generation = generation + 1 WHERE id = %b "
            "RETURNING generation"
        )
        self.head = q("SELECT generation, used FROM {s}.namespaces WHERE id = %b")
        # One statement per bound combination and direction, so each plan is an index range scan.
        self.list: dict[tuple[bool, bool, bool], str] = {}
        for has_start in (False, True):
            for has_end in (False, True):
                for reverse in (False, True):
                    where = "ns = %b"
                    if has_start:
                        where += " AND key >= %b::bytea"
                    if has_end:
                        where += " AND key < %b::bytea"
                    order = "DESC" if reverse else "ASC"
                    self.list[has_start, has_end, reverse] = q(
                        f"SELECT key, value FROM {{s}}.entries WHERE {where} "
                        f"ORDER BY key {order} LIMIT %b::bigint"
                    )


class PostgresNamespace(KvNamespace):
    """One actor's namespace: every method is one statement, i.e. one server round trip.

    A fenced write is sent only to a server on the timeline where this namespace was taken over
    (or, before any takeover, looked up). A promoted standby starts a new timeline; after an
    asynchronous one, the new primary may lack the last commits an instance was told had
    succeeded, and an instance that went on writing its in-memory view on top of that older
    state would corrupt its database (measured: a page below EOF missing at the next open). So
    every fenced write after a failover is refused (`FailedOver`) until the namespace is taken
    over again — the VFS dies, its reopen takes over on the new timeline and reads what is there.
    With synchronous replication nothing is lost, and the cost is one reopen per open database
    and failover.
    """

    def __init__(self, actor_id: str, store: PostgresStore, ns_id: int, timeline: int) -> None:
        super().__init__(actor_id, store.limits)
        self._store = store
        self._id = ns_id
        self._sql = store._sql
        self._timeline = timeline

    def _run_fenced(self, op: str, query: str, params: Sequence[object], fence: int | None) -> Any:
        """The one row of a data-changing statement, sent only to this namespace's timeline
        when fenced (`FailedOver` otherwise, after reading the generation there)."""
        try:
            (row,), _ = self._store._run(
                op, query, params, write=True, timeline=None if fence is None else self._timeline
            )
        except _OtherTimeline as other:
            assert fence is not None
            raise FailedOver(
                fence, self.generation(), self._timeline, other.timeline, other.where
            ) from None
        return row

    def _missing(self) -> KvUnavailable:
        return KvUnavailable(
            f"namespace {self.actor_id!r} vanished from PostgreSQL at {self._store.where}"
        )

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        rows, _ = self._store._run("get", self._sql.get, (self._id, keys), write=False)
        found = dict(rows)
        return [found.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        query = self._sql.list[start is not None, end is not None, reverse]
        params: list[object] = [self._id]
        params += [b for b in (start, end) if b is not None]
        params.append(limit)
        rows, _ = self._store._run("list", query, params, write=False)
        return [(k, v) for k, v in rows]

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        params = (
            self._id,
            fence,
            list(batch.puts),
            list(batch.puts.values()),
            list(batch.deletes),
            self._limits.max_storage_bytes,
        )
        status, generation, used, delta = self._run_fenced("write", self._sql.write, params, fence)
        self._check_status(status, fence, generation)
        if status == _OVER_QUOTA:
            check_quota(self._limits, used, delta)  # raises StorageQuotaExceeded
            raise AssertionError(f"server refused a write within quota: {used} + {delta}")

    def _check_status(self, status: int, fence: int | None, generation: int | None) -> None:
        if status == _MISSING:
            raise self._missing()
        if status == _FENCED:
            assert generation is not None
            check_fence(fence, generation)  # raises FenceMismatch
            raise AssertionError(f"server refused fence {fence} at generation {generation}")

    def _delete_range(self, start: bytes | None, end: bytes | None, fence: int | None) -> None:
        status, generation = self._run_fenced(
            "delete_range", self._sql.delete_range, (self._id, fence, start, end), fence
        )
        self._check_status(status, fence, generation)

    def takeover(self) -> int:
        rows, timeline = self._store._run("takeover", self._sql.takeover, (self._id,), write=True)
        if not rows:
            raise self._missing()
        self._timeline = timeline
        return int(rows[0][0])

    def _head(self) -> tuple[int, int]:
        rows, _ = self._store._run("head", self._sql.head, (self._id,), write=False)
        if not rows:
            raise self._missing()
        return int(rows[0][0]), int(rows[0][1])

    def generation(self) -> int:
        return self._head()[0]

    def used_bytes(self) -> int:
        return self._head()[1]

    def _drop(self, fence: int | None) -> None:
        self._delete_range(None, None, fence)
