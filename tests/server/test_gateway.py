"""The gateway over real HTTP: actions, get-or-create, create/destroy, queues, sleep and wake,
schedules, and every kind of bad input answered with a status and a machine-readable code."""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any

import anyio
import cbor2
import httpx
import pytest
from server_defs import gauge
from server_helpers import Served, serving

from pagekv.actor import (
    ActionNotFound,
    ActorContext,
    ActorExists,
    ActorNotFound,
    InvalidArguments,
    UnknownActor,
    actor,
)
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.queue import MAX_MESSAGE_BYTES, MAX_QUEUE_NAME_BYTES
from pagekv.client import RemoteError
from pagekv.kv import FaultKind, FaultyStore, KvLimits, MemoryStore

pytestmark = pytest.mark.anyio

ADD = "/actors/ledger/actions/add"


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


async def actor_ids(served: Served) -> list[str]:
    async with served.http() as http:
        response = await http.get("/inspect/actors")
    return [a["actor_id"] for a in response.json()["actors"]]


async def test_actions_through_the_python_client(served: Served) -> None:
    async with served.client() as client:
        handle = client.get_or_create("ledger", "k", input={"owner": "ada"})
        assert (await handle.add(5))["rows"] == [5]
        assert await handle.add(n=7) == {"count": 2, "total": 12, "rows": [5, 7]}
        assert await handle.bump() == 3
        assert (await handle.echo())["input"] == {"owner": "ada"}
        assert await handle.blob(b"\x00\x01\xff") == b"\xff\x01\x00"  # CBOR: bytes round-trip
        assert await client.get("ledger", "k").read() == {
            "count": 3,
            "total": 12,
            "rows": [5, 7],
        }


async def test_raw_json_call_and_falsy_values(served: Served) -> None:
    """Key "0", an empty body, empty args and an input of 0 are all values, not absences."""
    async with served.http() as http:
        empty = await http.post("/actors/ledger/actions/echo", params={"key": "0"})
        assert empty.status_code == 200, empty.text
        assert empty.json() == {"result": {"args": [], "kwargs": {}, "input": None}}
        again = await http.post(
            "/actors/ledger/actions/echo", params={"key": "zero"}, json={"args": [], "input": 0}
        )
        assert again.json()["result"] == {"args": [], "kwargs": {}, "input": 0}
        assert (await http.post(ADD, params={"key": "0"}, json={"args": [0]})).json() == {
            "result": {"count": 1, "total": 0, "rows": [0]}
        }
    assert sorted(await actor_ids(served)) == ["ledger/0", "ledger/zero"]


async def test_routing_parameters_never_reach_the_actor(served: Served) -> None:
    async with served.http() as http:
        response = await http.post(
            "/actors/ledger/actions/echo",
            params={"key": "k", "mode": "get_or_create"},
            json={"args": [1, "two"], "kwargs": {"three": 3}},
        )
    assert response.json()["result"] == {
        "args": [1, "two"],
        "kwargs": {"three": 3},
        "input": None,
    }


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("key=k&token=x", "['token']"),
        ("key=k&Key=j", "['Key']"),
        ("key=k&key=j", "['key']"),
        ("key=k&mode=get&mode=get", "['mode']"),
        ("mode=get", "['key']"),
        ("", "['key']"),
    ],
)
async def test_bad_routing_parameters_are_named_in_a_400(
    served: Served, query: str, names: str
) -> None:
    async with served.http() as http:
        response = await http.post(f"{ADD}?{query}", json={"args": [1]})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_parameter"
    assert names in error["message"]
    assert await actor_ids(served) == []


async def test_a_bad_mode_is_refused(served: Served) -> None:
    async with served.http() as http:
        response = await http.post(ADD, params={"key": "k", "mode": "create"}, json={"args": [1]})
        with_input = await http.post(
            ADD, params={"key": "k", "mode": "get"}, json={"args": [1], "input": 1}
        )
    assert response.status_code == 400 and "mode" in error_of(response)["message"]
    assert with_input.status_code == 400 and error_of(with_input)["code"] == "invalid_body"


