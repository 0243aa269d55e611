"""`FileStore`: the `file:` store's public face; opens its parts, hands out namespaces, closes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from pagekv.kv.api import FlushCounts
from pagekv.kv.errors import KvUnavailable
from pagekv.kv.file.append import Appender
from pagekv.kv.file.base import Base
from pagekv.kv.file.catch_up import LogFollower
from pagekv.kv.file.epoch import Epoch
from pagekv.kv.file.file_namespace import FileNamespace
from pagekv.kv.file.group_commit import GroupCommit
from pagekv.kv.file.log import DATA_START, LogFile
from pagekv.kv.file.log_records import MAX_KEY_BYTES, MAX_NAME_BYTES, encode_create
from pagekv.kv.file.pending import Pending
from pagekv.kv.file.sections import Sections
from pagekv.kv.file.shm import ShmFile
from pagekv.kv.limits import KvLimits, check_name

DEFAULT_LOCK_TIMEOUT: Final = 30.0
DEFAULT_LOG_BYTES: Final = 32 * 2**20


class FileStore:
    """All namespaces of one directory. Safe to share between threads and between processes.

    `log_bytes` is the log size at which it is folded into the base: a larger log folds less
    often and holds more in memory (about that many bytes of pending changes per open store).
    `lock_timeout` bounds, in seconds, each wait for the locks other threads and processes hold
    on the directory; past it the request fails with `KvUnavailable`, having done nothing.

    Its parts (package-internal, for the namespaces it hands out and white-box tests; fixed at
    open): `base`, `log`, `shm`, `epoch` (the pending state), `commit` (group commit), `appender`,
    `sections` (the locks every operation runs under, which guard the others' state).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        limits: KvLimits | None = None,
        log_bytes: int = DEFAULT_LOG_BYTES,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        flush_delay_ms: float = 0.0,
    ) -> None:
        if not 0 <= flush_delay_ms < float("inf"):
            raise ValueError(f"flush_delay_ms must be a number >= 0, got {flush_delay_ms}")
        if log_bytes < 2 * DATA_START:
            raise ValueError(f"log_bytes must be at least {2 * DATA_START}, got {log_bytes}")
        if not 0 < lock_timeout < float("inf"):
            raise ValueError(f"lock_timeout must be a number of seconds > 0, got {lock_timeout}")
        timeout = float(lock_timeout)
        self.path = Path(path)
        self.limits = limits or KvLimits()
        if self.limits.max_key_bytes > MAX_KEY_BYTES:
            raise ValueError(
                f"the file store holds keys of up to {MAX_KEY_BYTES} bytes, "
                f"not max_key_bytes={self.limits.max_key_bytes}"
            )
        if self.limits.max_name_bytes > MAX_NAME_BYTES:
            raise ValueError(
                f"the file store holds names of up to {MAX_NAME_BYTES} bytes, "
                f"not max_name_bytes={self.limits.max_name_bytes}"
            )
        self.log_bytes = log_bytes
        self.path.mkdir(parents=True, exist_ok=True)
        self.base = Base(self.path, timeout)
        try:
            store_id = self.base.open()
            self.log, self.shm = _open_files(self.path, flush_delay_ms / 1000)
        except OSError as e:
            self.base.close()
            raise KvUnavailable(f"cannot open the log of the file store at {self.path}: {e}") from e
        except BaseException:
            self.base.close()
            raise
        self.epoch = Epoch(self.base)
        log, shm, epoch, base = self.log, self.shm, self.epoch, self.base
        self.commit = GroupCommit(log, shm, self.path, timeout)
        self.appender = Appender(log, shm, epoch, base, self.commit, log_bytes, store_id)
        follower = LogFollower(
            log, shm, epoch, base, self.commit, self.appender, self.path, store_id
        )
        self.sections = Sections(
            self.path, timeout, log, epoch, self.commit, self.appender, follower
        )
        try:
            self._open_log()
        except BaseException:
            self.close()
            raise

    def _open_log(self) -> None:
        """Check `kv.shm` and replay the log, so damage shows at open. Nothing is written unless
        `kv.shm` must be rebuilt: an older log format is folded at the first write."""
        with self.sections.shared:
            # What the log holds now is durable, whatever `kv.shm` says (it may come from a copy
            # of the directory, or from before a reboot).
            self.commit.flush_under_lock()
            self.shm.reset_marks(self.commit.seen_pos)

    @property
    def lock_timeout(self) -> float:
        return self.sections.lock_timeout

    @lock_timeout.setter
    def lock_timeout(self, seconds: float) -> None:
        """From the next wait on (the base's busy timeout stays the one set at open)."""
        self.sections.lock_timeout = self.commit.lock_timeout = seconds

    @property
    def log_used(self) -> int:
        """Bytes of `kv.log` in use as of this process's last look: where the next record goes.
        The log is folded into the base when a record would take it past `log_bytes`."""
        return self.epoch.offset

    def flush_counts(self) -> FlushCounts:
        """Writes made durable, log flushes and folds by this process since it opened the
        store. Group commit shows as fewer flushes than writes."""
        return FlushCounts(self.commit.writes, self.log.flushes, self.appender.folds)

    def namespace(self, actor_id: object) -> FileNamespace:
        """The namespace named `actor_id`; a new one is created with one record in the log."""
        name = check_name(self.limits, actor_id)
        sections = self.sections
        with sections.shared:
            ns_id = self._find(name)
        if ns_id is None:
            with sections.exclusive:
                ns_id = self._find(name)
                if ns_id is None:
                    rows = self.base.query("SELECT coalesce(max(id), 0) FROM namespaces")
                    ns_id = max(rows[0][0], *self.epoch.created.values(), 0) + 1
                    sections.append(ns_id, encode_create(ns_id, name), _unchanged, created=name)
        return FileNamespace(name, self.limits, sections, self.base, ns_id)

    def _find(self, name: str) -> int | None:
        """The id of namespace `name`, or None; the caller holds a section."""
        ns_id = self.epoch.created.get(name)
        if ns_id is not None:
            self.sections.seen(ns_id)
            return ns_id
        rows = self.base.query("SELECT id FROM namespaces WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def actor_ids(self) -> list[str]:
        with self.sections.shared:
            names = [r[0] for r in self.base.query("SELECT name FROM namespaces ORDER BY name")]
            created = self.epoch.created
            if not created:
                return names
            for ns_id in created.values():
                self.sections.seen(ns_id)
            return sorted([*names, *created])

    def close(self) -> None:
        """Idempotent; also releases what a failed open had opened."""
        with self.sections.lock:
            self.commit.close()
            self.base.close()
            self.log.close()
            self.shm.close()

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_files(directory: Path, flush_delay: float) -> tuple[LogFile, ShmFile]:
    log = LogFile(directory / "kv.log", flush_delay)
    try:
        return log, ShmFile(directory / "kv.shm")
    except BaseException:
        log.close()
        raise


def _unchanged(pending: Pending) -> None:
    """The pending-state change of a record that only creates its namespace."""
