"""An action's annotated arguments are converted into their types before it runs (#45): a
dataclass from an object, a `TypedDict` checked field by field, an enum from its value, a
datetime from ISO 8601 text, a union's member, a list of dataclasses item by item; a value that
does not fit is an `InvalidArguments` naming the action, the argument, the type, where in the
value, and a short rendering of what is there. Every in-process way of calling (the client, a
connection, a schedule) gets the same converted values.

This file's annotations are strings (`from __future__ import annotations`), as an app's often
are: the conversion resolves them."""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any, TypedDict

import anyio
import pytest

from pagekv.actor import ActorContext, InvalidArguments, Registry, actor
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio

UTC = datetime.UTC


@dataclass
class Item:
    sku: str
    amount: int = 1


class Order(TypedDict):
    sku: str
    amount: int


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


shop = actor("shop", state={"seen": []})


@shop.action
async def item(ctx: ActorContext, item: Item) -> Item:
    return item


@shop.action
async def order(ctx: ActorContext, order: Order) -> Order:
    return order


@shop.action
async def paint(ctx: ActorContext, color: Color, size: Size = Size.SMALL) -> list[Any]:
    return [color, size]


@shop.action
async def when(ctx: ActorContext, at: datetime.datetime, day: datetime.date | None = None) -> Any:
    return [at, day]


@shop.action
async def either(ctx: ActorContext, what: int | Item) -> int | Item:
    return what


@shop.action
async def basket(
    ctx: ActorContext, items: list[Item], by_sku: dict[str, Item] | None = None
) -> Any:
    return [items, by_sku]


@shop.action
async def count(ctx: ActorContext, a: int, b: int, ratio: float = 0.0, tags: list = []) -> Any:  # noqa: B006
    return [a, b, ratio, tags]


@shop.action
async def tag(ctx: ActorContext, tags: set[str]) -> None:
    pass


@shop.action
async def remember(ctx: ActorContext, item: Item) -> None:
    ctx.state["seen"].append(repr(item))


@shop.action
async def later(ctx: ActorContext, raw: dict[str, Any]) -> None:
    await ctx.schedule.after(0.01, "remember", raw)


@shop.action
async def seen(ctx: ActorContext) -> list[str]:
    return list(ctx.state["seen"])


def refusal(action: str, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidArguments) as refused:
        shop.resolve(action, args, kwargs)
    message = str(refused.value)
    assert message.startswith(f"action {action!r} of actor 'shop': argument "), message
    assert "\n" not in message and len(message) < 300, message
    return message