async def test_get_create_destroy_and_handles_that_re_resolve(served: Served) -> None:
    async with served.client() as client:
        with pytest.raises(ActorNotFound):
            await client.get("ledger", "k").read()
        assert await actor_ids(served) == []  # a get never creates

        getter = await client.create("ledger", "k", input="first")
        with pytest.raises(ActorExists):
            await client.create("ledger", "k")
        assert (await getter.add(1))["count"] == 1
        upsert = client.get_or_create("ledger", "k", input="second")
        assert (await upsert.add(2))["rows"] == [1, 2]

        await client.destroy("ledger", "k")
        with pytest.raises(ActorNotFound):
            await getter.read()  # never pinned to the destroyed actor
        with pytest.raises(ActorNotFound):
            await client.destroy("ledger", "k")
        fresh = await upsert.echo()  # re-created from scratch, with this handle's input
        assert fresh["input"] == "second"
        assert await upsert.read() == {"count": 0, "total": 0, "rows": []}


async def test_unknown_actor_type_and_action_are_404_and_create_nothing(served: Served) -> None:
    async with served.client() as client:
        with pytest.raises(UnknownActor, match="no actor named 'nobody'"):
            await client.get_or_create("nobody", "k").hello()
        with pytest.raises(ActionNotFound, match="no action 'missing'"):
            await client.get_or_create("ledger", "k").missing()
        for odd in ("what?", "a#b", "100%", "x y"):  # sent escaped, so the server sees the name
            with pytest.raises(ActionNotFound, match=re.escape(f"no action {odd!r}")):
                await client.get_or_create("ledger", "k").call(odd)
    async with served.http() as http:
        response = await http.post("/actors/nobody/actions/x", params={"key": "k"})
        assert response.status_code == 404 and error_of(response)["code"] == "unknown_actor"
        response = await http.post("/actors/ledger/actions/missing", params={"key": "k"})
        assert response.status_code == 404 and error_of(response)["code"] == "unknown_action"
        response = await http.get("/no/such/route")
        assert response.status_code == 404 and error_of(response)["code"] == "not_found"
        response = await http.get(ADD, params={"key": "k"})
        assert response.status_code == 405
        assert error_of(response)["code"] == "method_not_allowed"
    assert await actor_ids(served) == []


async def test_action_errors_are_structured_without_tracebacks(served: Served) -> None:
    async with served.http() as http:
        first = await http.post(
            "/actors/ledger/actions/fail", params={"key": "k"}, json={"args": ["boom 42"]}
        )
        again = await http.post(
            "/actors/ledger/actions/fail", params={"key": "k"}, json={"args": ["boom 42"]}
        )
    for response, written in ((first, True), (again, False)):  # the first one created it
        assert response.status_code == 500
        assert error_of(response) == {
            "code": "action_error",
            "message": "ValueError: boom 42",
            "written": written,
        }
        assert "Traceback" not in response.text and ".py" not in response.text


async def test_an_error_answer_says_exactly_whether_the_call_wrote() -> None:
    """A CBOR NaN reached an action that committed it, then the answer was a 500 (and so was
    every later JSON call of that actor): a client retrying the 500 applied the write twice.
    Now JSON carries the NaN tagged, a result no media type can hold is a 422 that says the
    write stands, and an action that fails after a commit says it wrote."""
    async with serving(actors=[gauge]) as served, served.http() as http:
        cbor = {"content-type": "application/cbor"}
        nan = await http.post(
            "/actors/gauge/actions/assign",
            params={"key": "k"},
            headers=cbor,
            content=cbor2.dumps({"args": [math.nan]}),
        )
        read = await http.post("/actors/gauge/actions/value", params={"key": "k"}, json={})
        odd = await http.post("/actors/gauge/actions/odd", params={"key": "k"}, json={})
        half = await http.post("/actors/gauge/actions/half", params={"key": "k"}, json={})
        rows = await http.post("/actors/gauge/actions/log", params={"key": "k"}, json={})
    assert nan.status_code == 200 and nan.json() == {"result": {"$float": "NaN"}}
    assert read.status_code == 200 and read.json() == {"result": {"$float": "NaN"}}
    assert odd.status_code == 422, odd.text
    assert error_of(odd)["code"] == "unencodable_result" and error_of(odd)["written"] is True
    assert "writes are committed" in error_of(odd)["message"]
    assert half.status_code == 500 and error_of(half)["written"] is True
    assert rows.json() == {"result": ["nan", "odd", "half"]}, "each write exactly once"


