"""Sections: every operation of the store runs in one, under the store's thread lock and a `flock`
on `kv.log` (shared to read, exclusive to write, so processes sharing the directory are
serialised), caught up with the log on entry, and returning only once what it wrote or saw is
durable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from pagekv.kv.errors import KvUnavailable
from pagekv.kv.file.append import Appender
from pagekv.kv.file.catch_up import LogFollower, NeedsExclusive
from pagekv.kv.file.epoch import Epoch
from pagekv.kv.file.group_commit import GroupCommit
from pagekv.kv.file.log import LogFile, os_reason
from pagekv.kv.file.pending import Pending


class Sections:
    """The store's locks and the state of the section that holds them; the package-internal face
    through which the store and its namespaces reach the pending state (`seen`, `for_write`) and
    write (`append`).

    Invariants:
    - Every read or write of the epoch view, the base or the log's records happens inside a
      section: `shared` to read, `exclusive` to write (which also makes the log writable).
    - A section returns only once every record it wrote or saw (`owed`) is durable, and waits
      for that after letting go of the locks, so others append meanwhile (group commit).
    - Every wait for the thread lock or the log's `flock` ends within `lock_timeout`.

    `lock` (a reentrant lock; package-internal: `FileStore.close` holds it while it closes) is
    the thread lock, and guards `_owed`. `lock_timeout` (package-internal: `FileStore.lock_timeout`
    sets it) is read at each entry. The rest is fixed at open.
    """

    def __init__(
        self,
        path: Path,
        lock_timeout: float,
        log: LogFile,
        epoch: Epoch,
        commit: GroupCommit,
        appender: Appender,
        follower: LogFollower,
    ) -> None:
        self._path = path
        self.lock_timeout = lock_timeout
        self._log = log
        self._epoch = epoch
        self._commit = commit
        self._appender = appender
        self._follower = follower
        self.lock = threading.RLock()
        self._owed = 0  # the position the current section must see durable
        self.shared = Section(self, exclusive=False)
        self.exclusive = Section(self, exclusive=True)

    def enter(self, exclusive: bool) -> None:
        timeout = self.lock_timeout
        commit, log = self._commit, self._log
        if not self.lock.acquire(False):
            started = time.monotonic()
            commit.contend(1)  # tells the holder to leave its flush to a group
            try:
                acquired = self.lock.acquire(True, timeout)
            finally:
                commit.contend(-1)
            if not acquired:
                raise KvUnavailable(
                    f"waited {timeout:g} s for another thread of this process to finish with "
                    f"the file store {self._path}; nothing was done"
                )
            timeout = max(0.0, timeout - (time.monotonic() - started))
        try:
            if commit.broken is not None:
                raise KvUnavailable(
                    f"the file store {self._path} refuses requests ({commit.broken}); reopen it"
                )
            try:
                commit.lock_waited = log.lock(exclusive, timeout)
            except TimeoutError as e:
                raise KvUnavailable(
                    f"the file store {self._path} is locked: {e.strerror}; nothing was done"
                ) from e
            except OSError as e:
                raise KvUnavailable(f"cannot lock {log.path}: {os_reason(e)}") from e
            try:
                try:
                    self._follower.catch_up(exclusive)
                except NeedsExclusive:
                    log.lock(True, timeout)
                    self._follower.catch_up(True)
                    if not exclusive:
                        log.lock(False, timeout)
                if exclusive:
                    self._appender.make_writable()
            except OSError as e:
                log.unlock()
                raise KvUnavailable(f"cannot read {log.path}: {e}") from e
            except BaseException:
                log.unlock()
                raise
        except BaseException:
            self.lock.release()
            raise

    def exit(self) -> None:
        """Let go of the locks, then wait until what the section wrote or saw is durable."""
        owed, self._owed = self._owed, 0
        try:
            self._log.unlock()
        finally:
            self.lock.release()
        if owed > self._commit.durable_pos:
            self._commit.await_durable(owed)

    def _saw(self, pending: Pending | None) -> None:
        """The current section read `pending`: it returns only once what it saw is durable."""
        if pending is not None and pending.last > self._owed:
            self._owed = pending.last

    def seen(self, ns: int) -> Pending | None:
        """Namespace `ns`'s pending state, None if it has none (the base alone holds it). The
        section returns only once the state is durable."""
        pending = self._epoch.pending.get(ns)
        self._saw(pending)
        return pending

    def for_write(self, ns: int) -> Pending:
        """Namespace `ns`'s pending state, begun from the base if need be, in an exclusive
        section. The section returns only once the state is durable."""
        pending = self._epoch.pending_for(ns)
        self._saw(pending)
        return pending

    def append(
        self,
        ns: int,
        body: bytes,
        change: Callable[[Pending], object],
        created: str | None = None,
    ) -> None:
        """Write one record in an exclusive section (`Appender.append`); the section waits on
        exit until it is durable, unless it is already."""
        owed = self._appender.append(ns, body, change, created)
        if owed:
            self._owed = owed


class Section:
    """`with sections.shared:` or `with sections.exclusive:`. A class, not a generator, as it
    runs on every request; `Sections` keeps one of each kind, holding no state of their own."""

    __slots__ = ("_exclusive", "_sections")

    def __init__(self, sections: Sections, *, exclusive: bool) -> None:
        self._sections = sections
        self._exclusive = exclusive

    def __enter__(self) -> None:
        self._sections.enter(self._exclusive)

    def __exit__(self, *exc: object) -> None:
        self._sections.exit()
