"""Where the actor runtime's blocking work runs: its KV requests and its actors' SQLite work.

One `Workers` per registry, shared by every actor it hosts:

- **A bounded pool.** At most `threads` pieces of work run at once, on worker threads reused
  from one call to the next, so the number of threads stays bounded however many actors are
  woken, at once or over time. That bounds memory too: glibc's malloc gives each thread that
  allocates an arena of its own and never gives an arena's pages back in full, so a thread per
  concurrent call made RSS grow with the number of actors ever woken. An actor's own work runs
  one piece at a time (`ActorDb` serialises it); the pool only bounds the total. A KV stuck
  under one actor holds one thread: other actors keep being served while fewer than `threads`
  are stuck.
- **Upkeep apart.** The registry's own upkeep (lease and member renewals, the wake poll, giving
  memory back) runs on `UPKEEP_THREADS` threads of its own (`upkeep`), never queued behind the
  actors' work: a pool full of long SQL or stuck KV calls must not let the leases of the other
  actors run out, or another registry would take healthy actors over.
- **Inline on a store that never waits.** A store whose operations complete without I/O,
  sleeping or waiting for another process (`never_waits`: memory:// without simulated latency)
  has no slow KV to keep off the event loop, and there a hop to a thread and back costs ten to
  twenty times the work (a one-row commit is a few µs). Its work runs on the event loop, after
  a checkpoint (as a hop would begin), so a loop of database calls still lets other tasks in
  and sees its cancellation. SQL that computes for long then holds the loop, as CPU-bound code
  in an action does.

Even with few threads, glibc keeps what slept actors freed (their SQLite connections, caches
and buffers) mapped: it returns only the top of each heap, and the rest stays in RSS, fragmented,
growing with the number of actors woken. `release_free_memory` gives it back (the registry calls
it after actors have gone to sleep); elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")
UPKEEP_THREADS = 2
"""Threads for the registry's upkeep: a renewal and the wake poll can run at once."""
THREADS = 8
"""Default size of a registry's pool: enough for the commits of that many actors to wait on a
remote store (PostgreSQL) at once, few enough that their arenas stay a few MiB."""


def never_waits(store: object) -> bool:
    """Whether `store` says its operations complete without waiting (see the module)."""
    return getattr(store, "never_waits", False) is True


class Workers:
    """Runs blocking work for the actors of one registry: inline if `inline`, else on at most
    `threads` worker threads at once."""

    def __init__(self, *, threads: int = THREADS, inline: bool = False) -> None:
        self.threads = threads
        self.inline = inline
        self._limiter = anyio.CapacityLimiter(threads)
        self._upkeep = anyio.CapacityLimiter(UPKEEP_THREADS)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, on a worker thread unless inline. Not cancellable once begun (a hop's
        outcome must be known to its caller); a cancellation is met before it begins."""
        if self.inline:
            await anyio.lowlevel.checkpoint()
            return fn(*args)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def upkeep(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` for the registry's upkeep: like `run`, on threads of its own."""
        if self.inline:
            await anyio.lowlevel.checkpoint()
            return fn(*args)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._upkeep)

    def busy(self) -> int:
        """Pieces of work running on the pool's threads now (0 inline)."""
        return int(self._limiter.borrowed_tokens)


def _find_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc's; musl has none
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


_malloc_trim = _find_malloc_trim()


def release_free_memory() -> bool:
    """Return the memory the C allocator holds free to the system (glibc's `malloc_trim`: a
    walk over its heaps, a few ms); False where there is no such call."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True