async def test_a_failed_call_that_changed_state_or_kv_says_it_wrote() -> None:
    """A state change left in memory by a failed action was committed later, by whichever call
    saved next, while the failed one answered `written: false`; `ctx.kv` writes were not
    counted at all. A retry then applied the change twice."""
    async with serving(actors=[gauge]) as served, served.http() as http:
        await http.post("/actors/gauge/actions/value", params={"key": "k"}, json={})
        answers = [
            await http.post(f"/actors/gauge/actions/{action}", params={"key": "k"}, json={})
            for action in ("bump_then_fail", "stash_then_fail")
        ]
        value = await http.post("/actors/gauge/actions/value", params={"key": "k"}, json={})
        odd = await http.post(
            "/actors/gauge/actions/odd_failure",
            params={"key": "k"},
            json={},
            headers={"accept": "application/cbor"},
        )
    for answer in answers:
        assert answer.status_code == 500 and error_of(answer)["written"] is True, answer.text
    assert value.json() == {"result": 1.0}
    assert odd.status_code == 500, odd.text  # its message, escaped; not an internal error
    error = cbor2.loads(odd.content)["error"]
    assert error["code"] == "action_error" and "\\ud800" in error["message"]


async def test_arguments_that_do_not_bind_are_a_400_and_create_no_actor(
    served: Served, stored_actors
) -> None:
    async with served.http() as http:
        too_many = await http.post(ADD, params={"key": "k"}, json={"args": [1, 2, 3]})
        unknown = await http.post(ADD, params={"key": "k"}, json={"kwargs": {"n": 1, "m": 1}})
    async with served.client() as client:
        with pytest.raises(InvalidArguments, match="missing a required argument: 'n'"):
            await client.get_or_create("ledger", "k").add()
    for response, what in (
        (too_many, "too many positional arguments"),
        (unknown, "got an unexpected keyword argument 'm'"),
    ):
        assert response.status_code == 400, response.text
        assert error_of(response) == {
            "code": "invalid_arguments",
            "message": f"action 'add' of actor 'ledger' takes (n): {what}",
            "written": False,
        }
    assert stored_actors(served.store) == ([], [])


async def test_a_store_failure_is_a_retryable_503_and_the_retry_succeeds() -> None:
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    async with serving(kv=store) as served, served.http() as http:
        assert (await http.post(ADD, params={"key": "k"}, json={"args": [1]})).status_code == 200
        store.faulty["ledger/k"].arm(FaultKind.FAIL_BEFORE)
        failed = await http.post(ADD, params={"key": "k"}, json={"args": [2]})
        retried = await http.post(ADD, params={"key": "k"}, json={"args": [2]})
        assert store.faulty["ledger/k"].fired_count() == 1
    assert failed.status_code == 503
    assert error_of(failed)["code"] == "storage_unavailable"
    assert "injected fault" in error_of(failed)["message"]
    assert retried.status_code == 200 and retried.json()["result"]["rows"] == [1, 2]


BAD_BODIES = [
    (b'{"args": [1', "application/json", "malformed_body", 400),
    (b'{"args": [NaN]}', "application/json", "malformed_body", 400),
    (b'{"args": [1e999]}', "application/json", "malformed_body", 400),
    (b'{"args": [-1.5e400]}', "application/json", "malformed_body", 400),
    (b"\xff\xfe", "application/json", "malformed_body", 400),
    (b"\x9f\x01", "application/cbor", "malformed_body", 400),
    (b"\xff", "application/cbor", "malformed_body", 400),
    (b"[1, 2]", "application/json", "invalid_body", 400),
    (b'{"args": 1}', "application/json", "invalid_body", 400),
    (b'{"kwargs": {"1x": 1}}', "application/json", "invalid_body", 400),
    (b'{"args": [1], "extra": true}', "application/json", "invalid_body", 400),
    (b"args=1", "application/x-www-form-urlencoded", "unsupported_media_type", 415),
]


async def test_bad_bodies(served: Served) -> None:
    async with served.http() as http:
        for content, content_type, code, status in BAD_BODIES:
            response = await http.post(
                ADD, params={"key": "k"}, content=content, headers={"content-type": content_type}
            )
            assert response.status_code == status, (content, response.text)
            assert error_of(response)["code"] == code, content
    assert await actor_ids(served) == []


async def test_cbor_requests_and_answers(served: Served) -> None:
    """CBOR in, CBOR out when asked; bytes answered as JSON are tagged base64."""
    request = {
        "params": {"key": "k"},
        "content": cbor2.dumps({"args": [b"\x01\x02"]}),
        "headers": {"content-type": "application/cbor", "accept": "application/cbor"},
    }
    async with served.http() as http:
        as_cbor = await http.post("/actors/ledger/actions/blob", **request)
        request["headers"] = {"content-type": "application/cbor"}
        as_json = await http.post("/actors/ledger/actions/blob", **request)
    assert as_cbor.headers["content-type"] == "application/cbor"
    assert cbor2.loads(as_cbor.content) == {"result": b"\x02\x01"}
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json() == {"result": {"$bytes": "AgE="}}


