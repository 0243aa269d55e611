"""`ctx.kv`: the user's part of the actor's KV namespace, behind a reserved key prefix.

The VFS stores the database under its own prefix; user keys get `USER_PREFIX` prepended and
stripped again, so users can never touch the database's keys. Every request goes through the
namespace's own limit checks (a user key may be up to the limit minus the prefix), and writes
carry the instance's fence, so a taken-over instance cannot write here either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from pagekv.actor.errors import ActorTakenOver
from pagekv.actor.request_writes import note_writes
from pagekv.actor.worker_threads import Workers
from pagekv.kv import ActorKv, FenceMismatch, InvalidKey, KvIndeterminate, prefix_end

USER_PREFIX = b"\x02"


def _stored(key: object, what: str = "key") -> bytes:
    """`key` under the user prefix. Only bytes-like keys: `bytes()` of an int would make a key
    of that many zero bytes, and of a str fail with a bare `TypeError`."""
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidKey(f"{what} must be bytes, not {type(key).__name__}")
    return USER_PREFIX + bytes(key)


class UserKv:
    """Async, prefixed and fenced access to the actor's own KV entries."""

    def __init__(self, kv: ActorKv, fence: int, workers: Workers) -> None:
        self._kv = kv
        self._fence = fence
        self._workers = workers

    async def get(self, keys: Iterable[bytes]) -> list[bytes | None]:
        keys = [_stored(k) for k in keys]
        return await self._workers.run(self._kv.get, keys)

    async def put(self, entries: Mapping[bytes, bytes]) -> None:
        await self._write(put={_stored(k): v for k, v in entries.items()})

    async def delete(self, keys: Sequence[bytes]) -> None:
        await self._write(delete=[_stored(k) for k in keys])

    async def _write(self, **batch: Any) -> None:
        try:
            await self._workers.run(partial(self._kv.write, **batch, fence=self._fence))
        except FenceMismatch as e:
            raise ActorTakenOver(f"another instance took this actor over: {e}") from e
        except KvIndeterminate:
            note_writes(committed=False, unknown=True)
            raise
        note_writes(committed=True)

    async def list(
        self, *, prefix: bytes = b"", limit: int | None = None, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        start = _stored(prefix, "prefix")
        rows = await self._workers.run(
            partial(self._kv.list, start=start, end=prefix_end(start), limit=limit, reverse=reverse)
        )
        return [(k[len(USER_PREFIX) :], v) for k, v in rows]
