"""Connections to a PostgreSQL service of one or more hosts, for `PostgresStore`.

Why not `psycopg_pool`: it reconnects from background threads with an exponential backoff that
starts at 1 s and doubles, so after a failover the first request could wait seconds past the
moment the new primary accepts writes. Here a request that finds no idle connection makes one
itself, in its own thread, retrying with a short bounded backoff (`RETRY_FIRST` doubling to
`RETRY_MOST`) until its deadline: a request resumes at most `RETRY_MOST` (plus one connection)
after a server is back, and when it gives up it says why the last attempt failed.

Invariants:

- At most `max_size` connections exist (idle, lent out, or being connected) at any time.
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
from dataclasses import dataclass
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
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise

    def _new_connection(self, waited: float, deadline: float) -> _Conn:
        """Connect, retrying with a bounded backoff until `deadline`."""
        delay = RETRY_FIRST
        while True:
            try:
                conn = self._connect()
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
