"""Databases written by every released internal schema version open with the current runtime."""

from __future__ import annotations

import pytest
from fixture_store import load_fixture

from pagekv.actor import ActorContext, ActorError, Registry, actor
from pagekv.vfs import open_database

notes = actor("notes", state={"count": 0})


@notes.action
async def summary(ctx: ActorContext) -> dict[str, object]:
    rows = await ctx.db.execute("SELECT body FROM notes ORDER BY id")
    schedules = await ctx.schedule.list()
    message = await ctx.queue.next(["inbox"], timeout=0)
    return {
        "count": ctx.state["count"],
        "bodies": [r[0] for r in rows],
        "schedules": [(s.action, s.args) for s in schedules],
        "message": None if message is None else message.body,
    }


@pytest.mark.anyio
@pytest.mark.parametrize("version", [1])
async def test_opens_every_released_internal_version(version: int) -> None:
    store = load_fixture(version)
    async with Registry([notes], kv=store).run() as client:
        got = await client.get("notes", "fixture").summary()
    assert got == {
        "count": 2,
        "bodies": ["first", "second"],
        "schedules": [("add", ("from a schedule",))] * 2,
        "message": {"body": "first"},
    }


@pytest.mark.anyio
async def test_a_newer_internal_version_is_refused_clearly() -> None:
    store = load_fixture(1)
    with open_database(store.namespace("notes/fixture")) as db:
        db.execute("UPDATE _pagekv_meta SET value = 99 WHERE key = 'schema_version'")
    async with Registry([notes], kv=store).run() as client:
        with pytest.raises(ActorError, match="internal schema version 99"):
            await client.get("notes", "fixture").summary()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
