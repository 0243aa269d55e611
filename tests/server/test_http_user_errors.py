"""Failures that are the caller's fault, over real HTTP: a `UserError` answers its own 4xx and
code with `written`, annotated arguments are checked before the actor is created (400
`invalid_arguments`), and every failed action is one record on `pagekv.server` naming the
actor, the action and the error's type: a 4xx one INFO line without the arguments or the
error's message, an action's crash an ERROR with its message and traceback (#43 item 10)."""

from __future__ import annotations

import logging
import re
from typing import Any

import cbor2
import httpx
import pytest
from server_helpers import serving

from pagekv.actor import ActorContext, InvalidArguments, UserError, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.client import RemoteError
from pagekv.kv import FaultKind, FaultyStore, MemoryStore

pytestmark = pytest.mark.anyio

SECRET = "hunter2-do-not-log"

shop = actor("shop", state={"orders": 0, "tries": 0})


@shop.on_migrate
async def _schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS orders(sku TEXT, amount INTEGER)")


@shop.action
async def buy(ctx: ActorContext, sku: str, amount: int = 1) -> int:
    ctx.state["tries"] += 1  # outside a transaction: it stands when the action fails
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO orders VALUES (?, ?)", (sku, amount))
        ctx.state["orders"] += 1
        if amount > 10:
            raise UserError(f"only 10 of {sku} left", code="out_of_stock", status=409)
    return ctx.state["orders"]


@shop.action
async def check(ctx: ActorContext, coupon: str) -> None:
    """Refuses every coupon, writing nothing."""
    raise UserError(f"no coupon {coupon!r}")


@shop.action
async def view(ctx: ActorContext) -> dict[str, Any]:
    rows = await ctx.db.execute("SELECT sku, amount FROM orders ORDER BY rowid")
    return {"state": ctx.state, "rows": [list(r) for r in rows]}


@shop.action
async def mixed(
    ctx: ActorContext,
    count: int,
    ratio: float = 0.0,
    tags: list[str] | None = None,
    blob: bytes = b"",
    extra: Any = None,
) -> list[Any]:
    return [count, ratio, tags, blob, extra]


@shop.action
async def crash(ctx: ActorContext, password: str) -> None:
    raise ValueError(f"bad password {password}")


@shop.action
async def touch(ctx: ActorContext) -> int:
    async with ctx.db.transaction():
        await ctx.db.execute("INSERT INTO orders VALUES ('touch', 0)")
    return 1


def call(http: httpx.AsyncClient, action: str, key: str = "k", **body: Any):
    return http.post(f"/actors/shop/actions/{action}", params={"key": key}, json=body)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


async def test_a_user_error_answers_its_status_code_and_written() -> None:
    async with serving([shop]) as served, served.http() as http:
        assert (await call(http, "buy", args=["apple", 2])).json() == {"result": 1}
        refused = await call(http, "check", args=["FREE"])
        stock = await call(http, "buy", args=["apple", 11])
        cbor = await http.post(
            "/actors/shop/actions/check",
            params={"key": "k"},
            json={"args": ["X"]},
            headers={"accept": "application/cbor"},
        )
        created = await call(http, "check", key="new", args=["FREE"])
        view = (await call(http, "view")).json()["result"]
    assert refused.status_code == 400
    assert error_of(refused) == {
        "code": "user_error",
        "message": "no coupon 'FREE'",
        "written": False,
    }
    # the transaction rolled back, the state change before it stands: written
    assert stock.status_code == 409
    assert error_of(stock) == {
        "code": "out_of_stock",
        "message": "only 10 of apple left",
        "written": True,
    }
    assert view == {"state": {"orders": 1, "tries": 2}, "rows": [["apple", 2]]}
    assert cbor.status_code == 400
    assert cbor2.loads(cbor.content)["error"]["code"] == "user_error"
    # the call that created the actor wrote, though the action wrote nothing
    assert created.status_code == 400 and error_of(created)["written"] is True


async def test_the_python_client_gets_the_status_and_code_of_a_user_error() -> None:
    async with serving([shop]) as served, served.client() as client:
        handle = client.get_or_create("shop", "k")
        with pytest.raises(RemoteError) as refused:
            await handle.buy("pear", 12)
        assert await handle.buy("pear", 1) == 1
    assert (refused.value.status, refused.value.code) == (409, "out_of_stock")
    assert refused.value.message == "only 10 of pear left"


async def test_annotated_arguments_are_checked_before_the_actor_is_created() -> None:
    async with serving([shop]) as served, served.http() as http:
        wrong = await call(http, "buy", args=["apple", "5"])
        boolean = await call(http, "buy", args=["apple", True])
        items = await call(http, "mixed", args=[1], kwargs={"tags": ["a", 2]})
        as_json = await call(http, "mixed", args=[1], kwargs={"blob": "not bytes"})
        actors = (await http.get("/inspect/actors")).json()["actors"]
        fine = await call(http, "mixed", args=[1, 2], kwargs={"tags": None, "extra": [{}]})
        cbor = await http.post(
            "/actors/shop/actions/mixed",
            params={"key": "k"},
            content=cbor2.dumps({"args": [3], "kwargs": {"blob": b"\x00\xff"}}),
            headers={"content-type": "application/cbor", "accept": "application/cbor"},
        )
    for response in (wrong, boolean, items, as_json):
        assert response.status_code == 400, response.text
        assert error_of(response)["code"] == "invalid_arguments"
        assert error_of(response)["written"] is False
    assert error_of(wrong)["message"] == (
        "action 'buy' of actor 'shop': argument 'amount' must be int, got str '5'"
    )
    assert "argument 'amount' must be int, got bool True" in error_of(boolean)["message"]
    assert "'tags' must be list[str] | None, but tags[1] is int 2" in error_of(items)["message"]
    assert "'blob' must be bytes, got str 'not bytes'" in error_of(as_json)["message"]
    assert actors == [], "a refused call creates no actor"
    assert fine.json() == {"result": [1, 2, None, {"$bytes": ""}, [{}]]}
    assert cbor2.loads(cbor.content) == {"result": [3, 0.0, None, b"\x00\xff", None]}


