"""The inspector API: actor list, state, tables and rows, read-only SQL that can never write,
queue, schedules, metrics; all from snapshots that never take a live actor over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from server_helpers import Served, serving

pytestmark = pytest.mark.anyio


async def populate(served: Served, key: str = "k", rows: int = 5) -> None:
    async with served.client() as client:
        handle = client.get_or_create("ledger", key)
        for n in range(1, rows + 1):
            await handle.add(n)


async def get(served: Served, path: str, **params: Any) -> Any:
    async with served.http() as http:
        response = await http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def sql(served: Served, statement: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    async with served.http() as http:
        response = await http.post(
            "/inspect/actors/ledger/query", params={"key": "k"}, json={"sql": statement, **extra}
        )
    return response.status_code, response.json()


async def test_actor_list_pages_and_filters(served: Served) -> None:
    async with served.client() as client:
        for key in ("a", "b", "c"):
            await client.get_or_create("ledger", key).bump()
        await client.get_or_create("napper", "z").bump()
    everything = await get(served, "/inspect/actors")
    assert [a["actor_id"] for a in everything["actors"]] == [
        "ledger/a",
        "ledger/b",
        "ledger/c",
        "napper/z",
    ]
    assert everything["next_after"] is None
    first = await get(served, "/inspect/actors", limit=2)
    assert [a["key"] for a in first["actors"]] == ["a", "b"]
    rest = await get(served, "/inspect/actors", limit=2, after=first["next_after"])
    assert [a["actor_id"] for a in rest["actors"]] == ["ledger/c", "napper/z"]
    nappers = await get(served, "/inspect/actors", name="napper")
    assert [(a["name"], a["key"]) for a in nappers["actors"]] == [("napper", "z")]
    assert everything["actors"][0]["live"] is True  # ledgers stay awake for 30 s


async def test_state_tables_and_paged_rows(served: Served) -> None:
    await populate(served, rows=5)
    assert await get(served, "/inspect/actors/ledger/state", key="k") == {
        "state": {"count": 5, "total": 15, "input": None}
    }
    tables = {
        t["name"]: t
        for t in (await get(served, "/inspect/actors/ledger/tables", key="k"))["tables"]
    }
    assert tables["entries"] == {
        "name": "entries",
        "internal": False,
        "columns": ["id", "n"],
        "rows": 5,
    }
    assert tables["_pagekv_state"]["internal"] is True
    page = await get(served, "/inspect/actors/ledger/tables/entries", key="k", limit=2, offset=1)
    assert page == {
        "table": "entries",
        "offset": 1,
        "columns": ["id", "n"],
        "rows": [[2, 2], [3, 3]],
        "truncated": True,
    }
    last = await get(served, "/inspect/actors/ledger/tables/entries", key="k", offset=4)
    assert (last["rows"], last["truncated"]) == ([[5, 5]], False)
    async with served.http() as http:
        missing = await http.get("/inspect/actors/ledger/tables/nope", params={"key": "k"})
        bad_limit = await http.get(
            "/inspect/actors/ledger/tables/entries", params={"key": "k", "limit": "0"}
        )
        no_actor = await http.get("/inspect/actors/ledger/state", params={"key": "other"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "table_not_found")
    assert (bad_limit.status_code, bad_limit.json()["error"]["code"]) == (400, "invalid_parameter")
    assert (no_actor.status_code, no_actor.json()["error"]["code"]) == (404, "actor_not_found")


async def test_read_only_queries(served: Served) -> None:
    await populate(served, rows=5)
    status, result = await sql(
        served, "SELECT n, n * 10 AS ten FROM entries WHERE n > ?", params=[3]
    )
    assert status == 200
    assert result == {"columns": ["n", "ten"], "rows": [[4, 40], [5, 50]], "truncated": False}
    status, result = await sql(served, "SELECT n FROM entries", max_rows=2)
    assert (result["rows"], result["truncated"]) == ([[1], [2]], True)
    status, result = await sql(served, "SELECT * FROM pragma_table_info('entries')")
    assert status == 200 and [r[1] for r in result["rows"]] == ["id", "n"]
    status, result = await sql(served, "SELECT nope FROM entries")
    assert (status, result["error"]["code"]) == (400, "invalid_query")
    for statement, params in [("SELECT ?", [[1]]), ("SELECT ?", [{"a": 1}]), ("SELECT :a", {})]:
        status, result = await sql(served, statement, params=params)
        assert (status, result["error"]["code"]) == (400, "invalid_query"), (statement, params)
        assert "invalid query parameters" in result["error"]["message"]


WRITES = [
    "DELETE FROM entries",
    "UPDATE entries SET n = 0",
    "INSERT INTO entries(n) VALUES (99)",
    "DROP TABLE entries",
    "CREATE TABLE t(x)",
    "CREATE TEMP TABLE t(x)",
    "ALTER TABLE entries ADD COLUMN y",
    "ATTACH DATABASE '/tmp/pagekv-inspector-attack.db' AS other",
    "PRAGMA user_version = 5",
    "PRAGMA writable_schema = 1",
    "BEGIN",
    "SELECT 1; DELETE FROM entries",
    "WITH x AS (SELECT 1) DELETE FROM entries",
    "REPLACE INTO _pagekv_state VALUES (1, x'00')",
    "VACUUM",
]


async def test_queries_that_write_are_refused_and_change_nothing(served: Served) -> None:
    await populate(served, rows=3)
    for statement in WRITES:
        status, result = await sql(served, statement)
        assert status in (400, 403), (statement, result)
        assert result["error"]["code"] in ("query_refused", "invalid_query"), statement
    async with served.client() as client:
        view = await client.get("ledger", "k").read()
    assert view == {"count": 3, "total": 6, "rows": [1, 2, 3]}
    assert (await get(served, "/inspect/actors/ledger/state", key="k"))["state"]["count"] == 3
    assert not Path("/tmp/pagekv-inspector-attack.db").exists()


async def test_a_runaway_query_is_stopped() -> None:
    async with serving(query_timeout_s=0.3) as served:
        await populate(served, rows=1)
        status, result = await sql(
            served,
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
            "SELECT count(*) FROM r",
        )
    assert status == 403
    assert "longer than 0.3 s" in result["error"]["message"]


async def test_queue_and_schedules(served: Served) -> None:
    async with served.client() as client:
        handle = client.get_or_create("ledger", "k")
        await handle.send("jobs", {"n": 1})
        await handle.later(3600)
    queue = await get(served, "/inspect/actors/ledger/queue", key="k")
    assert queue["columns"] == ["id", "name", "body", "created"]
    assert [(r[1], r[2]) for r in queue["rows"]] == [("jobs", {"n": 1})]
    schedules = await get(served, "/inspect/actors/ledger/schedules", key="k")
    (event,) = schedules["rows"]
    assert dict(zip(schedules["columns"], event, strict=True))["action"] == "bump"


async def test_inspecting_a_live_actor_never_takes_it_over(served: Served) -> None:
    await populate(served, rows=2)
    for path in ("", "/state", "/tables", "/tables/entries", "/queue", "/schedules", "/metrics"):
        await get(served, f"/inspect/actors/ledger{path}", key="k")
    await sql(served, "SELECT count(*) FROM entries")
    summary = await get(served, "/inspect/actors/ledger", key="k")
    assert summary["live"] is True and summary["instance"]["phase"] == "running"
    async with served.client() as client:
        assert (await client.get("ledger", "k").add(3))["rows"] == [1, 2, 3]
    metrics = await get_text(served, "/metrics")
    assert "pagekv_wakes_total 1" in metrics
    assert "pagekv_takeovers_total 0" in metrics
    live = await get(served, "/inspect/actors/ledger/metrics", key="k")
    assert live["live"] is True and live["storage"]["commits"] >= 3


async def get_text(served: Served, path: str) -> str:
    async with served.http() as http:
        response = await http.get(path)
    assert response.status_code == 200
    return response.text


async def test_prometheus_metrics(served: Served) -> None:
    await populate(served, rows=4)
    async with served.client() as client:
        await client.get_or_create("ledger", "k").read()
    text = await get_text(served, "/metrics")
    lines = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines())
        if not name.startswith("#")
    }
    assert lines["pagekv_actors_live"] == 1
    assert lines["pagekv_actions_total"] == 5
    assert lines['pagekv_action_duration_seconds_count{action="add",actor="ledger"}'] == 4
    assert (
        lines['pagekv_action_duration_seconds_bucket{action="add",actor="ledger",le="+Inf"}'] == 4
    )
    assert lines['pagekv_kv_round_trips_total{op="write"}'] >= 4
    assert lines["pagekv_commit_bytes_count"] >= 4
    assert float(lines["pagekv_commit_bytes_sum"]) > 0
    assert 0 <= float(lines["pagekv_vfs_cache_hit_ratio"]) <= 1
    assert "# TYPE pagekv_action_duration_seconds histogram" in text


async def test_workflow_history(served: Served, eventually) -> None:
    async with served.client() as client:
        handle = client.get_or_create("flow", "order-1")
        assert await handle.loads() in (0, 1)
        await client.get_or_create("ledger", "plain").bump()

        async def status() -> dict[str, Any]:
            async with served.http() as http:
                response = await http.get(
                    "/inspect/actors/flow/workflow", params={"key": "order-1"}
                )
            return response.json()["workflow"] if response.status_code == 200 else {}

        async def waiting() -> bool:
            entries = (await status()).get("entries", [])
            return [(e["name"], e["kind"], e["status"]) for e in entries] == [
                ("load", "step", "completed"),
                ("approval", "message", "pending"),
            ]

        await eventually(waiting, what="the workflow to wait for its approval")
        await handle.send("approve", "ada")

        async def completed() -> bool:
            return (await status()).get("state") == "completed"

        await eventually(completed, what="the workflow to complete")
    workflow = await status()
    assert workflow["output"] == {"loaded": 1, "by": "ada"}
    assert workflow["entries"][0]["data"] == {"output": {"loaded": 1}}
    async with served.http() as http:
        none = await http.get("/inspect/actors/ledger/workflow", params={"key": "plain"})
    assert (none.status_code, none.json()["error"]["code"]) == (404, "no_workflow")


_SERIES = "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {})"


async def test_answers_are_capped_in_bytes_naming_the_cap() -> None:
    """`SELECT zeroblob(300000000)` answered 200 with 400 MB and grew the server by 1.4 GB:
    no value may now be longer than the cap (SQLite refuses to make one), and rows stop
    being gathered as soon as their values pass it."""
    async with serving(inspect_max_bytes=100_000) as served:
        await populate(served)
        for statement in (
            "SELECT zeroblob(300000000)",
            f"{_SERIES.format(500)} SELECT randomblob(1000) FROM s",
            f"{_SERIES.format(500)} SELECT group_concat(hex(randomblob(1000))) FROM s",
        ):
            status, body = await sql(served, statement)
            assert status == 413, (statement, body)
            assert body["error"]["code"] == "answer_too_large"
            assert body["error"]["limit"] == "inspect_max_bytes"
            assert "100000 bytes" in body["error"]["message"]
        status, body = await sql(served, f"{_SERIES.format(50)} SELECT randomblob(1000) FROM s")
        assert status == 200 and len(body["rows"]) == 50


async def test_inspector_reads_never_hold_up_the_actors() -> None:
    """60 queries that run until their timeout, all at once: the inspector runs
    `inspect_concurrency` of them and answers the rest 503 when no turn comes in time, while
    calls to the awake actor go on being answered."""
    spin = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    async with serving(query_timeout_s=2.0, inspect_concurrency=2) as served:
        await populate(served)
        answers: list[tuple[int, str]] = []

        async def query() -> None:
            status, body = await sql(served, spin)
            answers.append((status, body["error"]["code"]))

        async with anyio.create_task_group() as tg:
            for _ in range(60):
                tg.start_soon(query)
            await anyio.sleep(0.3)  # they are all in
            async with served.client() as client:
                handle = client.get("ledger", "k")
                for n in range(10):
                    with anyio.fail_after(1.5):  # well before any query gives up
                        assert len((await handle.add(n))["rows"]) == 6 + n
            assert not answers, "the calls were answered while every query was in flight"
    assert sorted(set(answers)) == [(403, "query_refused"), (503, "inspector_busy")], answers
    assert answers.count((403, "query_refused")) >= 2


async def test_schedules_and_workflows_are_capped_too() -> None:
    from server_defs import gauge

    async with (
        serving(actors=[gauge], inspect_max_bytes=100_000) as served,
        served.http() as http,
    ):
        plan = await http.post(
            "/actors/gauge/actions/plan", params={"key": "k"}, json={"args": [200, 1000]}
        )
        assert plan.status_code == 200, plan.text
        listed = await http.get("/inspect/actors/gauge/schedules", params={"key": "k"})
    assert listed.status_code == 413, listed.text[:300]
    assert listed.json()["error"]["limit"] == "inspect_max_bytes"