def converted(action: str, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    fn, args, kwargs = shop.resolve(action, args, kwargs)
    assert fn is shop.actions[action]
    return args, kwargs


def test_a_dataclass_is_made_from_an_object_and_refused_field_by_field() -> None:
    assert converted("item", {"sku": "apple", "amount": 2}) == ((Item("apple", 2),), {})
    assert type(converted("item", {"sku": "apple"})[0][0]) is Item  # the default filled in
    given = Item("pear", 3)
    assert converted("item", item=given)[1]["item"] is given  # an instance stays as it is
    assert refusal("item", {"sku": 7}) == (
        "action 'item' of actor 'shop': argument 'item' must be Item, but item['sku'] is int 7"
    )
    assert "'item' must be Item, but item['amount'] is str '2'" in refusal(
        "item", {"sku": "a", "amount": "2"}
    )
    assert refusal("item", {"amount": 2}).endswith(
        "argument 'item' must be Item, got dict {'amount': 2} (Object missing required field `sku`)"
    )
    assert "'item' must be Item, got list ['apple', 2]" in refusal("item", ["apple", 2])


def test_a_typed_dict_is_checked_field_by_field() -> None:
    (value,), _ = converted("order", {"sku": "fig", "amount": 4})
    assert value == {"sku": "fig", "amount": 4} and type(value) is dict
    assert "'order' must be Order, but order['amount'] is bool True" in refusal(
        "order", {"sku": "fig", "amount": True}
    )
    assert "(Object missing required field `amount`)" in refusal("order", {"sku": "fig"})


def test_an_enum_is_made_from_its_value() -> None:
    assert converted("paint", "red", 2) == ((Color.RED, Size.LARGE), {})
    assert converted("paint", Color.BLUE) == ((Color.BLUE,), {})
    assert refusal("paint", "green") == (
        "action 'paint' of actor 'shop': argument 'color' must be Color, got str 'green'"
    )
    assert "'size' must be Size, got int 3" in refusal("paint", "red", 3)
    assert "'size' must be Size, got str '1'" in refusal("paint", "red", "1")


def test_a_datetime_is_made_from_iso_text_or_taken_as_it_is() -> None:
    at = datetime.datetime(2026, 12, 6, 22, 55, 1, tzinfo=UTC)
    assert converted("when", "2026-12-06T22:55:01Z") == ((at,), {})
    assert converted("when", at, "2026-12-06") == ((at, datetime.date(2026, 12, 6)), {})
    naive = datetime.datetime(2026, 12, 6, 22, 55)
    assert converted("when", "2026-12-06T22:55:00") == ((naive,), {})
    assert refusal("when", "yesterday") == (
        "action 'when' of actor 'shop': argument 'at' must be datetime, got str 'yesterday' "
        "(Invalid RFC3339 encoded datetime)"
    )
    assert "'at' must be datetime, got int 1765061701" in refusal("when", 1765061701)
    assert "'day' must be date | None, got str '2026-13-01' (Invalid RFC3339 encoded date)" in (
        refusal("when", at, "2026-13-01")
    )


def test_a_union_takes_the_member_a_value_fits() -> None:
    assert converted("either", 5) == ((5,), {})
    assert converted("either", {"sku": "kiwi"}) == ((Item("kiwi"),), {})
    assert "'what' must be int | Item, got str '5'" in refusal("either", "5")
    assert "'what' must be int | Item, got bool True" in refusal("either", True)
    assert "'what' must be int | Item, but what['sku'] is NoneType None" in refusal(
        "either", {"sku": None}
    )


def test_a_list_of_dataclasses_is_converted_item_by_item() -> None:
    (items, by_sku), _ = converted(
        "basket", [{"sku": "a"}, {"sku": "b", "amount": 5}], {"c": {"sku": "c"}}
    )
    assert items == [Item("a"), Item("b", 5)] and by_sku == {"c": Item("c")}
    assert refusal("basket", [{"sku": "a"}, {"sku": 2}]).endswith(
        "argument 'items' must be list[Item], but items[1]['sku'] is int 2"
    )
    assert "'by_sku' must be dict[str, Item] | None, but by_sku['y']['amount'] is str 'x'" in (
        refusal("basket", [], {"x": {"sku": "x"}, "y": {"sku": "y", "amount": "x"}})
    )
    assert "got a dict with the key int 3" in refusal("basket", [], {3: {"sku": "z"}})
    assert converted("tag", ["a", "b"]) == (({"a", "b"},), {})
    assert refusal("tag", ["a", 2]).endswith(
        "argument 'tags' must be set[str], but tags[1] is int 2"
    )
    # a set's items have no place to show: msgspec's own words say where and what
    assert refusal("tag", {2}).endswith(
        "argument 'tags' must be set[str], but at tags[0]: Expected `str`, got `int`"
    )
    huge = [{"sku": "s3cret" * 10_000}] * 10_000 + [{"sku": 1}]
    assert "but items[10000]['sku'] is int 1" in refusal("basket", huge)


def test_strict_scalars_are_kept_as_given() -> None:
    args, kwargs = (1, 2), {"ratio": 1.5}
    _, again, again_kwargs = shop.resolve("count", args, kwargs)
    assert again is args and again_kwargs is kwargs, "nothing converted: the very arguments given"
    assert converted("count", 1, 2, 3) == ((1, 2, 3.0), {})
    assert type(converted("count", 1, 2, 3)[0][2]) is float
    assert converted("count", 1, 2, tags=(1, "x")) == ((1, 2), {"tags": [1, "x"]})
    assert "'b' must be int, got bool False" in refusal("count", 1, False)
    assert "'b' must be int, got float 2.0" in refusal("count", 1, 2.0)


async def test_every_in_process_caller_gets_the_converted_values() -> None:
    async with Registry([shop], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("shop", "k")
        assert await handle.item({"sku": "apple", "amount": 2}) == Item("apple", 2)
        assert await handle.paint("blue") == [Color.BLUE, Size.SMALL]
        async with handle.connect() as conn:
            assert await conn.basket([{"sku": "b"}]) == [[Item("b")], None]
            with pytest.raises(InvalidArguments, match=r"but items\[0\]\['sku'\] is int 1"):
                await conn.basket([{"sku": 1}])
        await handle.later({"sku": "due", "amount": 9})
        with anyio.fail_after(10):
            while not await handle.seen():
                await anyio.sleep(0.01)
        assert await handle.seen() == [repr(Item("due", 9))]
        with pytest.raises(InvalidArguments, match=r"'color' must be Color, got str 'green'"):
            await handle.paint("green")
