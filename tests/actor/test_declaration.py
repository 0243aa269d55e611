"""Mistakes in declaring an actor are refused as they are declared, not at the first call: an
action or hook that is not an `async def`, or does not take `ctx` (and the hook's other
arguments) first, is an `InvalidDefinition` naming the function and its file and line, and is
not registered. What the runtime can call (varargs, defaults, wrappers) is still accepted."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from pagekv.actor import ActionNotFound, InvalidDefinition, Registry, actor
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio


def line() -> int:
    """The line of the caller's next line: where the function declared under it starts."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def test_a_plain_def_action_is_refused_with_its_file_and_line() -> None:
    shop = actor("shop")
    with pytest.raises(InvalidDefinition) as refused:
        at = line()

        @shop.action
        def total(ctx):
            return 0

    assert str(refused.value) == (
        f"action 'total' of actor 'shop' ({__file__}:{at + 1}) must be an 'async def', "
        "not a plain 'def'"
    )
    assert "\n" not in str(refused.value)
    assert isinstance(refused.value, TypeError)
    with pytest.raises(ActionNotFound):
        shop.resolve("total", (), {})


def test_an_action_without_ctx_first_is_refused() -> None:
    shop = actor("shop")
    with pytest.raises(InvalidDefinition) as refused:
        at = line()

        @shop.action
        async def ping() -> str:
            return "pong"

    assert str(refused.value) == (
        f"action 'ping' of actor 'shop' ({__file__}:{at + 1}) must take ctx as its first "
        "parameter: it takes ()"
    )
    with pytest.raises(
        InvalidDefinition, match=r"must take ctx as its first parameter: it takes \(\*, amount\)"
    ):

        @shop.action
        async def add(*, amount: int) -> None:
            pass

    with pytest.raises(InvalidDefinition, match="it takes \\(\\*\\*options\\)"):

        @shop.action
        async def configure(**options: Any) -> None:
            pass

    assert shop.actions == {}


def test_an_async_generator_is_refused() -> None:
    shop = actor("shop")
    with pytest.raises(
        InvalidDefinition, match=r"action 'items' of actor 'shop' \(.*\) is an async generator"
    ):

        @shop.action
        async def items(ctx):
            yield 1


HOOKS_WITH_CTX_ONLY = ["on_migrate", "create_vars", "on_wake", "on_sleep", "on_destroy", "run"]
HOOKS_WITH_TWO = {
    "create_state": "input",
    "on_create": "input",
    "on_before_connect": "params",
    "on_connect": "conn",
    "on_disconnect": "conn",
    "on_request": "request",
}


def test_every_hook_is_refused_if_plain_or_missing_an_argument() -> None:
    for hook in [*HOOKS_WITH_CTX_ONLY, *HOOKS_WITH_TWO]:
        a = actor("a")
        declare: Callable[[Any], Any] = getattr(a, hook)

        def plain(ctx, other=None):
            pass

        with pytest.raises(InvalidDefinition) as refused:
            declare(plain)
        where = f"({__file__}:{plain.__code__.co_firstlineno})"
        assert str(refused.value).startswith(f"{hook} '") and where in str(refused.value), hook
        assert str(refused.value).endswith("must be an 'async def', not a plain 'def'"), hook

        async def nothing():
            pass

        with pytest.raises(InvalidDefinition) as refused:
            declare(nothing)
        expected = "(ctx)" if hook in HOOKS_WITH_CTX_ONLY else f"(ctx, {HOOKS_WITH_TWO[hook]})"
        assert str(refused.value).endswith(f"is called with {expected}, but takes ()"), hook
        assert a.hooks == {}, hook

    for hook, second in HOOKS_WITH_TWO.items():

        async def ctx_only(ctx):
            pass

        with pytest.raises(InvalidDefinition) as refused:
            getattr(actor("a"), hook)(ctx_only)
        assert str(refused.value) == (
            f"{hook} 'test_every_hook_is_refused_if_plain_or_missing_an_argument.<locals>."
            f"ctx_only' of actor 'a' ({__file__}:{ctx_only.__code__.co_firstlineno}) is called "
            f"with (ctx, {second}), but takes (ctx)"
        )


def test_a_plain_workflow_is_refused() -> None:
    a = actor("a")

    def flow(wf):
        pass

    with pytest.raises(InvalidDefinition, match=r"^workflow '.*flow' of actor 'a' .* plain 'def'$"):
        a.workflow(flow)
    with pytest.raises(InvalidDefinition, match=r"is called with \(wf\), but takes \(\)$"):

        @a.workflow
        async def flow2():
            pass

    assert a.workflow_fn is None


async def test_what_the_runtime_can_call_is_accepted_and_runs() -> None:
    a = actor("a", state={"woken": 0, "created": None})

    @a.on_create
    async def created(ctx, input=None, *rest):
        ctx.state["created"] = input

    @a.on_wake
    async def woken(*args):
        args[0].state["woken"] += 1

    @a.action
    async def plain(ctx, x: int = 1) -> int:
        return x

    @a.action
    async def varargs(*args: Any) -> int:
        return len(args) - 1  # ctx is the first

    @a.action
    async def positional_only(c, /, y: int) -> int:
        return y

    async def inner(ctx, z: int) -> int:
        return z * 2

    @functools.wraps(inner)
    def wrapped(ctx, z: int):  # a plain def returning the coroutine of what it wraps
        return inner(ctx, z)

    a.action(wrapped)

    class Callable_:
        __name__ = "callable_object"

        async def __call__(self, ctx) -> str:
            return "called"

    a.action(Callable_())

    @a.action
    async def state(ctx) -> dict[str, Any]:
        return ctx.state

    async with Registry([a], kv=MemoryStore()).run() as client:
        handle = await client.create("a", "k", input="hello")
        assert await handle.plain(5) == 5
        assert await handle.varargs(1, 2, 3) == 3
        assert await handle.positional_only(7) == 7
        assert await handle.inner(4) == 8
        assert await handle.callable_object() == "called"
        assert await handle.state() == {"woken": 1, "created": "hello"}
