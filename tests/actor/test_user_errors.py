"""Failures that are the caller's fault, in process: `UserError` raised by an action reaches its
caller as is, annotated arguments are checked before the actor is woken or created, and a
workflow step that fails with a `UserError` or an error marked `non_retryable` is not retried.

This file's annotations are strings (`from __future__ import annotations`): the checks resolve
them, and leave unchecked what cannot be resolved."""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Optional, TypedDict

import pytest
from flows import settle

from pagekv.actor import ActorContext, ActorNotFound, InvalidArguments, Registry, UserError, actor
from pagekv.actor.workflow import (
    StepContext,
    StepCritical,
    StepResult,
    WorkflowContext,
    WorkflowState,
)
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio


class OutOfStock(UserError):
    """A user's own kind of UserError."""


@dataclass
class Item:
    sku: str


class Order(TypedDict):
    sku: str


def shop_actor():
    shop = actor("shop", state={"orders": 0, "tries": 0})

    @shop.action
    async def buy(ctx: ActorContext, sku: str, amount: int = 1) -> int:
        ctx.state["tries"] += 1  # outside a transaction: kept when the action fails
        async with ctx.db.transaction():
            await ctx.db.execute("CREATE TABLE IF NOT EXISTS orders(sku, amount)")
            await ctx.db.execute("INSERT INTO orders VALUES (?, ?)", (sku, amount))
            ctx.state["orders"] += 1
            if amount > 10:
                raise OutOfStock(f"only 10 of {sku} left", code="out_of_stock", status=409)
            if amount < 1:
                raise UserError("amount must be at least 1")
        return ctx.state["orders"]

    @shop.action
    async def view(ctx: ActorContext) -> dict[str, Any]:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS orders(sku, amount)")
        rows = await ctx.db.execute("SELECT sku, amount FROM orders ORDER BY rowid")
        return {"state": ctx.state, "rows": [list(r) for r in rows]}

    return shop


def test_a_user_error_has_a_code_and_a_4xx_status() -> None:
    default = UserError("no such coupon")
    assert (str(default), default.message, default.code, default.status) == (
        "no such coupon",
        "no such coupon",
        "user_error",
        400,
    )
    custom = UserError("gone", code="coupon.expired", status=410)
    assert (custom.code, custom.status) == ("coupon.expired", 410)
    for status in (399, 500, 200, True, "400", 400.0):
        with pytest.raises(ValueError, match="4xx"):
            UserError("x", status=status)  # type: ignore[arg-type]
    for code in ("", "1abc", "has space", "a" * 65, "line\nbreak", None):
        with pytest.raises(ValueError, match="code"):
            UserError("x", code=code)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        UserError(42)  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(OutOfStock("left", code="out_of_stock", status=409)))
    assert type(again) is OutOfStock
    assert (again.message, again.code, again.status) == ("left", "out_of_stock", 409)


