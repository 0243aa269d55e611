"""Typed actions over real HTTP and WebSockets (#45): a JSON or CBOR body's objects, values and
ISO text arrive as the dataclasses, enums, `TypedDict`s and datetimes the action is annotated
with; a value that does not fit is a 400 `invalid_arguments` that wrote nothing; and a result
of those types is answered in JSON (an object, the enum's value, ISO text) and in CBOR (an
object, the value, a tagged datetime, a naive one as the same text as in JSON)."""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import anyio
import cbor2
import httpx
import msgspec
import pytest
from server_helpers import serving

from pagekv.actor import ActorContext, actor
from pagekv.client import RemoteError
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio

UTC = datetime.UTC
AT = datetime.datetime(2026, 12, 6, 23, 0, 5, tzinfo=UTC)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Item:
    sku: str
    color: Color = Color.RED


class Note(TypedDict):
    text: str
    at: datetime.datetime


@dataclass
class Receipt:
    items: list[Item]
    note: Note
    at: datetime.datetime
    local: datetime.datetime
    day: datetime.date
    total: int | None


shop = actor("typed", state={"receipts": 0})


@shop.action
async def checkout(
    ctx: ActorContext,
    items: list[Item],
    note: Note,
    at: datetime.datetime,
    total: int | None = None,
) -> Receipt:
    """What it was given, as its types, back: the answer shows the conversion went both ways."""
    assert all(type(i) is Item and type(i.color) is Color for i in items), items
    assert type(at) is datetime.datetime and type(note["at"]) is datetime.datetime
    ctx.state["receipts"] += 1
    return Receipt(items, note, at, at.replace(tzinfo=None), at.date(), total)


@shop.action
async def favourite(ctx: ActorContext, color: Color) -> Color:
    assert type(color) is Color
    return color


ARGS = {
    "items": [{"sku": "apple"}, {"sku": "plum", "color": "blue"}],
    "note": {"text": "gift", "at": "2026-12-06T23:00:05Z"},
    "at": "2026-12-06T23:00:05+00:00",
}


def post(http: httpx.AsyncClient, action: str, body: Any, *, cbor: bool = False) -> Any:
    if not cbor:
        return http.post(f"/actors/typed/actions/{action}", params={"key": "k"}, json=body)
    return http.post(
        f"/actors/typed/actions/{action}",
        params={"key": "k"},
        content=cbor2.dumps(body),
        headers={"content-type": "application/cbor", "accept": "application/cbor"},
    )


async def test_typed_arguments_and_results_in_json_and_cbor() -> None:
    async with serving([shop]) as served, served.http() as http:
        as_json = await post(http, "checkout", {"kwargs": ARGS})
        cbor_args = {**ARGS, "at": AT, "note": {"text": "gift", "at": AT}, "total": 3}
        as_cbor = await post(http, "checkout", {"kwargs": cbor_args}, cbor=True)
        color_json = await post(http, "favourite", {"args": ["blue"]})
        color_cbor = await post(http, "favourite", {"args": ["red"]}, cbor=True)
    assert as_json.status_code == 200, as_json.text
    assert as_json.json() == {
        "result": {
            "items": [{"sku": "apple", "color": "red"}, {"sku": "plum", "color": "blue"}],
            "note": {"text": "gift", "at": "2026-12-06T23:00:05+00:00"},
            "at": "2026-12-06T23:00:05+00:00",
            "local": "2026-12-06T23:00:05",
            "day": "2026-12-06",
            "total": None,
        }
    }
    assert as_cbor.status_code == 200, as_cbor.content
    assert cbor2.loads(as_cbor.content) == {
        "result": {
            "items": [{"sku": "apple", "color": "red"}, {"sku": "plum", "color": "blue"}],
            "note": {"text": "gift", "at": AT},
            "at": AT,
            "local": "2026-12-06T23:00:05",  # no CBOR tag holds a naive datetime: as in JSON
            "day": datetime.date(2026, 12, 6),
            "total": 3,
        }
    }
    assert color_json.json() == {"result": "blue"}
    assert cbor2.loads(color_cbor.content) == {"result": "red"}


