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
