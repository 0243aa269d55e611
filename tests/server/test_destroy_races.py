"""Destroy racing get-or-create of one key, on one server and across two processes on one store.

After every round the registry's index and the actor's data must agree (a record exactly when
an initialised actor is stored), the data must be what some order of the two requests leaves
(a destroyed actor's rows never come back), and an actor that exists must be reachable.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import apsw
import httpx
import pytest
from server_defs import ledger
from server_helpers import Served, serving

from pagekv.actor import Registry
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.local_client import Client
from pagekv.actor.registry import actor_id
from pagekv.kv import ActorKv, KvStore, open_kv
from pagekv.kv.wrappers import KvWrapper
from pagekv.vfs import open_database

pytestmark = pytest.mark.anyio
T = TypeVar("T")
ROUNDS = 25


def stored_rows(store: KvStore, key: str) -> list[int] | None:
    """The ledger's rows as committed, or None if no initialised actor is stored."""
    with open_database(store.namespace(actor_id("ledger", key)), read_only=True) as db:
        try:
            initialized = db.execute(
                "SELECT 1 FROM _pagekv_meta WHERE key = 'initialized'"
            ).fetchall()
        except apsw.SQLError:
            return None
        if not initialized:
            return None
        return [n for (n,) in db.execute("SELECT n FROM entries ORDER BY id")]


def recorded(store: KvStore, key: str) -> bool:
    """Whether the registry's index has a record of the actor (`actor/<actor id>`, then its
    generation: `pagekv/actor/directory/records.py`)."""
    base = b"actor/" + actor_id("ledger", key).encode()
    return bool(store.namespace(REGISTRY_NAMESPACE).list(start=base, end=base + b"\x01"))


def check_round(
    store: KvStore, key: str, before: list[int], value: int, deleted: bool, added: bool
) -> list[int] | None:
    """The outcomes some order of `destroy` and `add(value)` allows, given which succeeded."""
    rows = stored_rows(store, key)
    assert recorded(store, key) == (rows is not None), f"index and data disagree: {rows}"
    allowed: list[list[int] | None] = []
    if deleted:
        allowed += [None, [value]] if added else [None]
    else:
        allowed += [[*before, value]] if added else [before]
    assert rows in allowed, f"rows {rows}, allowed {allowed} (deleted {deleted}, added {added})"
    return rows


async def test_destroy_racing_get_or_create_on_one_server() -> None:
    async with serving() as served, served.http() as http:
        await _rounds(served, http)


async def _rounds(served: Served, http: httpx.AsyncClient) -> None:
    seen: set[tuple[bool, bool, bool]] = set()
    rng = random.Random(7)
    for n in range(ROUNDS):
        seen.add(await _http_round(served, http, f"k{n}", rng))
    assert {(True, True, False), (True, True, True)} <= seen, f"both orders happened: {seen}"


async def _http_round(
    served: Served, http: httpx.AsyncClient, key: str, rng: random.Random
) -> tuple[bool, bool, bool]:
    add = "/actors/ledger/actions/add"
    first = await http.post(add, params={"key": key}, json={"args": [1]})
    assert first.status_code == 200
    answers: dict[str, httpx.Response] = {}

    async def send(what: str, request: Any, delay: float) -> None:
        await anyio.sleep(delay)
        answers[what] = await request

    async with anyio.create_task_group() as tg:
        deleting = http.delete("/actors/ledger", params={"key": key})
        tg.start_soon(send, "delete", deleting, rng.uniform(0, 0.004))
        adding = http.post(add, params={"key": key}, json={"args": [2]})
        tg.start_soon(send, "add", adding, rng.uniform(0, 0.004))
    deleted = answers["delete"].status_code == 200
    added = answers["add"].status_code == 200
    assert deleted or answers["delete"].status_code == 503, answers["delete"].text
    assert added or answers["add"].status_code == 503, answers["add"].text
    rows = check_round(served.store, key, [1], 2, deleted, added)
    reach = await http.post(
        "/actors/ledger/actions/read", params={"key": key, "mode": "get"}, json={}
    )
    if rows is None:
        assert reach.status_code == 404, reach.text
    else:
        assert reach.json()["result"]["rows"] == rows
    again = await http.post(add, params={"key": key}, json={"args": [3]})
    assert again.json()["result"]["rows"] == [*(rows or []), 3], "old data came back"
    return deleted, added, rows is None


