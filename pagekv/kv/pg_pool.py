"""Connections to a PostgreSQL service of one or more hosts, for `PostgresStore`.

Why not `psycopg_pool`: it reconnects from background threads with an exponential backoff that
starts at 1 s and doubles, so after a failover the first request could wait seconds past the
moment the new primary accepts writes. Here a request that finds no idle connection makes one
itself, retrying with a short bounded backoff (`RETRY_FIRST` doubling to `RETRY_MOST`) until its
deadline: a request resumes at most `RETRY_MOST` (plus one connection) after a server is back,
and when it gives up it says why the last attempt failed.

Each attempt runs in a thread of its own, which the request waits for only until its deadline:
libpq gives each host `connect_timeout` (at least 2 s), so one attempt on a URL of hosts that
accept connections and never answer would otherwise overrun the deadline by that much per host.
An attempt given up on keeps the pool slot of its request until it ends, and then gives its
connection to the idle ones (the next request takes it) or, having failed, frees the slot.

Invariants:

- At most `max_size` connections exist (idle, lent out, or being connected, by a request or by
  an attempt its request gave up on) at any time.
- `getconn` returns or raises by its deadline, whatever the servers do.
- A connection handed out was idle with nothing to read, or is new: an idle connection with bytes
  waiting has been closed or told to terminate by its server (a restart or a failover sends
  exactly that), so it is discarded *before* anything is sent on it.
- A connection given back broken, closed or inside a transaction is discarded, never reused.
- With several hosts (`postgresql://h1:p1,h2:p2/db`), each new connection tries the host that
  answered last first, then the others in the URL's order: after a failover only the first new
  connection pays for reaching the lost primary (`connect_timeout` when it hangs rather than
  refuses); `target_session_attrs` makes libpq skip a host that cannot take writes.
"""

from __future__ import annotations

import random
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

RETRY_FIRST = 0.02
"""Seconds before the second connection attempt of a request; each retry waits twice as long."""
RETRY_MOST = 0.25
"""The longest wait between two connection attempts of a request."""

_Conn = TypeVar("_Conn", bound=psycopg.Connection[Any])


class NoConnection(Exception):
    """No connection within the deadline (nothing was sent); `last_error` says why, if known."""

    def __init__(self, waited: float, last_error: BaseException | None) -> None:
        self.waited = waited
        self.last_error = last_error
        super().__init__(f"no connection within {waited:g} s ({last_error or 'pool full'})")


class PoolClosed(Exception):
    """The pool was closed; nothing was sent."""


@dataclass
class PoolCounts:
    """What the pool has done since it was made: `connected` new connections, `failed`
    connection attempts, `discarded` connections found dead or given back unusable."""

    connected: int = 0
    failed: int = 0
    discarded: int = 0


@dataclass(eq=False)
class _Attempt(Generic[_Conn]):
    """One connection attempt, made in a thread of its own (guarded by the pool's lock).
    `given_up`: its request stopped waiting, so the attempt owns the request's slot."""

    done: threading.Event = field(default_factory=threading.Event)
    conn: _Conn | None = None
    error: BaseException | None = None
    given_up: bool = False


class _AttemptRunsOn(Exception):
    """A request gave up on the connection attempt it was waiting for, whose slot is the
    attempt's now."""


@dataclass(frozen=True)
class _Host:
    host: str
    port: str
    hostaddr: str


class HostOrder:
    """The hosts of a libpq URL, the one that answered last first.

    libpq lists hosts, ports and host addresses as parallel comma-separated lists, where a single
    port (or none) applies to every host; anything else that does not line up is refused here,
    as libpq would refuse it at every connection.
    """

    def __init__(self, url: str) -> None:
        self._params = conninfo_to_dict(url)
        hosts = str(self._params.get("host") or "").split(",")
        ports = str(self._params.get("port") or "").split(",")
        addrs = str(self._params.get("hostaddr") or "").split(",")
        count = len(hosts) if self._params.get("host") else len(addrs)
        for what, values in (("hosts", hosts), ("ports", ports), ("hostaddrs", addrs)):
            if len(values) == 1:
                values *= count
            if len(values) != count:
                raise ValueError(
                    f"the URL names {count} hosts but {len(values)} {what}; give one for each "
                    "host, or one for all"
                )
        for port in ports:
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"port {port!r} is not a TCP port number (1 to 65535)")
        self._hosts = [_Host(h, p, a) for h, p, a in zip(hosts, ports, addrs, strict=True)]
        self._lock = threading.Lock()

    def conninfo(self) -> str:
        """The URL's parameters, with the hosts in the order to try them now."""
        if len(self._hosts) == 1:
            return make_conninfo("", **self._params)
        with self._lock:
            hosts = list(self._hosts)
        params = dict(self._params)
        for name in ("host", "port", "hostaddr"):
            values = [getattr(h, name) for h in hosts]
            if any(values):
                params[name] = ",".join(values)
        return make_conninfo("", **params)

    def answered(self, conn: psycopg.Connection[Any]) -> None:
        """Remember the host `conn` reached, to try it first next time."""
        info = conn.info
        host, port, addr = info.host, str(info.port), info.hostaddr
        with self._lock:
            for i, h in enumerate(self._hosts):
                if (h.host == host or (h.hostaddr and h.hostaddr == addr)) and (
                    not h.port or h.port == port
                ):
                    if i:
                        self._hosts.insert(0, self._hosts.pop(i))
                    return