async def test_a_value_that_does_not_fit_is_refused_and_writes_nothing() -> None:
    refusals = [
        ({"kwargs": {**ARGS, "items": [{"sku": 1}]}}, "but items[0]['sku'] is int 1"),
        ({"kwargs": {**ARGS, "items": [{"sku": "a", "color": "green"}]}}, "items[0]['color']"),
        ({"kwargs": {**ARGS, "note": {"text": "x"}}}, "missing required field `at`"),
        ({"kwargs": {**ARGS, "at": "soon"}}, "'at' must be datetime, got str 'soon'"),
        ({"kwargs": {**ARGS, "total": "3"}}, "'total' must be int | None, got str '3'"),
    ]
    async with serving([shop]) as served, served.http() as http:
        answers = [await post(http, "checkout", body) for body, _ in refusals]
        color = await post(http, "favourite", {"args": ["green"]})
        actors = (await http.get("/inspect/actors")).json()["actors"]
    for response, (_, expected) in zip(answers, refusals, strict=True):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_arguments" and error["written"] is False
        assert error["message"].startswith("action 'checkout' of actor 'typed': argument ")
        assert expected in error["message"], error["message"]
    assert color.json()["error"]["message"] == (
        "action 'favourite' of actor 'typed': argument 'color' must be Color, got str 'green'"
    )
    assert actors == [], "a refused call creates no actor"


async def test_a_connection_and_the_python_client_convert_the_same_way() -> None:
    async with serving([shop]) as served, served.client() as client:
        handle = client.get_or_create("typed", "k")
        # the client sends a dataclass, an enum and a datetime as their fields, value and tag
        note = {"text": "by client", "at": AT}
        sent = await handle.checkout([Item("fig", Color.BLUE)], note, AT)
        async with handle.connect() as conn:
            over_socket = await conn.checkout(ARGS["items"], note, "2026-12-06T23:00:05Z", 1)
            assert await conn.favourite(Color.BLUE) == "blue"
            with pytest.raises(Exception, match=r"'color' must be Color, got str 'green'"):
                await conn.favourite("green")
    assert sent["items"] == [{"sku": "fig", "color": "blue"}] and sent["at"] == AT
    assert over_socket["items"] == [
        {"sku": "apple", "color": "red"},
        {"sku": "plum", "color": "blue"},
    ]
    assert (over_socket["at"], over_socket["total"], over_socket["note"]) == (AT, 1, note)


async def test_the_actor_type_lists_the_typed_parameters() -> None:
    async with serving([shop]) as served, served.http() as http:
        described = (await http.get("/actors/typed")).json()
    (checkout, favourite) = described["actions"]
    assert [(p["name"], p["annotation"], p["default"]) for p in checkout["parameters"]] == [
        ("items", "list[Item]", None),
        ("note", "Note", None),
        ("at", "datetime.datetime", None),
        ("total", "int | None", "None"),
    ]
    assert (checkout["returns"], favourite["returns"]) == ("Receipt", "Color")


@dataclass
class Link:
    """`after` is never set by `__init__`: an instance may hold no value for it at all."""

    name: str
    next: Link | None = None
    after: int = field(init=False)


edges = actor("typed_edges", state={"calls": 0})


@edges.action
async def take(ctx: ActorContext, count: Annotated[int, msgspec.Meta(ge=0, le=10)]) -> int:
    ctx.state["calls"] += 1
    return count


@edges.action
async def chain(ctx: ActorContext, cyclic: bool) -> Link:
    """A result with a field that holds no value, or (`cyclic`) one that holds itself."""
    ctx.state["calls"] += 1
    link = Link("a", Link("b"))
    if cyclic:
        assert link.next is not None
        link.next.next = link
    return link


async def test_an_annotated_constraint_is_checked() -> None:
    """`Annotated[int, msgspec.Meta(ge=0, le=10)]`: its bounds are part of the type (they were
    dropped with the annotation's extras, and -5 reached the action)."""
    async with serving([edges]) as served, served.http() as http:
        low = await http.post("/actors/typed_edges/actions/take?key=k", json={"args": [-5]})
        high = await http.post("/actors/typed_edges/actions/take?key=k", json={"args": [11]})
        fits = await http.post("/actors/typed_edges/actions/take?key=k", json={"args": [10]})
    for refused, given in ((low, "got int -5"), (high, "got int 11")):
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["written"]) == ("invalid_arguments", False)
        assert error["message"] == (
            "action 'take' of actor 'typed_edges': argument 'count' must be "
            f"Annotated[int, msgspec.Meta(ge=0, le=10)], {given}"
        )
    assert fits.json() == {"result": 10}


async def test_a_dataclass_field_without_a_value_is_left_out_of_a_result() -> None:
    """A `field(init=False)` never set is sent as msgspec sends it, left out (reading it raised
    `AttributeError`: a 500 over HTTP, a dropped socket over a connection, after the writes)."""
    expected = {"name": "a", "next": {"name": "b", "next": None}}
    async with serving([edges]) as served, served.http() as http:
        url = "/actors/typed_edges/actions/chain?key=k"
        as_json = await http.post(url, json={"args": [False]})
        as_cbor = await http.post(
            url, json={"args": [False]}, headers={"accept": "application/cbor"}
        )
        async with (
            served.client() as client,
            client.get_or_create("typed_edges", "k").connect() as conn,
        ):
            with anyio.fail_after(10):
                over_socket = await conn.chain(False)
    assert (as_json.status_code, as_json.json()) == (200, {"result": expected}), as_json.text
    assert cbor2.loads(as_cbor.content) == {"result": expected}
    assert over_socket == expected