async def test_an_in_process_caller_gets_the_user_error_as_is() -> None:
    async with Registry([shop_actor()], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("shop", "k")
        assert await handle.buy("apple", 2) == 1
        with pytest.raises(OutOfStock) as refused:
            await handle.buy("apple", 11)
        with pytest.raises(UserError) as plain:
            await handle.buy("pear", 0)
        with pytest.raises(InvalidArguments):  # refused before the action runs
            await handle.buy("pear", "0")
        view = await handle.view()
    assert (refused.value.code, refused.value.status) == ("out_of_stock", 409)
    assert str(refused.value) == "only 10 of apple left"
    assert type(plain.value) is UserError and plain.value.code == "user_error"
    # the refused calls' transactions rolled back, their changes outside one stand; the call
    # with a wrong argument did not run
    assert view == {"state": {"orders": 1, "tries": 3}, "rows": [["apple", 2]]}


def checked_actor():
    a = actor("checked")

    @a.action
    async def scalars(
        ctx: ActorContext,
        count: int = 0,
        ratio: float = 0.0,
        name: str = "",
        flag: bool = False,
        blob: bytes = b"",
        nothing: None = None,
    ) -> None:
        pass

    @a.action
    async def items(ctx: ActorContext, items: list) -> None:
        pass

    @a.action
    async def ids(ctx: ActorContext, ids: list[int]) -> None:
        pass

    @a.action
    async def table(ctx: ActorContext, table: dict) -> None:
        pass

    @a.action
    async def totals(ctx: ActorContext, totals: dict[str, int]) -> None:
        pass

    @a.action
    async def nested(ctx: ActorContext, nested: list[dict[str, list[float]]]) -> None:
        pass

    @a.action
    async def unions(
        ctx: ActorContext,
        maybe: Optional[int] = None,  # noqa: UP045 (the spelling is what is tested)
        either: int | str = 0,
        ids: list[int] | None = None,
        mode: Literal["fast", "safe"] = "fast",
    ) -> None:
        pass

    class Local:  # a string annotation naming it cannot be resolved at module level
        pass

    @a.action
    async def unchecked(
        ctx,
        anything: Any = None,
        bare=None,
        item: Item = None,  # type: ignore[assignment]
        order: Order = None,  # type: ignore[assignment]
        local: Local = None,  # type: ignore[assignment]
        items: list[Local] = None,  # type: ignore[assignment]  # noqa: RUF013
        typo: Undefined = None,  # type: ignore[name-defined]  # noqa: F821
        wide: int | Item = 0,
        count: int = 0,
    ) -> None:
        pass

    @a.action
    async def varargs(ctx: ActorContext, *amounts: int, **labels: str) -> None:
        pass

    return a


def refusal(definition, action: str, *args: Any, **kwargs: Any) -> str | None:
    """The message of the `InvalidArguments` the call is refused with, or None if it binds."""
    try:
        definition.resolve(action, args, kwargs)
    except InvalidArguments as e:
        return str(e)
    return None


def test_scalar_annotations_are_checked_and_a_bool_is_no_int() -> None:
    a = checked_actor()
    for ok in [(1,), (-(2**70),), (0, 1), (0, 1.5), (0, 0.0, "x", True, b"\x00", None)]:
        assert refusal(a, "scalars", *ok) is None, ok
    assert refusal(a, "scalars", "5") == (
        "action 'scalars' of actor 'checked': argument 'count' must be int, got str '5'"
    )
    assert refusal(a, "scalars", True) == (
        "action 'scalars' of actor 'checked': argument 'count' must be int, got bool True"
    )
    assert "'count' must be int, got float 1.5" in refusal(a, "scalars", 1.5)
    assert "'ratio' must be float, got bool False" in refusal(a, "scalars", ratio=False)
    assert "'ratio' must be float, got str '1.5'" in refusal(a, "scalars", ratio="1.5")
    assert "'name' must be str, got int 3" in refusal(a, "scalars", name=3)
    assert "'flag' must be bool, got int 1" in refusal(a, "scalars", flag=1)
    assert "'blob' must be bytes, got str 'ab'" in refusal(a, "scalars", blob="ab")
    assert "'nothing' must be None, got int 0" in refusal(a, "scalars", nothing=0)


def test_container_annotations_check_their_items() -> None:
    a = checked_actor()
    for action, ok in [
        ("items", [1, "x"]),
        ("ids", [1, 2]),
        ("ids", []),
        ("table", {1: "x"}),
        ("totals", {"a": 1}),
        ("totals", {}),
        ("nested", [{"x": [1, 2.5]}]),
    ]:
        assert refusal(a, action, ok) is None, (action, ok)
    assert "'items' must be list, got str 'ab'" in refusal(a, "items", "ab")
    assert "'ids' must be list[int], but ids[2] is str 'x'" in refusal(a, "ids", [1, 2, "x"])
    assert "ids[0] is bool True" in refusal(a, "ids", [True])
    assert "'table' must be dict, got list []" in refusal(a, "table", [])
    assert "'totals' must be dict[str, int], but totals['b'] is str '2'" in refusal(
        a, "totals", {"a": 1, "b": "2"}
    )
    assert "got a dict with the key int 1" in refusal(a, "totals", {1: 1})
    assert "but nested[0]['x'][1] is str 'y'" in refusal(a, "nested", [{"x": [1.0, "y"]}])


def test_unions_optionals_and_literals() -> None:
    a = checked_actor()
    for ok in [
        dict(maybe=None),
        dict(maybe=3),
        dict(either="x"),
        dict(either=2),
        dict(ids=None),
        dict(ids=[1]),
        dict(mode="safe"),
    ]:
        assert refusal(a, "unions", **ok) is None, ok
    assert "'maybe' must be Optional[int], got str '3'" in refusal(a, "unions", maybe="3")
    assert "'either' must be int | str, got float 2.5" in refusal(a, "unions", either=2.5)
    assert "'either' must be int | str, got bool True" in refusal(a, "unions", either=True)
    assert "'ids' must be list[int] | None, but ids[1] is str 'x'" in refusal(
        a, "unions", ids=[1, "x"]
    )
    assert "'mode' must be Literal['fast', 'safe'], got str 'slow'" in refusal(
        a, "unions", mode="slow"
    )


def test_any_unannotated_and_unresolvable_annotations_are_not_checked() -> None:
    a = checked_actor()
    for name in ("anything", "bare", "local", "items", "typo"):
        assert refusal(a, "unchecked", **{name: object()}) is None, name
    # the annotations that do resolve are checked all the same: a dataclass, a TypedDict and a
    # union with one of them too (converted: see test_argument_conversion.py)
    assert "'count' must be int, got str '1'" in refusal(a, "unchecked", count="1")
    assert "'item' must be Item, got object <object" in refusal(a, "unchecked", item=object())
    assert "'order' must be Order, got object <object" in refusal(a, "unchecked", order=object())
    assert "'wide' must be int | Item, got str 'x'" in refusal(a, "unchecked", wide="x")


def test_varargs_check_each_value() -> None:
    a = checked_actor()
    assert refusal(a, "varargs", 1, 2, 3, unit="kg") is None
    assert "argument 'amounts[2]' must be int, got str '3'" in refusal(a, "varargs", 1, 2, "3")
    assert "argument 'unit' must be str, got int 1" in refusal(a, "varargs", unit=1)


def test_an_error_never_holds_the_whole_of_a_large_value() -> None:
    a = checked_actor()
    huge = "s3cret" * 100_000
    for message in (
        refusal(a, "scalars", huge),
        refusal(a, "scalars", name=[huge] * 1000),
        refusal(a, "scalars", name=10**10_000),  # no repr at all: past the digit limit
        refusal(a, "scalars", name=[10**10_000]),
        refusal(a, "scalars", name=b"\x00" * 1_000_000),
        refusal(a, "ids", [*range(100_000), huge]),
    ):
        assert message is not None and len(message) < 300, message
        assert "argument 'count'" in message or "argument 'name'" in message or "ids" in message


async def test_a_refused_argument_wakes_and_creates_nothing() -> None:
    async with Registry([shop_actor()], kv=MemoryStore()).run() as client:
        with pytest.raises(InvalidArguments, match="'amount' must be int, got str '5'"):
            await client.get_or_create("shop", "k").buy("apple", "5")
        with pytest.raises(InvalidArguments, match="'sku' must be str, got int 7"):
            await client.get_or_create("shop", "k").buy(7)
        with pytest.raises(ActorNotFound):
            await client.get("shop", "k").view()
        assert await client.get_or_create("shop", "k").buy("apple", 2) == 1


def flow_actor(flow):
    a = actor("wf", state={"n": 0})
    a.workflow(flow)
    return a


async def test_a_step_failing_with_a_user_error_is_not_retried() -> None:
    attempts: Counter[str] = Counter()

    async def validate(step: StepContext) -> None:
        attempts["validate"] += 1
        raise UserError("order 7 has no items", code="empty_order")

    async def flow(wf: WorkflowContext) -> Any:
        tried = await wf.try_step("try", validate, max_retries=3, backoff=0.01)
        assert isinstance(tried, StepResult) and tried.failure is not None
        try:
            await wf.step("step", validate, max_retries=3, backoff=0.01)
        except StepCritical as e:
            return [tried.failure.kind, tried.failure.attempts, tried.failure.error, e.attempts]
        return None

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.state is WorkflowState.COMPLETED, status.error
    assert status.output == ["critical", 1, "UserError: order 7 has no items", 1]
    assert attempts == {"validate": 2}


async def test_a_step_fails_at_once_on_an_error_marked_non_retryable() -> None:
    attempts: Counter[str] = Counter()

    class InvalidOrder(ValueError):
        pass

    def failing(name: str, error: Exception):
        async def fn(step: StepContext) -> None:
            attempts[name] += 1
            raise error

        return fn

    async def flow(wf: WorkflowContext) -> Any:
        outcomes = []
        for name, error, marked in [
            ("value", ValueError("bad order"), (ValueError,)),
            ("subclass", InvalidOrder("no items"), ValueError),  # one class, no tuple
            ("second", KeyError("sku"), (ValueError, KeyError)),
            ("other", RuntimeError("flaky"), (ValueError,)),  # not marked: retried
        ]:
            result = await wf.try_step(
                name, failing(name, error), max_retries=2, backoff=0.01, non_retryable=marked
            )
            assert result.failure is not None
            outcomes.append([name, result.failure.kind, result.failure.attempts])
        try:
            await wf.step("raising", failing("raising", ValueError("x")), non_retryable=ValueError)
        except StepCritical as e:
            outcomes.append(["raising", e.kind, e.attempts])
        return outcomes

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.state is WorkflowState.COMPLETED, status.error
    assert status.output == [
        ["value", "critical", 1],
        ["subclass", "critical", 1],
        ["second", "critical", 1],
        ["other", "exhausted", 3],
        ["raising", "critical", 1],
    ]
    assert attempts == {"value": 1, "subclass": 1, "second": 1, "other": 3, "raising": 1}


async def test_non_retryable_must_name_exception_classes() -> None:
    ran: list[str] = []

    async def fn(step: StepContext) -> None:
        ran.append("fn")

    async def flow(wf: WorkflowContext) -> Any:
        await wf.step("bad", fn, non_retryable=("ValueError",))  # type: ignore[arg-type]

    async with Registry([flow_actor(flow)], kv=MemoryStore()).run() as client:
        status = await settle(client.get_or_create("wf", "k"))
    assert status.state is WorkflowState.FAILED
    assert status.error is not None and status.error["type"] == "TypeError"
    assert "non_retryable must be an exception class" in status.error["message"]
    assert ran == []
