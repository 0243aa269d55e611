"""`GET /actors/NAME` over real HTTP: an actor type's actions with their parameters (kinds,
defaults and annotations as text), behind the token, without waking anything; 404 for a type
the app does not define."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import pytest
from server_helpers import serving

from pagekv.actor import ActorContext, actor

pytestmark = pytest.mark.anyio

shop = actor("shop", state={"orders": 0})
empty = actor("empty", state={})


@dataclass
class Item:
    sku: str
    count: int


@shop.action
async def order(
    ctx: ActorContext,
    item: Item,
    /,
    note: str | None = None,
    *tags: str,
    currency: str = "EUR",
    when: datetime.date = datetime.date(2026, 1, 2),
    **extra: Any,
) -> int:
    """Place an order.

    Counts it."""
    ctx.state["orders"] += 1
    return int(ctx.state["orders"])


@shop.action
async def count(ctx):
    return ctx.state["orders"]


async def test_the_actions_and_their_parameters_are_listed() -> None:
    async with serving([shop, empty]) as served, served.http() as http:
        listed = await http.get("/actors/shop")
        bare = await http.get("/actors/empty")
        cbor = await http.get("/actors/shop", headers={"accept": "application/cbor"})
    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "name": "shop",
        "actions": [
            {"name": "count", "doc": None, "parameters": [], "returns": None},
            {
                "name": "order",
                "doc": "Place an order.\n\nCounts it.",
                "parameters": [
                    {
                        "name": "item",
                        "kind": "positional_only",
                        "annotation": "Item",
                        "default": None,
                    },
                    {
                        "name": "note",
                        "kind": "positional_or_keyword",
                        "annotation": "str | None",
                        "default": "None",
                    },
                    {
                        "name": "tags",
                        "kind": "var_positional",
                        "annotation": "str",
                        "default": None,
                    },
                    {
                        "name": "currency",
                        "kind": "keyword_only",
                        "annotation": "str",
                        "default": "'EUR'",
                    },
                    {
                        "name": "when",
                        "kind": "keyword_only",
                        "annotation": "datetime.date",
                        "default": "datetime.date(2026, 1, 2)",
                    },
                    {"name": "extra", "kind": "var_keyword", "annotation": "Any", "default": None},
                ],
                "returns": "int",
            },
        ],
    }
    assert bare.json() == {"name": "empty", "actions": []}
    assert cbor.headers["content-type"] == "application/cbor"
    assert served.app.state.registry.live() == []  # nothing woke to answer


async def test_real_types_are_shown_as_python_writes_them() -> None:
    """Without `from __future__ import annotations` the annotations are types, not text."""
    typed = actor("typed", state={})

    async def scale(ctx: ActorContext, factor: float = 2.0) -> list[float]:
        return [factor]

    scale.__annotations__ = {"ctx": ActorContext, "factor": float, "return": list[float]}
    typed.action(scale)
    async with serving([typed]) as served, served.http() as http:
        listed = (await http.get("/actors/typed")).json()
    (action,) = listed["actions"]
    assert action["parameters"] == [
        {"name": "factor", "kind": "positional_or_keyword", "annotation": "float", "default": "2.0"}
    ]
    assert action["returns"] == "list[float]"


async def test_unknown_types_are_404_and_the_list_needs_the_token() -> None:
    async with serving([shop]) as served:
        async with served.http() as http:
            unknown = await http.get("/actors/nope")
            keyed = await http.get("/actors/shop", params={"key": "k"})
        async with served.http(token=None) as http:
            anonymous = await http.get("/actors/shop")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "unknown_actor"
    assert "'nope'" in unknown.json()["error"]["message"]
    assert "shop" in unknown.json()["error"]["message"]  # the known ones
    assert keyed.status_code == 400 and keyed.json()["error"]["code"] == "invalid_parameter"
    assert anonymous.status_code == 401