async def test_a_cyclic_result_over_a_connection_is_an_error_answer() -> None:
    """A result that holds itself cannot be encoded (recursion): the call is answered with
    `unencodable_result` and the connection goes on (the RecursionError dropped the socket, and
    the client saw its call end with 1006 'it may have run')."""
    async with serving([edges]) as served, served.client() as client:
        handle = client.get_or_create("typed_edges", "k")
        async with handle.connect() as conn:
            with anyio.fail_after(10):
                with pytest.raises(RemoteError, match="an answer must be CBOR-serialisable") as e:
                    await conn.chain(True)
                after = await conn.take(3)
            reconnects = conn.reconnects
        async with served.http() as http:
            over_http = await http.post(
                "/actors/typed_edges/actions/chain?key=k", json={"args": [True]}
            )
    assert e.value.code == "unencodable_result"
    assert (after, reconnects) == (3, 0)
    assert over_http.status_code == 422, over_http.text
    assert over_http.json()["error"]["code"] == "unencodable_result"
    assert over_http.json()["error"]["written"] is True


@edges.action
async def forward(ctx: ActorContext, item: Item, at: datetime.datetime) -> int:
    """Sends its converted arguments on, as they are, to another actor's queue."""
    inbox = ctx.client.get_or_create("typed_edges", "inbox")
    return await inbox.send("items", {"item": item, "color": item.color, "at": at})


@edges.action
async def take_message(ctx: ActorContext) -> Any:
    message = await ctx.queue.next(["items"], timeout=0)
    return None if message is None else message.body


async def test_a_queue_message_holds_a_dataclass_as_its_fields() -> None:
    """A message sent from inside a server (`ctx.client`, which does not go through HTTP) with a
    dataclass, an enum and a naive datetime is stored as an HTTP client's would be: fields,
    value, ISO text (cbor2 refused all three, so the action failed with a 500)."""
    async with serving([edges]) as served, served.http() as http:
        sent = await http.post(
            "/actors/typed_edges/actions/forward?key=k",
            json={"args": [{"sku": "fig", "color": "blue"}, "2026-12-06T23:00:05"]},
        )
        taken = await http.post("/actors/typed_edges/actions/take_message?key=inbox", json={})
    assert sent.status_code == 200, sent.text
    assert taken.json() == {
        "result": {
            "item": {"sku": "fig", "color": "blue"},
            "color": "blue",
            "at": "2026-12-06T23:00:05",
        }
    }


relay = actor("typed_relay")


@relay.action
async def relay_checkout(ctx: ActorContext) -> Any:
    """An actor's typed call of another actor, which another server of the store owns: its
    arguments go over HTTP (`OwnerCalls`) as a client's would."""
    shop_k = ctx.client.get_or_create("typed", "k")
    color = await shop_k.favourite(Color.BLUE)
    receipt = await shop_k.checkout([Item("fig", Color.BLUE)], Note(text="t", at=AT), AT)
    return {"color": color, "items": receipt["items"]}


async def test_typed_calls_convert_at_the_owner_when_forwarded_and_between_servers() -> None:
    """Two servers of one store: a typed call reaching the server that does not own the actor is
    forwarded as it came (its body's text) and converted by the owner; and an actor's call with
    a dataclass and an enum to an actor the other server owns arrives converted."""
    store = MemoryStore()
    async with (
        serving([shop, relay], kv=store, advertise=True, forward_keepalive_s=0.1) as a,
        serving([shop, relay], kv=store, advertise=True, forward_keepalive_s=0.1) as b,
        a.http() as at_a,
        b.http() as at_b,
    ):
        assert (await post(at_a, "favourite", {"args": ["red"]})).json() == {"result": "red"}
        forwarded = await post(at_b, "checkout", {"kwargs": ARGS})
        assert forwarded.status_code == 200, forwarded.text
        assert forwarded.json()["result"]["items"][1] == {"sku": "plum", "color": "blue"}
        bad = await post(at_b, "favourite", {"args": ["green"]})
        assert bad.status_code == 400 and bad.json()["error"]["written"] is False, bad.text
        relayed = await at_b.post("/actors/typed_relay/actions/relay_checkout?key=r", json={})
        assert relayed.status_code == 200, relayed.text
        assert relayed.json() == {
            "result": {"color": "blue", "items": [{"sku": "fig", "color": "blue"}]}
        }
        owners = await at_b.get("/inspect/actors?name=typed&owners=1")
        (entry,) = owners.json()["actors"]
        assert entry["owner"]["address"] == a.url, entry  # it stayed on A all along