async def test_a_self_described_cbor_body_is_the_value_it_wraps(served: Served) -> None:
    """Tag 55799 only marks a body as CBOR: the call takes the map inside (cbor2 would make
    it an immutable map, which the body check refused as not an object)."""
    headers = {"content-type": "application/cbor"}
    tagged = cbor2.dumps(cbor2.CBORTag(55799, {"args": [4]}))
    assert tagged.startswith(b"\xd9\xd9\xf7")
    async with served.http() as http:
        answer = await http.post(ADD, params={"key": "t"}, content=tagged, headers=headers)
        trailing = await http.post(
            ADD, params={"key": "t"}, content=tagged + b"\x00", headers=headers
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["rows"] == [4]
    assert trailing.status_code == 400 and "1 bytes after the value" in trailing.text


async def test_bodies_over_the_limit_are_413_naming_it() -> None:
    async with serving(max_body_bytes=1000) as served, served.http() as http:
        big = json.dumps({"args": ["x" * 2000]}).encode()
        declared = await http.post(
            ADD, params={"key": "k"}, content=big, headers={"content-type": "application/json"}
        )

        async def chunks():
            for _ in range(20):
                yield b" " * 100  # no Content-Length: streamed, counted as it arrives

        streamed = await http.post(
            ADD, params={"key": "k"}, content=chunks(), headers={"content-type": "application/json"}
        )
        fits = await http.post(ADD, params={"key": "k"}, json={"args": [1]})
    for response in (declared, streamed):
        assert response.status_code == 413
        assert error_of(response)["code"] == "body_too_large"
        assert error_of(response)["limit"] == "max_body_bytes"
        assert "1000" in error_of(response)["message"]
    assert fits.json()["result"]["rows"] == [1]


async def test_a_commit_over_the_storage_quota_is_413_and_the_actor_stays_healthy() -> None:
    """The refused commit wrote nothing, and the same actor instance goes on serving. It used to
    fail every later statement with the quota error: SQLite rewrote the rolled-back pages from its
    journal, and that rewrite, a delta as big as the refused commit, was refused too."""
    store = MemoryStore(limits=KvLimits(max_storage_bytes=1_000_000))
    async with serving(kv=store) as served, served.client() as client:
        handle = client.get_or_create("ledger", "k")
        assert await handle.fill(150, 3000) == 150  # too many pages to commit in place: a delta
        used = store.namespace("ledger/k").used_bytes()
        with pytest.raises(RemoteError) as refused:
            await handle.rewrite(3000)
        assert store.namespace("ledger/k").used_bytes() == used
        assert await handle.fill(5, 3000) == 155
        assert (await handle.add(4))["rows"] == [4]
    assert (refused.value.status, refused.value.code) == (413, "kv_limit")
    assert refused.value.limit == "max_storage_bytes"
    assert "max_storage_bytes = 1000000" in refused.value.message


async def test_a_refused_create_changes_nothing(served: Served) -> None:
    """A create of an actor that is awake answered 409 after putting it to sleep and waking
    it again (its run handler restarted each time)."""

    def counter(metrics: str, name: str) -> float:
        match = re.search(rf"^pagekv_{name}_total (\S+)$", metrics, re.MULTILINE)
        assert match is not None, metrics
        return float(match.group(1))

    async with served.http() as http:
        assert (await http.post(ADD, params={"key": "k"}, json={"args": [1]})).status_code == 200
        before = (await http.get("/metrics")).text
        for _ in range(10):
            refused = await http.post("/actors/ledger", params={"key": "k"}, json={})
            assert refused.status_code == 409 and error_of(refused)["code"] == "actor_exists"
        after = (await http.get("/metrics")).text
        rows = (await http.post(ADD, params={"key": "k"}, json={"args": [2]})).json()
    for name in ("wakes", "sleeps", "crashes"):
        assert counter(after, name) == counter(before, name), name
    assert rows["result"]["rows"] == [1, 2]


async def test_kv_and_queue_limits_are_4xx_naming_the_limit(served: Served) -> None:
    async with served.client() as client:
        handle = client.get_or_create("ledger", "k")
        with pytest.raises(RemoteError) as kv_limit:
            await handle.stash(200 * 1024)
        with pytest.raises(RemoteError) as message_limit:
            await handle.send("inbox", "x" * (70 * 1024))
        await handle.stash(10)  # within the limit: fine
    assert (kv_limit.value.status, kv_limit.value.code) == (413, "kv_limit")
    assert kv_limit.value.limit == "max_value_bytes"
    assert "max_value_bytes" in kv_limit.value.message
    assert (message_limit.value.status, message_limit.value.code) == (413, "message_too_large")
    assert message_limit.value.limit == "MAX_MESSAGE_BYTES"
    async with served.http() as http:
        long_key = await http.post("/actors/ledger/actions/bump", params={"key": "k" * 3000})
    assert long_key.status_code == 413
    assert error_of(long_key)["limit"] == "max_key_bytes"
    assert "max_key_bytes = 2048" in error_of(long_key)["message"]
    assert await actor_ids(served) == ["ledger/k"]


async def test_a_refused_message_is_a_4xx_and_creates_no_actor(
    served: Served, stored_actors
) -> None:
    """The queue name and the body's size are checked before the actor is woken or created."""
    long_name = "q" * (MAX_QUEUE_NAME_BYTES + 1)
    async with served.http() as http:
        empty = await http.post("/actors/ledger/queues/", params={"key": "k"}, json={"body": 1})
        too_long = await http.post(
            f"/actors/ledger/queues/{long_name}", params={"key": "k"}, json={"body": 1}
        )
        too_large = await http.post(
            "/actors/ledger/queues/inbox",
            params={"key": "k"},
            json={"body": "x" * MAX_MESSAGE_BYTES},
        )
    async with served.client() as client:
        with pytest.raises(RemoteError) as from_client:
            await client.get_or_create("ledger", "k").send("", 1)
    for response, status, code, limit, message in (
        (empty, 400, "invalid_queue_name", "MAX_QUEUE_NAME_BYTES", "got 0 bytes"),
        (too_long, 400, "invalid_queue_name", "MAX_QUEUE_NAME_BYTES", "got 257 bytes"),
        (too_large, 413, "message_too_large", "MAX_MESSAGE_BYTES", str(MAX_MESSAGE_BYTES)),
    ):
        assert response.status_code == status, response.text
        error = error_of(response)
        assert (error["code"], error["limit"]) == (code, limit) and message in error["message"]
    assert (from_client.value.status, from_client.value.code) == (400, "invalid_queue_name")
    assert stored_actors(served.store) == ([], [])


async def test_queue_messages(served: Served) -> None:
    async with served.client() as client:
        handle = client.get_or_create("ledger", "k")
        first = await handle.send("inbox", {"hello": 1})
        second = await handle.send("other/queue", [b"\x00"])
        with pytest.raises(ActorNotFound):
            await client.get("ledger", "missing").send("inbox", 1)
    assert second > first
    async with served.http() as http:
        queue = (await http.get("/inspect/actors/ledger/queue", params={"key": "k"})).json()
    assert [(row[1], row[2]) for row in queue["rows"]] == [
        ("inbox", {"hello": 1}),
        ("other/queue", [{"$bytes": "AA=="}]),
    ]


async def test_sleep_and_wake_through_http(served: Served, eventually) -> None:
    async with served.client() as client, served.http() as http:
        handle = client.get_or_create("napper", "k")
        assert await handle.bump() == 1

        async def asleep() -> bool:
            summary = await http.get("/inspect/actors/napper", params={"key": "k"})
            return not summary.json()["live"]

        await eventually(asleep, what="the actor to fall asleep")
        assert await handle.bump() == 2  # woken, with its state
        metrics = (await http.get("/metrics")).text
    assert "pagekv_wakes_total 2.0\n" in metrics
    assert re.search(r"^pagekv_sleeps_total [12]\.0$", metrics, re.MULTILINE)


async def test_schedules_fire_while_serving(served: Served, eventually) -> None:
    """The actor sleeps before its schedule is due; the schedule wakes it and runs."""
    async with served.client() as client, served.http() as http:
        handle = client.get_or_create("napper", "k")
        await handle.later(1.0)

        async def fired() -> bool:
            state = await http.get("/inspect/actors/napper/state", params={"key": "k"})
            return state.json()["state"]["count"] == 1

        metrics = (await http.get("/metrics")).text
        await eventually(fired, what="the scheduled bump")
    assert "pagekv_actions_total 1" in metrics  # `later` only, before it fired


async def test_concurrent_first_requests_create_one_actor_and_lose_nothing() -> None:
    """Requests sent before the server is even up, all at once, to one new actor."""
    async with serving() as served, served.client() as client:
        handle = client.get_or_create("ledger", "fresh", input="once")
        results = []

        async def add(n: int) -> None:
            results.append(await handle.add(n))

        async with anyio.create_task_group() as tg:
            for n in range(1, 31):
                tg.start_soon(add, n)
        final = await handle.read()
        listed = await actor_ids(served)
    assert final["count"] == 30 and sorted(final["rows"]) == list(range(1, 31))
    assert sorted(r["count"] for r in results) == list(range(1, 31))
    assert listed == ["ledger/fresh"]


AWARE = datetime.datetime(
    2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
)
NAIVE = datetime.datetime(2026, 1, 2, 3, 4, 5)
DAY = datetime.date(2026, 1, 2)
AT = datetime.time(23, 59, 1)


def times_actor() -> Any:
    times = actor("times")

    @times.action
    async def when(ctx: ActorContext) -> dict[str, Any]:
        return {"aware": AWARE, "naive": NAIVE, "day": DAY, "at": AT, "days": [DAY, (NAIVE,)]}

    @times.action
    async def naive_in_a_set(ctx: ActorContext) -> set[datetime.datetime]:
        return {NAIVE}

    @times.action
    async def tags(ctx: ActorContext) -> set[str]:
        return {"a"}

    @times.action
    async def opaque(ctx: ActorContext) -> object:
        return object()

    return times


async def test_dates_and_times_are_answered_in_json_and_cbor() -> None:
    """A datetime result answered as JSON said "ask for application/cbor", and CBOR then failed
    too (a naive datetime): dates and times are ISO 8601 text in JSON, tagged in CBOR where a
    tag holds them, and the hint to ask for CBOR is given only when CBOR holds the result."""
    cbor = {"accept": "application/cbor"}
    async with serving(actors=[times_actor()]) as served, served.http() as http:

        async def call(action: str, headers: dict[str, str] | None = None) -> httpx.Response:
            path = f"/actors/times/actions/{action}"
            return await http.post(path, params={"key": "k"}, json={}, headers=headers)

        as_json, as_cbor = await call("when"), await call("when", cbor)
        set_json, set_cbor = await call("naive_in_a_set"), await call("naive_in_a_set", cbor)
        tags_json, tags_cbor = await call("tags"), await call("tags", cbor)
        opaque_json, opaque_cbor = await call("opaque"), await call("opaque", cbor)
        async with served.client() as client:
            through_client = await client.get("times", "k").when()
    assert as_json.status_code == 200, as_json.text
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json() == {
        "result": {
            "aware": "2026-01-02T03:04:05.000006+01:00",
            "naive": "2026-01-02T03:04:05",
            "day": "2026-01-02",
            "at": "23:59:01",
            "days": ["2026-01-02", ["2026-01-02T03:04:05"]],
        }
    }
    assert as_cbor.status_code == 200, as_cbor.content
    assert as_cbor.headers["content-type"] == "application/cbor"
    decoded = cbor2.loads(as_cbor.content)["result"]
    assert decoded == {
        "aware": AWARE,
        "naive": "2026-01-02T03:04:05",
        "day": DAY,
        "at": "23:59:01",
        "days": [DAY, ["2026-01-02T03:04:05"]],
    }
    assert decoded["aware"].utcoffset() == datetime.timedelta(hours=1)
    assert type(decoded["day"]) is datetime.date
    assert through_client == decoded
    assert set_cbor.status_code == 200 and cbor2.loads(set_cbor.content) == {
        "result": {"2026-01-02T03:04:05"}
    }
    assert set_json.status_code == 422
    assert "a set cannot be sent as JSON; ask for application/cbor" in error_of(set_json)["message"]
    assert tags_json.status_code == 422 and "ask for application/cbor" in tags_json.text
    assert tags_cbor.status_code == 200 and cbor2.loads(tags_cbor.content) == {"result": {"a"}}
    assert opaque_json.status_code == 422 and opaque_cbor.status_code == 422
    assert "a object cannot be sent as JSON or CBOR" in error_of(opaque_json)["message"]
    assert "application/cbor" not in error_of(opaque_json)["message"]