async def test_the_python_client_gets_invalid_arguments() -> None:
    async with serving([shop]) as served, served.client() as client:
        with pytest.raises(InvalidArguments, match="'sku' must be str, got int 7"):
            await client.get_or_create("shop", "k").buy(7)


def server_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pagekv.server" and r.levelno >= logging.INFO]


async def test_a_failed_action_is_one_record_and_a_refusal_has_no_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="pagekv.server")
    async with serving([shop]) as served, served.http() as http:
        assert (await call(http, "touch")).status_code == 200
        caplog.clear()
        crashed = await call(http, "crash", args=["pw"])
        crash_lines = server_records(caplog)
        caplog.clear()
        refused = await call(http, "check", args=[SECRET])
        refused_lines = server_records(caplog)
        caplog.clear()
        invalid = await call(http, "buy", args=[SECRET, SECRET])
        invalid_lines = server_records(caplog)
        caplog.clear()
        assert (await call(http, "touch")).status_code == 200
        assert server_records(caplog) == [], "a call that succeeds is not logged"
    assert (crashed.status_code, refused.status_code, invalid.status_code) == (500, 400, 400)
    ids = [r.request_id for r in crash_lines + refused_lines + invalid_lines]  # type: ignore[attr-defined]
    assert len(set(ids)) == 3 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids), ids
    assert [(r.levelno, r.getMessage()) for r in crash_lines] == [
        (
            logging.ERROR,
            "action 'crash' of actor 'shop' key 'k' failed: ValueError: bad password pw "
            f"(500 action_error, written=false, request_id={ids[0]})",
        )
    ]
    assert [(r.levelno, r.getMessage()) for r in refused_lines] == [
        (
            logging.INFO,
            "action 'check' of actor 'shop' key 'k' failed: UserError "
            f"(400 user_error, written=false, request_id={ids[1]})",
        )
    ]
    assert [(r.levelno, r.getMessage()) for r in invalid_lines] == [
        (
            logging.INFO,
            "action 'buy' of actor 'shop' key 'k' failed: InvalidArguments "
            f"(400 invalid_arguments, written=false, request_id={ids[2]})",
        )
    ]
    (record,) = crash_lines
    assert (record.actor, record.actor_key, record.action) == ("shop", "k", "crash")  # type: ignore[attr-defined]
    assert (record.error_type, record.error_code, record.status) == (  # type: ignore[attr-defined]
        "ValueError",
        "action_error",
        500,
    )
    assert record.exc_info is not None and record.exc_info[1] is crashed_error(record)
    assert all(r.exc_info is None for r in refused_lines + invalid_lines)
    for r in caplog.records:  # every record of the run, of every logger
        assert SECRET not in r.getMessage() and SECRET not in str(r.__dict__)
    assert SECRET not in caplog.text


def crashed_error(record: logging.LogRecord) -> BaseException:
    """The exception a crash record carries: the action's own, raised from its line."""
    assert record.exc_info is not None
    error = record.exc_info[1]
    assert isinstance(error, ValueError) and error.__traceback__ is not None
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    assert frame.tb_frame.f_code.co_name == "crash"
    return error


async def test_a_runtime_failure_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    async with serving([shop], kv=store) as served, served.http() as http:
        assert (await call(http, "touch")).status_code == 200
        caplog.clear()
        store.faulty["shop/k"].arm(FaultKind.FAIL_BEFORE)
        failed = await call(http, "touch")
        lines = server_records(caplog)
    assert failed.status_code == 503 and error_of(failed)["code"] == "storage_unavailable"
    assert len(lines) == 1, [r.getMessage() for r in lines]
    (record,) = lines
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith("action 'touch' of actor 'shop' key 'k' failed: ")
    assert "(503 storage_unavailable, written=false, request_id=" in record.getMessage()
    assert record.exc_info is None, "a failure of the runtime, not of the action's code"


async def test_names_from_the_request_cannot_break_the_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pagekv.server")
    async with serving([shop]) as served, served.http() as http:
        caplog.clear()
        response = await http.post(
            "/actors/shop/actions/no%0Asuch", params={"key": "a\nb" + "x" * 500}, json={}
        )
        lines = server_records(caplog)
    assert response.status_code == 404
    (record,) = lines
    message = record.getMessage()
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith("action 'no\\nsuch' of actor 'shop' key 'a\\nbxxx")
    assert "failed: ActionNotFound (404 unknown_action, written=false, request_id=" in message


async def test_a_request_id_is_the_clients_when_it_is_a_short_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A proxy's `X-Request-Id` names the request in the log; anything else (spaces, quotes,
    over 64 characters) could forge or bloat a line, so a fresh id replaces it."""
    caplog.set_level(logging.INFO, logger="pagekv.server")
    sent = ["proxy-7f3a:42", "a b", 'x"y', "z" * 65]
    async with serving([shop]) as served, served.http() as http:
        for request_id in sent:
            response = await http.post(
                "/actors/shop/actions/check",
                params={"key": "k"},
                json={"args": ["c"]},
                headers={"x-request-id": request_id},
            )
            assert response.status_code == 400 and "x-request-id" not in response.headers
    ids = [r.request_id for r in server_records(caplog)]  # type: ignore[attr-defined]
    assert ids[0] == "proxy-7f3a:42" and len(ids) == 4, ids
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids[1:]), ids
