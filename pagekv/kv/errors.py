"""Typed errors of the actor KV contract.

Every error a backend raises is a `KvError`. The split matters to callers: a `LimitError` or a
`KvUnavailable` means *nothing was applied*; a `KvIndeterminate` means the request was sent and its
outcome is unknown, so the caller must never resend it blindly (the VFS dies instead); a
`FenceMismatch` means another owner took the namespace over.
"""

from __future__ import annotations


class KvError(Exception):
    """Base of every error raised through the `ActorKv` interface."""


class LimitError(KvError, ValueError):
    """A request broke one of the `KvLimits`; it was rejected before anything was written.

    `limit` names the limit (a `KvLimits` field), `actual` is what the request asked for and
    `allowed` the most that limit permits.
    """

    limit: str = ""

    def __init__(self, what: str, actual: int, allowed: int) -> None:
        self.actual = actual
        self.allowed = allowed
        super().__init__(f"{what}: {actual} exceeds {self.limit} = {allowed}")


class KeyTooLarge(LimitError):
    limit = "max_key_bytes"


class ValueTooLarge(LimitError):
    limit = "max_value_bytes"


class TooManyEntries(LimitError):
    limit = "max_batch_entries"


class BatchTooLarge(LimitError):
    limit = "max_batch_bytes"


class StorageQuotaExceeded(LimitError):
    limit = "max_storage_bytes"


class NameTooLarge(LimitError):
    limit = "max_name_bytes"


class InvalidArgument(KvError, ValueError):
    """An argument outside the contract (a wrong type, or a value no backend accepts), named in
    the message. Raised before anything is sent, so nothing was applied."""


class InvalidKey(InvalidArgument):
    """A key that no backend can store (empty, or not bytes)."""


class FenceMismatch(KvError):
    """A fenced write named a generation that is no longer the namespace's current one."""

    def __init__(self, fence: int, current: int) -> None:
        self.fence = fence
        self.current = current
        super().__init__(
            f"fence {fence} is stale: the namespace is at generation {current} "
            "(another instance took it over); nothing was written"
        )


class KvUnavailable(KvError):
    """The backend could not be reached; the request was not applied."""


class KvIndeterminate(KvError):
    """The request was sent but its outcome is unknown: it may or may not have been applied."""


class StoreRefused(KvUnavailable):
    """A store's file that this pagekv cannot read safely: it refuses the store rather than
    take the file for absent or empty and write over it, so nothing was read or written.
    `path` names the file."""

    def __init__(self, path: object, message: str) -> None:
        self.path = str(path)
        super().__init__(f"{path}: {message}")


class FormatTooNew(StoreRefused):
    """A file in a format newer than this pagekv reads (written by a newer pagekv). `kind` says
    which structure (`log`, `kv.shm`, `schema`), `found` the version found as the file names it,
    `newest` the newest version of that kind this pagekv reads (it reads every one from 1)."""

    def __init__(self, path: object, kind: str, found: str, newest: int) -> None:
        self.kind = kind
        self.found = found
        self.newest = newest
        readable = "1" if newest == 1 else f"1-{newest}"
        super().__init__(
            path,
            f"{kind} format {found}; this pagekv reads {kind} formats {readable} "
            "(open it with the newer pagekv that wrote it)",
        )


class StoreDamaged(StoreRefused):
    """A file that does not check out where nothing explains it (not a torn write a crash can
    leave): continuing would mean guessing, and a guess could drop acknowledged writes."""