class ConnectionPool(Generic[_Conn]):
    """At most `max_size` connections, made on demand by the requests that need them.

    `connect()` opens one connection (raising `psycopg.OperationalError` when it cannot, which is
    retried); `timeout` is how long `getconn` waits by default. `open()` makes `min_size`
    connections at once, so that a store on an unreachable server fails when it is opened.
    Thread-safe.
    """

    def __init__(
        self,
        connect: Callable[[], _Conn],
        *,
        min_size: int,
        max_size: int,
        timeout: float,
    ) -> None:
        self._connect = connect
        self._min_size = min_size
        self._max_size = max_size
        self.timeout = timeout
        self._idle: list[_Conn] = []  # the most recently returned last
        self._size = 0  # idle + lent + being connected
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self.last_error: BaseException | None = None
        self.counts = PoolCounts()

    def open(self) -> None:
        """Make `min_size` connections now (`NoConnection` if that takes longer than `timeout`)."""
        made: list[_Conn] = []
        try:
            for _ in range(self._min_size):
                made.append(self.getconn())
        finally:
            for conn in made:
                self.putconn(conn)

    def getconn(self, timeout: float | None = None) -> _Conn:
        """An idle healthy connection, or a new one; `NoConnection` or `PoolClosed` if none."""
        waited = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + waited
        dead: list[_Conn] = []
        try:
            with self._cond:
                while True:
                    if self._closed:
                        raise PoolClosed
                    while self._idle:
                        conn = self._idle.pop()
                        if _looks_alive(conn):
                            return conn
                        dead.append(conn)
                        self._size -= 1
                        self.counts.discarded += 1
                    if self._size < self._max_size:
                        self._size += 1
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NoConnection(waited, self.last_error)
                    self._cond.wait(remaining)
        finally:
            for conn in dead:
                conn.close()
        try:
            return self._new_connection(waited, deadline)
        except _AttemptRunsOn:
            raise NoConnection(waited, self.last_error) from None
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise

    def _new_connection(self, waited: float, deadline: float) -> _Conn:
        """Connect, retrying with a bounded backoff until `deadline`. A loop of its own, not
        tenacity's: it counts and keeps each failure under the pool's lock and gives up before a
        wait that would pass the deadline, as `NoConnection`; tenacity would need a callback for
        each of those and a wait of its own (its jitter adds, this one scales), no shorter."""
        delay = RETRY_FIRST
        while True:
            try:
                conn = self._attempt(deadline)
            except psycopg.OperationalError as e:
                with self._cond:
                    self.last_error = e
                    self.counts.failed += 1
                pause = delay * random.uniform(0.8, 1.2)
                if time.monotonic() + pause >= deadline:
                    raise NoConnection(waited, e) from e
                time.sleep(pause)
                delay = min(delay * 2, RETRY_MOST)
                continue
            with self._cond:
                self.last_error = None
                self.counts.connected += 1
                closed = self._closed
            if closed:
                conn.close()
                raise PoolClosed
            return conn

    def _attempt(self, deadline: float) -> _Conn:
        """One `connect()`, in a thread of its own, waited for until `deadline`; past it
        `_AttemptRunsOn` (the attempt keeps the slot: see `_run_attempt`)."""
        attempt: _Attempt[_Conn] = _Attempt()
        threading.Thread(
            target=self._run_attempt, args=(attempt,), name="pagekv-pg-connect", daemon=True
        ).start()
        attempt.done.wait(max(0.0, deadline - time.monotonic()))
        with self._cond:
            if not attempt.done.is_set():
                attempt.given_up = True
                self.last_error = TimeoutError(
                    "a connection attempt was still waiting for a server to answer "
                    "(libpq waits connect_timeout for each host)"
                )
                raise _AttemptRunsOn
        if attempt.error is not None:
            raise attempt.error
        assert attempt.conn is not None
        return attempt.conn

    def _run_attempt(self, attempt: _Attempt[_Conn]) -> None:
        conn: _Conn | None = None
        error: BaseException | None = None
        try:
            conn = self._connect()
        except BaseException as e:  # handed to the request, or recorded if it gave up
            error = e
        with self._cond:
            attempt.conn, attempt.error = conn, error
            attempt.done.set()
            if not attempt.given_up:
                return
            if conn is not None and not self._closed:
                self._idle.append(conn)
                self.counts.connected += 1
                self.last_error = None
                self._cond.notify()
                return
            self._size -= 1
            if error is not None:
                self.counts.failed += 1
                self.last_error = error
            self._cond.notify()
        if conn is not None:
            conn.close()

    def putconn(self, conn: _Conn) -> None:
        """Give back a connection from `getconn`; an unusable one is closed and its slot freed."""
        usable = (
            not conn.closed
            and not conn.broken
            and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        )
        with self._cond:
            if usable and not self._closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            self._size -= 1
            if not usable:
                self.counts.discarded += 1
            self._cond.notify()
        conn.close()

    def close(self) -> None:
        """Close the idle connections now and each lent one when it is given back; later
        `getconn` calls raise `PoolClosed`."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


def _looks_alive(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection can take a request, checked without a round trip.

    An idle connection has nothing to read unless the server closed it or sent a termination
    notice (e.g. at shutdown, restart or failover); either way it is unusable, and finding out
    *before* sending is what keeps that case `KvUnavailable` instead of indeterminate.
    """
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable
