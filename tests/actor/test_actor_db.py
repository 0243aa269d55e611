"""`ctx.db` and `ctx.state`: transactions that commit or roll back both, the reserved `_pagekv_`
prefix, CBOR-only state, storage failures at commit, errors for unknown actors and actions, and
destroy-then-recreate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest

from pagekv.actor import (
    ActionNotFound,
    ActorContext,
    ActorDefinition,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    Registry,
    ReservedName,
    UnknownActor,
    actor,
)
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.kv import FaultKind, FaultyStore, InvalidKey, MemoryStore

pytestmark = pytest.mark.anyio


def bank() -> ActorDefinition:
    """State `balance` and table `moves` are changed together in `move`'s transaction."""
    a = actor("bank", state={"balance": 0})

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        await ctx.db.execute(
            "CREATE TABLE IF NOT EXISTS moves(id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"
        )

    @a.action
    async def move(ctx: ActorContext, amount: int, *, fail: bool = False) -> int:
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO moves(amount) VALUES (?)", (amount,))
            ctx.state["balance"] += amount
            if fail:
                raise ValueError("rejected")
        return ctx.state["balance"]

    @a.action
    async def move_unchecked(ctx: ActorContext, amount: int) -> int:
        """Outside a transaction: the SQL autocommits, the state is saved after the action."""
        await ctx.db.execute("INSERT INTO moves(amount) VALUES (?)", (amount,))
        ctx.state["balance"] += amount
        return ctx.state["balance"]

    @a.action
    async def view(ctx: ActorContext) -> tuple[int, list[int]]:
        rows = await ctx.db.execute("SELECT amount FROM moves ORDER BY id")
        return ctx.state["balance"], [r for (r,) in rows]

    @a.action
    async def sql(ctx: ActorContext, statement: str) -> list[Any]:
        return await ctx.db.execute(statement)

    @a.action
    async def sql_in_transaction(ctx: ActorContext, statement: str) -> list[Any]:
        async with ctx.db.transaction():
            return await ctx.db.execute(statement)

    @a.action
    async def nested(ctx: ActorContext) -> None:
        async with ctx.db.transaction(), ctx.db.transaction():
            pass

    @a.action
    async def nap(ctx: ActorContext) -> None:
        ctx.sleep()

    return a


async def test_failed_transaction_rolls_back_sql_and_state(wait_for) -> None:
    registry = Registry([bank()], kv="memory://")
    async with registry.run() as client:
        handle = client.get_or_create("bank", "k")
        assert await handle.move(10) == 10
        with pytest.raises(ValueError, match="rejected"):
            await handle.move(5, fail=True)
        assert await handle.view() == (10, [10])
        assert await handle.move(1) == 11
        # The durable copy agrees with what the instance showed.
        await handle.nap()
        await wait_for(lambda: not registry.live(), what="sleep")
        assert await handle.view() == (11, [10, 1])


async def test_transactions_do_not_nest() -> None:
    async with Registry([bank()], kv="memory://").run() as client:
        with pytest.raises(RuntimeError, match="does not nest"):
            await client.get_or_create("bank", "k").nested()
        assert await client.get("bank", "k").view() == (0, [])


async def test_commit_lost_answer_is_atomic_state_and_sql_together() -> None:
    """The commit is applied but its answer lost: the instance dies, and the fresh instance
    sees both the row and the state of that transaction."""
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    registry = Registry([bank()], kv=store)
    async with registry.run() as client:
        handle = client.get_or_create("bank", "k")
        assert await handle.move(10) == 10
        store.faulty["bank/k"].arm(FaultKind.APPLY_THEN_RAISE)
        with pytest.raises(ActorStopped):
            await handle.move(5)
        assert store.faulty["bank/k"].fired_count() == 1
        assert await handle.view() == (15, [10, 5])


async def test_commit_that_fails_before_applying_keeps_state_and_sql_together() -> None:
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    registry = Registry([bank()], kv=store)
    async with registry.run() as client:
        handle = client.get_or_create("bank", "k")
        assert await handle.move(10) == 10
        store.faulty["bank/k"].arm(FaultKind.FAIL_BEFORE)
        with pytest.raises(Exception):  # noqa: B017 - which error is not the point here
            await handle.move(5)
        assert store.faulty["bank/k"].fired_count() == 1
        balance, rows = await handle.view()
    assert balance == sum(rows)


async def test_failed_commit_does_not_leave_a_transaction_open(tmp_path: Path) -> None:
    a = bank()

    @a.action
    async def orphan(ctx: ActorContext) -> None:
        await ctx.db.execute("PRAGMA foreign_keys = ON")
        async with ctx.db.transaction():
            await ctx.db.execute("INSERT INTO child VALUES (99)")  # no parent 99
            ctx.state["balance"] += 1000

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS moves(id INTEGER PRIMARY KEY, amount)")
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS parent(id INTEGER PRIMARY KEY)")
        await ctx.db.execute(
            "CREATE TABLE IF NOT EXISTS child("
            "pid REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
        )

    url = f"file://{tmp_path}/store"
    async with Registry([a], kv=url).run() as client:
        handle = client.get_or_create("bank", "k")
        with pytest.raises(apsw.ConstraintError):
            await handle.orphan()
        await handle.move_unchecked(7)  # acknowledged: must be durable
    async with Registry([a], kv=url).run() as client:
        view = await client.get("bank", "k").view()
    assert view == (7, [7])


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE _pagekv_mine(x)",
        "CREATE TABLE _PAGEKV_upper(x)",
        "CREATE TEMP TABLE _pagekv_tmp(x)",
        "CREATE VIEW _pagekv_view AS SELECT 1",
        "CREATE INDEX _pagekv_idx ON moves(amount)",
        "CREATE TRIGGER t AFTER INSERT ON _pagekv_state BEGIN SELECT 1; END",
        "CREATE VIRTUAL TABLE _pagekv_fts USING fts5(x)",
        "INSERT OR REPLACE INTO _pagekv_state(id, data) VALUES (1, x'a0')",
        "UPDATE _pagekv_meta SET value = 99",
        "DELETE FROM _pagekv_state",
        "DROP TABLE _pagekv_state",
        "ALTER TABLE _pagekv_state ADD COLUMN y",
        "ALTER TABLE _pagekv_state RENAME TO mine",
    ],
)
async def test_user_sql_cannot_touch_reserved_tables(statement: str) -> None:
    async with Registry([bank()], kv="memory://").run() as client:
        handle = client.get_or_create("bank", "k")
        await handle.move(3)
        with pytest.raises(ReservedName, match="_pagekv_"):
            await handle.sql(statement)
        with pytest.raises(ReservedName, match="_pagekv_"):
            await handle.sql_in_transaction(statement)
        # Nothing changed, and the actor still works.
        assert await handle.move(1) == 4
        assert await handle.view() == (4, [3, 1])
        # Reading the runtime's tables is allowed.
        assert await handle.sql("SELECT count(*) FROM _pagekv_state") == [(1,)]


async def test_user_sql_cannot_rename_into_the_reserved_prefix(attempt) -> None:
    async with Registry([bank()], kv="memory://").run() as client:
        handle = client.get_or_create("bank", "k")
        outcome = await attempt(handle.sql("ALTER TABLE moves RENAME TO _pagekv_moves"))
    assert isinstance(outcome, ReservedName)


async def test_on_migrate_cannot_create_reserved_tables() -> None:
    a = actor("sneaky")

    @a.on_migrate
    async def on_migrate(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE _pagekv_sneaky(x)")

    @a.action
    async def ping(ctx: ActorContext) -> str:
        return "pong"

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        with pytest.raises(ReservedName):
            await client.get_or_create("sneaky", "k").ping()
        assert registry.live() == []


async def test_state_must_be_cbor_serialisable() -> None:
    a = actor("picky", state={"ok": 1})

    @a.action
    async def store(ctx: ActorContext, bad: bool) -> None:
        if bad:
            ctx.state["bad"] = object()
        else:
            ctx.state.pop("bad", None)

    @a.action
    async def get(ctx: ActorContext) -> Any:
        return ctx.state

    async with Registry([a], kv="memory://").run() as client:
        handle = client.get_or_create("picky", "k")
        with pytest.raises(TypeError, match="CBOR"):
            await handle.store(True)
        await handle.store(False)
        assert await handle.get() == {"ok": 1}


async def test_unserialisable_initial_state_fails_creation_clearly() -> None:
    a = actor("bad-default", state=lambda: {"when": object()})

    @a.action
    async def ping(ctx: ActorContext) -> str:
        return "pong"

    registry = Registry([a], kv="memory://")
    async with registry.run() as client:
        with pytest.raises(TypeError, match="CBOR"):
            await client.get_or_create("bad-default", "k").ping()
        assert registry.live() == []


async def test_unknown_actor_action_and_missing_actor_errors() -> None:
    async with Registry([bank()], kv="memory://").run() as client:
        with pytest.raises(UnknownActor, match="bank"):  # the message lists the known names
            client.get("nope", "k")
        with pytest.raises(UnknownActor):
            client.get_or_create("nope", "k")
        with pytest.raises(UnknownActor):
            await client.create("nope", "k")
        with pytest.raises(ActorNotFound):
            await client.get("bank", "missing").view()
        with pytest.raises(ActorNotFound):
            await client.destroy("bank", "missing")

        await client.create("bank", "k")
        with pytest.raises(ActorExists):
            await client.create("bank", "k")
        with pytest.raises(ActionNotFound, match="withdraw"):
            await client.get("bank", "k").withdraw(1)
        with pytest.raises(ActionNotFound):
            await client.get("bank", "k").call("on_migrate")  # hooks are not actions
        with pytest.raises(TypeError):
            await client.get("bank", "k").move()  # the action's own error, unchanged
        assert await client.get("bank", "k").view() == (0, [])


@pytest.mark.parametrize("key", [5, "text", None])
async def test_user_kv_keys_must_be_bytes(key: object) -> None:
    """`bytes(5)` is five zero bytes: without the check, `ctx.kv.get([5])` read that key."""
    a = actor("keys")

    @a.action
    async def get(ctx: ActorContext, key: Any) -> list[bytes | None]:
        return await ctx.kv.get([key])

    @a.action
    async def put(ctx: ActorContext, key: Any) -> None:
        await ctx.kv.put({key: b"v"})

    @a.action
    async def listed(ctx: ActorContext, prefix: Any) -> list[tuple[bytes, bytes]]:
        return await ctx.kv.list(prefix=prefix)

    async with Registry([a], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("keys", "k")
        for action, what in (("get", "key"), ("put", "key"), ("listed", "prefix")):
            with pytest.raises(InvalidKey, match=f"{what} must be bytes"):
                await handle.call(action, key)
        assert await handle.listed(b"") == []


@pytest.mark.parametrize("url", ["memory://", "file"])
async def test_destroy_then_recreate_starts_empty(url: str, tmp_path: Path) -> None:
    if url == "file":
        url = f"file://{tmp_path}/store"
    a = bank()

    @a.action
    async def stash(ctx: ActorContext) -> list[tuple[bytes, bytes]]:
        await ctx.kv.put({b"secret": b"1"})
        return await ctx.kv.list()

    @a.action
    async def tables(ctx: ActorContext) -> list[str]:
        rows = await ctx.db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
        user = sorted(n for (n,) in rows if not n.startswith(("_pagekv_", "sqlite_")))
        return [*user, str(await ctx.kv.list())]

    @a.action
    async def extra(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE extra(x)")

    registry = Registry([a], kv=url)
    async with registry.run() as client:
        handle = client.get_or_create("bank", "k")
        await handle.move(5)
        await handle.extra()
        assert await handle.stash() == [(b"secret", b"1")]
        assert await handle.tables() == ["extra", "moves", "[(b'secret', b'1')]"]

        await client.destroy("bank", "k")
        assert registry.live() == []
        with pytest.raises(ActorNotFound):
            await client.get("bank", "k").view()

        fresh = await client.create("bank", "k")
        assert await fresh.view() == (0, [])
        assert await fresh.tables() == ["moves", "[]"]
