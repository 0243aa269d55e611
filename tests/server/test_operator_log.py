"""What an operator reads in a real `pagekv serve` process's log when an action fails (#43 item
10): a 5xx of the action's own code, over HTTP or a WebSocket, is one ERROR record with its
message, its traceback (down to the app's line that raised) and the request's id; a `UserError`
is one INFO line without either; `--log-format json` makes every line a JSON object with those
fields; the client's answer is what it was, and the token never reaches the log."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from pagekv.client import HttpClient, RemoteError

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token-never-logged"
APP = textwrap.dedent(
    """
    from pagekv.actor import ActorContext, Registry, UserError, actor

    a = actor("a", state={})


    def explode(n: int) -> None:
        raise RuntimeError(f"kaboom {n}")  # THE FAILING LINE


    @a.action
    async def boom(ctx: ActorContext, n: int) -> None:
        explode(n)


    @a.action
    async def refuse(ctx: ActorContext) -> None:
        raise UserError("no such coupon", code="bad_coupon", status=409)


    registry = Registry([a])
    """
)
RUNNING = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
"""The start of a text record: the lines up to the next one are its traceback."""
RAISE = 'raise RuntimeError(f"kaboom {n}")  # THE FAILING LINE'


def failing_line() -> int:
    return 1 + next(i for i, s in enumerate(APP.splitlines()) if "THE FAILING LINE" in s)


def traceback_after(lines: list[str], start: int) -> str:
    end = next((i for i in range(start + 1, len(lines)) if STAMPED.match(lines[i])), len(lines))
    return "".join(lines[start + 1 : end])


@asynccontextmanager
async def serving(tmp_path: Path, *args: str) -> AsyncIterator[tuple[httpx.AsyncClient, list[str]]]:
    """A `pagekv serve` process of `APP` and a client of it; the list holds its stderr lines,
    complete once the block ends (the process is stopped with SIGTERM)."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    env = {**os.environ, "PAGEKV_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pagekv",
            "serve",
            str(app),
            "--port",
            "0",
            "--kv",
            "memory://",
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        with anyio.fail_after(30):
            while not any(RUNNING.search(line) for line in lines):
                line = await anyio.to_thread.run_sync(proc.stderr.readline)
                assert line, "".join(lines)
                lines.append(line)
        url = next(m.group(1) for line in lines if (m := RUNNING.search(line)))
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers) as http:
            yield http, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            _, rest = await anyio.to_thread.run_sync(proc.communicate)
        lines.extend(rest.splitlines(keepends=True))


async def fail_both(http: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
    boom = await http.post(
        "/actors/a/actions/boom",
        params={"key": "x"},
        json={"args": [7]},
        headers={"x-request-id": "req-boom-1"},
    )
    refused = await http.post(
        "/actors/a/actions/refuse",
        params={"key": "x"},
        json={},
        headers={"x-request-id": "req-refuse-2"},
    )
    return boom, refused


def assert_answers_unchanged(boom: httpx.Response, refused: httpx.Response) -> None:
    """What the client got before the log said more: the type and message, no traceback, no
    request id."""
    assert boom.status_code == 500
    assert boom.json() == {
        "error": {"code": "action_error", "message": "RuntimeError: kaboom 7", "written": True}
    }
    assert refused.status_code == 409
    assert refused.json() == {
        "error": {"code": "bad_coupon", "message": "no such coupon", "written": False}
    }
    for response in (boom, refused):
        assert "req-" not in str(response.headers) and "Traceback" not in response.text


async def test_a_crashing_action_logs_its_traceback_and_a_user_error_one_info_line(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (http, lines):
        boom, refused = await fail_both(http)
        async with (
            HttpClient(str(http.base_url), token=TOKEN) as client,
            client.get_or_create("a", "x").connect({}) as conn,
        ):
            with pytest.raises(RemoteError) as on_socket:
                await conn.boom(8)
    assert_answers_unchanged(boom, refused)
    assert (on_socket.value.code, on_socket.value.message) == (
        "action_error",
        "RuntimeError: kaboom 8",
    )
    log = "".join(lines)
    assert TOKEN not in log

    head = "ERROR pagekv.server: action 'boom' of actor 'a' key 'x' failed: "
    start = next(i for i, line in enumerate(lines) if head in line)
    expected = "RuntimeError: kaboom 7 (500 action_error, written=true, request_id=req-boom-1)\n"
    assert lines[start].endswith(f"failed: {expected}"), lines[start]
    failing = f'File "{tmp_path / "app.py"}", line {failing_line()}, in explode\n'
    traceback = traceback_after(lines, start)
    assert traceback.startswith("Traceback (most recent call last):\n"), traceback
    assert failing in traceback and RAISE in traceback, traceback
    assert traceback.endswith("RuntimeError: kaboom 7\n"), traceback

    (socket_start,) = [i for i, line in enumerate(lines) if "kaboom 8 (500 action_error" in line]
    assert head in lines[socket_start], "a socket's action is logged as an HTTP call's"
    assert re.search(r"written=unknown, request_id=[0-9a-f]{16}\)$", lines[socket_start])
    traceback = traceback_after(lines, socket_start)
    assert failing in traceback and traceback.endswith("RuntimeError: kaboom 8\n"), traceback

    (info,) = [i for i, line in enumerate(lines) if "action 'refuse' of actor 'a'" in line]
    assert (
        " INFO pagekv.server: action 'refuse' of actor 'a' key 'x' failed: UserError "
        in (lines[info])
    ), lines[info]
    assert (
        lines[info]
        .rstrip("\n")
        .endswith("(409 bad_coupon, written=false, request_id=req-refuse-2)")
    )
    assert "no such coupon" not in lines[info], "a 4xx names its type and code, not its text"
    assert STAMPED.match(lines[info + 1]), "no traceback after a user error"


async def test_json_log_format_writes_one_object_per_record(tmp_path: Path) -> None:
    async with serving(tmp_path, "--log-format", "json", "--access-log") as (http, lines):
        boom, refused = await fail_both(http)
    assert_answers_unchanged(boom, refused)
    assert TOKEN not in "".join(lines)
    records: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    assert records[0]["message"].startswith("pagekv serve: 1 actor type(s) (a) on memory://")
    (crash,) = [r for r in records if r.get("action") == "boom"]
    assert crash["level"] == "ERROR" and crash["logger"] == "pagekv.server"
    assert {k: crash[k] for k in ("actor", "actor_key", "status", "error_code")} == {
        "actor": "a",
        "actor_key": "x",
        "status": 500,
        "error_code": "action_error",
    }
    assert (crash["error_type"], crash["error_message"]) == ("RuntimeError", "kaboom 7")
    assert crash["request_id"] == "req-boom-1"
    assert crash["traceback"].startswith("Traceback (most recent call last):\n")
    assert (
        RAISE in crash["traceback"] and f"line {failing_line()}, in explode" in crash["traceback"]
    )
    (user,) = [r for r in records if r.get("action") == "refuse"]
    assert (user["level"], user["status"], user["error_code"]) == ("INFO", 409, "bad_coupon")
    assert user["request_id"] == "req-refuse-2"
    assert "traceback" not in user and user["error_message"] is None
    calls = [r for r in records if r["logger"] == "uvicorn.access" and "/actors/" in r["message"]]
    assert [r["request_id"] for r in calls] == ["req-boom-1", "req-refuse-2"], calls
