"""The examples, served over HTTP as their docstrings show them."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from server_helpers import serving

from pagekv.actor.realtime.client_connection import ConnectionClosed
from pagekv.server import load_registry

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parents[2] / "examples"


async def test_counter() -> None:
    registry = load_registry(str(EXAMPLES / "counter.py"))
    async with serving(registry.definitions.values()) as served:
        async with served.http() as http:  # the curl line of its docstring
            response = await http.post(
                "/actors/counter/actions/increment", params={"key": "room-1"}, json={"args": [5]}
            )
        assert response.json() == {"result": 5}
        async with served.client() as client:
            room = client.get_or_create("counter", "room-2", input={"start": 10})
            assert await room.increment(2) == 12
            assert await room.increment() == 13
            assert await room.history() == [1, 2]
            assert await client.get("counter", "room-1").get() == 5


async def test_chat() -> None:
    registry = load_registry(str(EXAMPLES / "chat.py"))
    async with serving(registry.definitions.values()) as served, served.client() as client:
        lobby = client.get_or_create("chat", "lobby")
        first = await lobby.post("ada", "hello")
        await lobby.post("bob", "hi ada")
        await lobby.post("ada", "how are you?")
        assert [(m["author"], m["text"]) for m in await lobby.messages(after=first)] == [
            ("bob", "hi ada"),
            ("ada", "how are you?"),
        ]
        assert await lobby.members() == ["ada", "bob"]
        async with served.http() as http:
            rows = await http.get(
                "/inspect/actors/chat/tables/messages", params={"key": "lobby", "limit": 1}
            )
            empty = await http.post(
                "/actors/chat/actions/post", params={"key": "lobby"}, json={"args": ["ada", ""]}
            )
        assert rows.json()["rows"][0][1:3] == ["ada", "hello"] and rows.json()["truncated"]
        assert empty.status_code == 500
        assert empty.json()["error"]["message"].startswith("ValueError: a message must have")


async def test_chat_is_live_for_its_members() -> None:
    registry = load_registry(str(EXAMPLES / "chat.py"))
    async with serving(registry.definitions.values()) as served, served.client() as client:
        lobby = client.get_or_create("chat", "live")
        async with lobby.connect({"name": "ada"}) as ada:
            await ada.subscribe("message")
            await ada.subscribe("presence")
            member = await anyio.open_process(
                [sys.executable, str(EXAMPLES / "chat.py"), "bob", served.url, "live"],
                env={**os.environ, "PAGEKV_TOKEN": served.token or ""},
            )
            async with member:
                joined = await ada.next_event("presence")
                assert joined.payload == {"joined": "bob", "online": ["ada", "bob"]}
                assert member.stdin is not None and member.stdout is not None
                await member.stdin.send(b"hello from a terminal\n")
                said = await ada.next_event("message")
                assert (said.payload["author"], said.payload["text"]) == (
                    "bob",
                    "hello from a terminal",
                )
                await ada.say("hi bob")
                printed = b""
                with anyio.fail_after(10):
                    while b"ada: hi bob" not in printed:
                        printed += await member.stdout.receive()
                await member.stdin.aclose()
                assert await member.wait() == 0
            left = await ada.next_event("presence")
            assert left.payload == {"left": "bob", "online": ["ada"]}
        with pytest.raises(ConnectionClosed) as refused:
            async with lobby.connect({"name": ""}):
                pass
        assert "1 to 40 characters" in refused.value.reason


async def test_ctrl_c_ends_a_chat_member_at_once_and_cleanly() -> None:
    """SIGINT while the member waits for a typed line (stdin open, nothing typed): it leaves
    the room and exits 130 with no traceback, without waiting for an Enter that never comes."""
    registry = load_registry(str(EXAMPLES / "chat.py"))
    async with (
        serving(registry.definitions.values()) as served,
        served.client() as client,
        client.get_or_create("chat", "quiet").connect({"name": "ada"}) as ada,
    ):
        await ada.subscribe("presence")
        member = await anyio.open_process(
            [sys.executable, str(EXAMPLES / "chat.py"), "bob", served.url, "quiet"],
            env={**os.environ, "PAGEKV_TOKEN": served.token or ""},
        )
        async with member:
            joined = await ada.next_event("presence")
            assert joined.payload["joined"] == "bob"
            member.send_signal(signal.SIGINT)
            with anyio.fail_after(20):  # a hang fails here, rather than at the suite's end
                code = await member.wait()
            assert member.stderr is not None
            stderr = b"".join([chunk async for chunk in member.stderr])
        assert code == 130, stderr
        assert b"Traceback" not in stderr, stderr
        left = await ada.next_event("presence")
        assert left.payload == {"left": "bob", "online": ["ada"]}


async def test_orders_workflow(eventually) -> None:
    spec = importlib.util.spec_from_file_location("orders_example", EXAMPLES / "orders.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.COOL_OFF_S = 0.3  # the workflow reads it when it reaches the sleep
    async with serving(example.registry.definitions.values()) as served:
        async with served.client() as client:
            order = await client.create("orders", "42", input={"item": "book", "quantity": 2})

            async def status() -> str:
                return (await order.status())["status"]

            async def awaiting() -> bool:
                return await status() == "awaiting-approval"

            await eventually(awaiting, what="the cool-off to pass")
            await order.send("approve", {"by": "ada"})

            async def approved() -> bool:
                return await status() == "approved"

            await eventually(approved, what="the approval")
            final = await order.status()
        async with served.http() as http:
            workflow = await http.get("/inspect/actors/orders/workflow", params={"key": "42"})
    assert final["decided_by"] == "ada"
    assert [e["event"] for e in final["events"]] == [
        "loaded",
        "awaiting approval",
        "approved 2 x book",
    ]
    history = workflow.json()["workflow"]
    assert (history["state"], history["output"]) == ("completed", "approved")
    assert [e["name"] for e in history["entries"]][:2] == ["load", "cool-off"]
