"""Rollback after replays: every completed step's handler runs exactly once, newest first, however
the workflow got to its failure (no restart, a graceful restart or a SIGKILL while it slept, either
of them in the middle of the rollback) and whatever shape held the step (a join's branches, a
race's winner and loser, a pruned loop). The `saga` actor's rows say what ran (`actor_defs`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest
from actor_defs import SAGA_STEPS, saga
from flows import settle

from pagekv.actor import ActorError, ActorHandle, Registry
from pagekv.actor.workflow import WorkflowState
from pagekv.kv import KvStore, MemoryStore, open_kv
from pagekv.vfs import open_database

pytestmark = pytest.mark.anyio


async def _napping(handle: ActorHandle) -> None:
    """Wait until the database records the workflow sleeping in its `nap` (after every shape)."""
    with anyio.fail_after(30):
        while True:
            history = await handle.workflow.history() or {}
            names = {e["name"] for e in history.get("entries", [])}
            if history.get("state") == WorkflowState.SLEEPING.value and "nap" in names:
                return
            await anyio.sleep(0.01)


async def _napping_in(url: str) -> None:
    """`_napping` from outside, in a read-only snapshot: another process owns the actor."""

    def napping(store: KvStore) -> bool:
        try:
            with open_database(store.namespace("saga/k"), read_only=True) as db:
                state = db.execute("SELECT value FROM _pagekv_workflow WHERE key = 'state'")
                nap = db.execute("SELECT 1 FROM _pagekv_workflow_history WHERE name = 'nap'")
                return state.fetchall() == [("sleeping",)] and bool(nap.fetchall())
        except apsw.SQLError:
            return False

    store = open_kv(url)
    try:
        with anyio.fail_after(30):
            while not await anyio.to_thread.run_sync(napping, store):
                await anyio.sleep(0.02)
    finally:
        store.close()


def _check(rows: dict[str, list[str]], status: Any) -> None:
    assert sorted(rows["did"]) == sorted(SAGA_STEPS), rows
    assert rows["undone"] == list(reversed(rows["did"])), "each handler once, newest first"
    assert status.state is WorkflowState.FAILED and status.error["type"] == "StepCritical"


async def test_every_handler_runs_once_newest_first_without_a_restart() -> None:
    async with Registry([saga], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("saga", "k")
        status = await settle(handle)
        _check(await handle.saga_rows(), status)


@pytest.mark.parametrize("stop_at", ["", "block:loop1", "block:first"])
async def test_every_handler_runs_once_after_a_graceful_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: str
) -> None:
    """The registry closes while the workflow sleeps (its join, race and loop are then only
    replayed), and again, if `stop_at`, while a handler runs; the next one finishes the rollback."""
    monkeypatch.setenv("SAGA_STOP_AT", stop_at)
    monkeypatch.setenv("SAGA_MARKER", str(tmp_path / "marker"))
    store = MemoryStore()
    async with Registry([saga], kv=store).run() as client:
        await _napping(client.get_or_create("saga", "k"))
    if stop_at:
        async with Registry([saga], kv=store).run():
            with anyio.fail_after(15):
                while not (tmp_path / "marker").exists():
                    await anyio.sleep(0.01)
    async with Registry([saga], kv=store).run() as client:
        handle = client.get("saga", "k")
        status = await settle(handle)
        _check(await handle.saga_rows(), status)
    assert (tmp_path / "marker").exists() == bool(stop_at), "the stop fired"


_RUN_SAGA = """
import anyio, sys
from actor_defs import saga
from pagekv.actor import ActorError, ActorHandle, Registry
async def main():
    async with Registry([saga], kv=sys.argv[1]).run() as client:
        await client.get_or_create("saga", "k").saga_rows()
        await anyio.sleep_forever()
anyio.run(main)
"""


@pytest.mark.parametrize("kill_at", ["nap", "x", "s", "loop0"])
async def test_every_handler_runs_once_after_a_sigkill(tmp_path: Path, kill_at: str) -> None:
    """A process runs the saga and is SIGKILLed: during the nap (by the test), or inside the
    rollback handler `kill_at` before its transaction commits (by the handler itself)."""
    url = f"file://{tmp_path}/store"
    env = {**os.environ, "SAGA_MARKER": str(tmp_path / "marker"), "SAGA_NAP_S": "1.0"}
    if kill_at != "nap":
        env["SAGA_STOP_AT"] = f"kill:{kill_at}"
    child = subprocess.Popen(
        [sys.executable, "-c", _RUN_SAGA, url], cwd=Path(__file__).parent, env=env
    )
    try:
        if kill_at == "nap":
            await _napping_in(url)
            child.kill()
        with anyio.fail_after(30):
            while (code := child.poll()) is None:
                await anyio.sleep(0.02)
    finally:
        child.kill()
    assert code == -9, code
    assert (tmp_path / "marker").exists() == (kill_at != "nap"), "the handler's kill fired"
    async with Registry([saga], kv=url).run() as client:
        handle = client.get("saga", "k")
        status = await settle(handle, timeout=30)
        _check(await handle.saga_rows(), status)


@pytest.mark.parametrize("operation", ["cancel", "replay"])
async def test_a_rollback_under_way_cannot_be_cancelled_or_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """Both were accepted mid-rollback: cancel left completed steps never undone, replay
    forgot which handlers had run. Now they are refused, and the rollback finishes, each
    handler once (the one they interrupted rolled back and ran again)."""
    monkeypatch.setenv("SAGA_STOP_AT", "block:loop1")
    monkeypatch.setenv("SAGA_MARKER", str(tmp_path / "marker"))
    async with Registry([saga], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("saga", "k")
        await handle.saga_rows()
        with anyio.fail_after(15):
            while not (tmp_path / "marker").exists():
                await anyio.sleep(0.01)
        with pytest.raises(ActorError, match="rolling back"):
            await getattr(handle.workflow, operation)()
        status = await settle(handle)
        _check(await handle.saga_rows(), status)
