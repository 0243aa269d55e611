"""Client-side deadlines for the requests of a PostgreSQL store (`PostgresStore`).

Why: a server that stops answering but keeps its TCP connections open — a frozen VM or process,
or a live one whose commits wait for a synchronous standby that is gone — holds a request for as
long as that lasts. `statement_timeout` is enforced by the server (a frozen one enforces
nothing) and does not cover a commit's wait for its standby; keepalives and `tcp_user_timeout`
notice only a peer whose kernel stopped answering. So every request gets a deadline here, in the
client.

How: one watchdog thread per store knows the requests in flight. When one outlives its deadline the
watchdog shuts its connection's socket down (`shutdown(2)`, through a duplicate of libpq's
descriptor that the connection keeps for this); the thread blocked in libpq, waiting to read or to
send, then sees the connection end as if the server had died: psycopg raises `OperationalError`
("consuming input failed: server closed the connection unexpectedly"), the connection is broken, and
libpq closes its own descriptor. That needs nothing from the server, so it works on a frozen one.
The store reports the request as abandoned and discards the connection. Then a cancel request is
sent, in a thread of its own, for up to `CANCEL_TIMEOUT` (libpq's `PGcancelConn`, made when the
connection was): a live server ends the statement or its wait for a standby, and the backend,
finding its client gone, exits and releases its locks, instead of holding them and a connection slot
until a lost standby returns. A frozen server never takes the cancel, which is then given up.

Invariants:

- The watchdog touches a request's socket only between `start` and `finish`, and through the
  connection's own duplicate descriptor, which stays open until the connection is closed: never
  a descriptor number that libpq closed (it does, when it sees the connection end) and the
  process reused.
- Once `finish` has returned, the watchdog never touches that request again, and what `finish`
  returned (abandoned or not) is final. An abandoned request's connection is never used again.
- One timeout per watchdog, so a request started later has a later deadline: the watchdog sleeps
  until the earliest deadline in flight, or for one timeout when none is, which is never past
  the deadline of a request started meanwhile; `start` needs no wake-up.
"""

from __future__ import annotations

import errno
import select
import socket
import threading
import time
from dataclasses import dataclass

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGcancelConn

CANCEL_TIMEOUT = 5.0
"""Seconds a cancel request may take: a new connection and one packet, which a server that
answers at all takes in milliseconds (a request's own timeout may be shorter than a connection)."""


@dataclass(eq=False)
class Request:
    """One request in flight: the socket to shut down at `deadline`, and the cancel to send
    then (None where libpq cannot make one). `abandoned`: the deadline fired."""

    socket: socket.socket
    cancel: PGcancelConn | None
    deadline: float
    abandoned: bool = False


@dataclass
class DeadlineCounts:
    """`abandoned` requests; of the cancels sent for them, `cancelled` the server took and
    `cancel_failed` it did not (refused, or no answer within `CANCEL_TIMEOUT`), the last of which
    says why in `last_cancel_error`."""

    abandoned: int = 0
    cancelled: int = 0
    cancel_failed: int = 0
    last_cancel_error: str = ""


class Deadlines:
    """Abandons requests that outlive `timeout` seconds (see the module docstring).

    `start` registers a request, `finish` ends it and says whether it was abandoned. The
    watchdog thread starts with the first request and ends once `close` was called and no
    request is in flight. Thread-safe.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.counts = DeadlineCounts()
        self._cond = threading.Condition(threading.Lock())
        self._busy: set[Request] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, sock: socket.socket, cancel: PGcancelConn | None) -> Request:
        with self._cond:
            request = Request(sock, cancel, time.monotonic() + self.timeout)
            self._busy.add(request)
            # the first request, or one after a fork or a watchdog that died of an error
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="pagekv-pg-deadlines", daemon=True
                )
                self._thread.start()
        return request

    def finish(self, request: Request) -> bool:
        """End `request` (again is a no-op); whether its deadline fired."""
        with self._cond:
            self._busy.discard(request)
            if self._closed and not self._busy:
                self._cond.notify()
            return request.abandoned

    def close(self) -> None:
        """Let the watchdog end once the requests in flight have finished or been abandoned."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._closed and not self._busy:
                    self._thread = None  # under the lock: a later `start` starts another
                    return
                now = time.monotonic()
                expired = [r for r in self._busy if r.deadline <= now]
                for request in expired:
                    self._busy.remove(request)
                    request.abandoned = True
                    self.counts.abandoned += 1
                    _shut_down(request.socket)
                wake = min((r.deadline for r in self._busy), default=now + self.timeout)
                if not expired:
                    self._cond.wait(wake - now)
            for request in expired:
                if request.cancel is not None:
                    threading.Thread(
                        target=self._cancel,
                        args=(request.cancel,),
                        name="pagekv-pg-cancel",
                        daemon=True,
                    ).start()

    def _cancel(self, cancel: PGcancelConn) -> None:
        """Send the cancel request of an abandoned request's backend, giving up after
        `CANCEL_TIMEOUT`; the outcome goes to `counts`."""
        error = _send_cancel(cancel, time.monotonic() + CANCEL_TIMEOUT)
        with self._cond:
            if error:
                self.counts.cancel_failed += 1
                self.counts.last_cancel_error = error
            else:
                self.counts.cancelled += 1


def _shut_down(sock: socket.socket) -> None:
    """End the connection under whichever thread is blocked on it (both directions: a request
    may be blocked sending a batch the server no longer reads)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as e:
        # Already reset by the peer: the blocked call has returned, or returns, by itself.
        if e.errno != errno.ENOTCONN:
            raise


def _send_cancel(cancel: PGcancelConn, deadline: float) -> str:
    """Drive a cancel connection to its end or `deadline`; "" if the server took it, else why
    not. The cancel connection is freed either way."""
    try:
        try:
            cancel.start()
        except psycopg.Error as e:  # it could not even start
            return str(e)
        while True:
            status = cancel.poll()
            if status == pq.PollingStatus.OK:
                return ""
            if status == pq.PollingStatus.FAILED:
                return cancel.get_error_message() or "the cancel request failed"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "no answer to the cancel request"
            reading = status == pq.PollingStatus.READING
            fd = cancel.socket
            select.select([fd] if reading else [], [] if reading else [fd], [], remaining)
    finally:
        cancel.finish()
