"""A chat room: one actor per room, its history in SQL, the member list in its state.

    ./run serve examples/chat.py --unauthenticated
    curl -X POST 'http://127.0.0.1:6420/actors/chat/actions/post?key=lobby' \
         -H 'content-type: application/json' -d '{"args": ["ada", "hello"]}'
    curl -X POST 'http://127.0.0.1:6420/actors/chat/actions/messages?key=lobby' \
         -H 'content-type: application/json' -d '{"kwargs": {"limit": 20}}'
"""

from __future__ import annotations

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


@chat.action
async def post(ctx: ActorContext, author: str, text: str) -> int:
    """Append a message; the author joins the room on their first post. Returns the message id."""
    if not text or len(text) > MAX_TEXT:
        raise ValueError(f"a message must have 1 to {MAX_TEXT} characters, got {len(text)}")
    async with ctx.db.transaction():
        rows = await ctx.db.execute(
            "INSERT INTO messages(author, text) VALUES (?, ?) RETURNING id", (author, text)
        )
        if author not in ctx.state["members"]:
            ctx.state["members"].append(author)
    return rows[0][0]


@chat.action
async def messages(ctx: ActorContext, after: int = 0, limit: int = 50) -> list[dict[str, Any]]:
    """Messages with an id above `after`, oldest first (poll with the last id you saw)."""
    rows = await ctx.db.execute(
        "SELECT id, author, text, at FROM messages WHERE id > ? ORDER BY id LIMIT ?",
        (after, min(limit, 500)),
    )
    return [{"id": i, "author": a, "text": t, "at": at} for i, a, t, at in rows]


@chat.action
async def members(ctx: ActorContext) -> list[str]:
    return ctx.state["members"]


registry = Registry([chat])
