"""Whether an open database still lives, and the last storage error nobody has taken yet.

A write whose outcome is unknown, or a fence mismatch, leaves the stored database in a state this
instance cannot know; so the instance dies rather than guess or resend (DESIGN: fatal-on-error).
Any piece of the page store can find such an error (a read that finds a takeover, a commit, a
staging write, a compaction), so dying is this one small object that they all hold.
"""

from __future__ import annotations

from collections.abc import Callable

from pagekv.vfs.errors import DatabaseDead


class Health:
    """The page store's life.

    Invariants: `dead` is set once, by the first fatal error, and never cleared, so every later
    call raises a `DatabaseDead` with that same cause; dying drops the store's buffers (the
    open transaction and the page cache, through `drop_buffers`) exactly once. Every field is
    guarded by the page store's lock: its pieces are called with it held.
    """

    def __init__(self, drop_buffers: Callable[[], None]) -> None:
        self._drop_buffers = drop_buffers
        self.dead: BaseException | None = None
        """The error that killed the database; None while it lives."""
        self.last_error: BaseException | None = None
        """The original error behind the last storage failure, until `Database` takes it (the
        file's callbacks set it too, for the errors they hand to SQLite)."""

    def die(self, error: BaseException) -> DatabaseDead:
        """Kill the database for `error` (the first call only) and return what to raise."""
        if self.dead is None:
            self.dead = error
            self._drop_buffers()
        self.last_error = error
        return self.dead_error()

    def dead_error(self) -> DatabaseDead:
        assert self.dead is not None
        return DatabaseDead(self.dead)

    def check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead_error()