_WORKER = """
import json, sys, anyio
from server_defs import ledger
from pagekv.actor import Registry

async def main():
    async with Registry([ledger], kv=sys.argv[1]).run() as client:
        print(json.dumps({"ready": True}), flush=True)
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            key, value = json.loads(line)
            try:
                result = await client.get_or_create("ledger", key).add(value)
            except Exception as e:
                print(json.dumps({"error": type(e).__name__}), flush=True)
            else:
                print(json.dumps({"ok": result["rows"]}), flush=True)
anyio.run(main)
"""
"""A second process that answers `[key, value]` lines with the ledger's `add(value)`."""


class _SlowIndex(KvWrapper):
    """The registry index as a distant store would serve it: 20 ms a request, so the steps of
    a destroy (drop, then the index) leave the other process time to act in between."""

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        time.sleep(0.02)
        return fn(*args, **kwargs)


class _Store:
    def __init__(self, inner: KvStore) -> None:
        self.inner = inner

    def namespace(self, actor_id: str) -> ActorKv:
        kv = self.inner.namespace(actor_id)
        return _SlowIndex(kv) if actor_id == REGISTRY_NAMESPACE else kv

    def close(self) -> None:
        self.inner.close()


async def test_destroy_racing_get_or_create_across_two_processes(tmp_path: Path) -> None:
    """This process destroys while another process (another registry on the same store)
    calls get-or-create on the same key."""
    url = f"file://{tmp_path}/store"
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
    )
    assert worker.stdin is not None and worker.stdout is not None
    store = open_kv(url)
    try:
        assert json.loads(worker.stdout.readline()) == {"ready": True}

        def remote_add(key: str, value: int) -> dict[str, Any]:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(json.dumps([key, value]) + "\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())

        rng = random.Random(8)
        async with Registry([ledger], kv=_Store(open_kv(url))).run() as client:  # type: ignore[arg-type]
            for n in range(ROUNDS):
                await _cross_round(client, store, remote_add, f"k{n}", rng)
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
        store.close()


async def _cross_round(
    client: Client,
    store: KvStore,
    remote_add: Callable[[str, int], dict[str, Any]],
    key: str,
    rng: random.Random,
) -> None:
    assert (await anyio.to_thread.run_sync(remote_add, key, 1)) == {"ok": [1]}
    outcome: dict[str, Any] = {}

    async def destroy(delay: float) -> None:
        await anyio.sleep(delay)
        try:
            await client.destroy("ledger", key)
            outcome["deleted"] = True
        except Exception as e:
            outcome["deleted"] = type(e).__name__

    async def add(delay: float) -> None:
        await anyio.sleep(delay)
        outcome["add"] = await anyio.to_thread.run_sync(remote_add, key, 2)

    async with anyio.create_task_group() as tg:
        tg.start_soon(destroy, 0.0)
        tg.start_soon(add, rng.uniform(0, 0.1))
    deleted = outcome["deleted"] is True
    added = "ok" in outcome["add"]
    assert deleted or outcome["deleted"] == "ActorTakenOver", outcome
    rows = check_round(store, key, [1], 2, deleted, added)
    if added and rows is not None:
        assert outcome["add"]["ok"] == rows
    for _ in range(3):  # a stale instance there answers "taken over": retry
        after = await anyio.to_thread.run_sync(remote_add, key, 3)
        if after != {"error": "ActorTakenOver"}:
            break
    assert after == {"ok": [*(rows or []), 3]}, f"old data came back: {after}"
