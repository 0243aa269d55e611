"""A live chat room: one actor per room, its history in SQL, messages pushed to every member.

    ./run serve examples/chat.py --unauthenticated              # terminal 1: the server
    .venv/bin/python examples/chat.py ada                       # terminal 2: ada joins "lobby"
    .venv/bin/python examples/chat.py bob                       # terminal 3: bob joins; type

Each member holds a connection (a WebSocket) with its name in `conn.state`; `say` over it stores
the message and broadcasts it to every connection subscribed to "message". The room sleeps when
nobody speaks for a minute, with its members still connected, and wakes at the next message.
Plain HTTP works too:

    curl -X POST 'http://127.0.0.1:6420/actors/chat/actions/post?key=lobby' \\
         -H 'content-type: application/json' -d '{"args": ["ada", "hello"]}'
    curl -X POST 'http://127.0.0.1:6420/actors/chat/actions/messages?key=lobby' \\
         -H 'content-type: application/json' -d '{"kwargs": {"limit": 20}}'
"""

from __future__ import annotations

import codecs
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from pagekv.actor import ActorContext, Registry, actor

MAX_TEXT = 2000

chat = actor("chat", state={"members": []}, sleep_timeout=60)


@chat.on_migrate
async def _migrate(ctx: ActorContext) -> None:
    await ctx.db.execute(
        "CREATE TABLE IF NOT EXISTS messages("
        "id INTEGER PRIMARY KEY, author TEXT NOT NULL, text TEXT NOT NULL, "
        "at REAL NOT NULL DEFAULT (unixepoch('subsec')))"
    )


@chat.on_before_connect
async def _check(ctx: ActorContext, params: Any) -> None:
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str) or not 0 < len(name) <= 40:
        raise ValueError("connect with params {'name': '1 to 40 characters'}")


@chat.on_connect
async def _joined(ctx: ActorContext, conn: Any) -> None:
    conn.state = {"name": conn.params["name"]}
    ctx.broadcast("presence", {"joined": conn.params["name"], "online": _online(ctx)})


@chat.on_disconnect
async def _left(ctx: ActorContext, conn: Any) -> None:
    ctx.broadcast("presence", {"left": conn.state["name"], "online": _online(ctx)})


def _online(ctx: ActorContext) -> list[str]:
    return sorted(c.state["name"] for c in ctx.conns if c.state)


@chat.action
async def post(ctx: ActorContext, author: str, text: str) -> int:
    """Store a message and push it to the room; the author joins the room on their first post.
    Returns the message id."""
    if not text or len(text) > MAX_TEXT:
        raise ValueError(f"a message must have 1 to {MAX_TEXT} characters, got {len(text)}")
    async with ctx.db.transaction():
        rows = await ctx.db.execute(
            "INSERT INTO messages(author, text) VALUES (?, ?) RETURNING id", (author, text)
        )
        if author not in ctx.state["members"]:
            ctx.state["members"].append(author)
    ctx.broadcast("message", {"id": rows[0][0], "author": author, "text": text})
    return rows[0][0]


@chat.action
async def say(ctx: ActorContext, text: str) -> int:
    """`post`, as the member whose connection calls it."""
    if ctx.conn is None:
        raise ValueError("say is for connections; over HTTP, post(author, text)")
    return await post(ctx, ctx.conn.state["name"], text)


@chat.action
async def messages(ctx: ActorContext, after: int = 0, limit: int = 50) -> list[dict[str, Any]]:
    """Messages with an id above `after`, oldest first."""
    rows = await ctx.db.execute(
        "SELECT id, author, text, at FROM messages WHERE id > ? ORDER BY id LIMIT ?",
        (after, min(limit, 500)),
    )
    return [{"id": i, "author": a, "text": t, "at": at} for i, a, t, at in rows]


@chat.action
async def members(ctx: ActorContext) -> list[str]:
    return ctx.state["members"]


registry = Registry([chat])


async def _member(name: str, url: str, room: str) -> None:
    """A terminal member: prints the room's events, sends each line typed."""
    import anyio

    from pagekv.client import HttpClient

    async with (
        HttpClient(url, token=os.environ.get("PAGEKV_TOKEN")) as client,
        client.get_or_create("chat", room).connect({"name": name}) as conn,
    ):
        for message in await conn.messages(limit=20):
            print(f"{message['author']}: {message['text']}")

        async def show() -> None:
            async for event in conn.events("message", "presence"):
                data = event.payload
                if event.name == "message" and data["author"] != name:
                    print(f"{data['author']}: {data['text']}")
                elif event.name == "presence":
                    print(f"* online: {', '.join(data['online'])}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(show)
            async for line in _typed_lines():
                if line.strip():
                    await conn.say(line.strip())
            tg.cancel_scope.cancel()


async def _typed_lines() -> AsyncIterator[str]:
    """The lines read from stdin, without a thread: a thread blocked reading the terminal
    cannot be cancelled, so Ctrl-C would wait for the next Enter."""
    import anyio

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    while True:
        await anyio.wait_readable(sys.stdin.fileno())
        chunk = os.read(sys.stdin.fileno(), 65536)
        pending += decoder.decode(chunk, final=not chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line
        if not chunk:
            if pending:
                yield pending
            return


if __name__ == "__main__":
    import anyio

    if len(sys.argv) < 2:
        sys.exit("usage: python examples/chat.py NAME [URL] [ROOM]")
    url = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:6420"
    try:
        anyio.run(_member, sys.argv[1], url, sys.argv[3] if len(sys.argv) > 3 else "lobby")
    except KeyboardInterrupt:  # Ctrl-C: the connection is closed, the room told; no traceback
        sys.exit(130)
