"""Fixtures of the server tests: the anyio backend, a served registry, and polling."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest
from server_helpers import Served, serving


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """The test actors served on a fresh memory store, with the test token."""
    async with serving() as s:
        yield s


async def _eventually(
    check: Callable[[], Awaitable[bool]], *, what: str, timeout: float = 10.0
) -> None:
    """Await `check()` until it is true; fail (not hang) after `timeout` seconds."""
    with anyio.move_on_after(timeout):
        while not await check():
            await anyio.sleep(0.05)
        return
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    return _eventually
