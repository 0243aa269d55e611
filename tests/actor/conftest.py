"""Fixtures of the actor runtime tests: the anyio backend, and helpers shared by every file.

Helpers are fixtures (not imports) so that the test files need no package structure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

Predicate = Callable[[], bool]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _wait_for(predicate: Predicate, *, what: str = "condition", timeout: float = 10.0):
    """Poll `predicate` until it holds; fail (not hang) after `timeout` seconds."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)
        return
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def wait_for() -> Callable[..., Awaitable[None]]:
    return _wait_for


async def _attempt(awaitable: Awaitable[Any]) -> Any:
    """The result of `awaitable`, or the exception it raised (returned, not raised)."""
    try:
        return await awaitable
    except Exception as e:
        return e


@pytest.fixture
def attempt() -> Callable[[Awaitable[Any]], Awaitable[Any]]:
    """For expected-to-fail (xfail) tests: collect outcomes inside `registry.run()` and assert
    after it, so a failure is a plain AssertionError rather than an exception group (whose
    report can crash pytest's traceback rendering on CPython 3.11.7)."""
    return _attempt


async def _settle() -> None:
    """Wait until every other task is blocked, as `anyio.wait_all_tasks_blocked` does (checks
    0.1 s apart, time for worker threads), but after letting every task woken meanwhile take its
    step. Without that, a registry's housekeeping (which wakes every 50 ms) can be found woken
    and not yet run at every check once a loaded machine makes both timers fire in the same
    loop iteration, and the wait never ends (it failed a CI run that way)."""
    this = asyncio.current_task()
    while True:
        await asyncio.sleep(0.1)
        await asyncio.sleep(0)
        waiters = [task._fut_waiter for task in asyncio.all_tasks() if task is not this]  # type: ignore[attr-defined]
        if all(w is not None and not w.done() for w in waiters):
            return


@pytest.fixture
def settle() -> Callable[[], Awaitable[None]]:
    return _settle
