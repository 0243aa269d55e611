"""Workflows under faults: a KV write failing at every point of a workflow, a takeover by a
second registry mid-workflow, a restart of everything while a workflow sleeps, and the stored
format (fixtures of released versions open and continue; a newer format is refused)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import apsw
import cbor2
import pytest
from actor_defs import STEPS, stepper
from fixture_store import load_fixture
from flows import durably, settle

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.workflow import (
    FORMAT_VERSION,
    StepContext,
    WorkflowContext,
    WorkflowFormatError,
    WorkflowState,
    WorkflowStatus,
)
from pagekv.kv import ActorKv, FaultKind, FaultyStore, KvStore, MemoryStore, open_kv
from pagekv.kv.wrappers import KvWrapper
from pagekv.vfs import open_database

pytestmark = pytest.mark.anyio
T = TypeVar("T")


def ledger_flow(steps: int, *, pause: float = 0.0):
    """Each step appends a row and bumps the state in one transaction and returns the count."""
    a = actor("flow", state={"count": 0})

    @a.on_migrate
    async def schema(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS log(i INTEGER)")

    @a.workflow
    async def run(wf: WorkflowContext) -> Any:
        await wf.queue.next("start", names=["go"])
        for i in range(steps):

            async def write(step: StepContext, i: int = i) -> int:
                await step.db.execute("INSERT INTO log VALUES (?)", (i,))
                step.state["count"] += 1
                return step.state["count"]

            assert await wf.step(f"write-{i}", write) == i + 1
            if pause:
                await wf.sleep(f"pause-{i}", pause)
        return "done"

    @a.action
    async def view(ctx: ActorContext) -> Any:
        rows = await ctx.db.execute("SELECT i FROM log ORDER BY rowid")
        return [ctx.state["count"], [r[0] for r in rows]]

    return a


async def _run_with_fault(at: int | None, kind: FaultKind) -> tuple[int, WorkflowStatus, Any]:
    """Start the workflow; fail the `at`-th KV write after the start message (None: no fault).

    Returns the number of KV writes after the start message (of a clean run), the final status
    and the actor's view.
    """
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    async with Registry([ledger_flow(2)], kv=store).run() as client:
        handle = client.get_or_create("flow", "k")
        await settle(handle, WorkflowState.SLEEPING)
        counting, faulty = store.counting["flow/k"], store.faulty["flow/k"]
        await handle.send("go", True)
        counting.reset()
        if at is not None:
            faulty.arm(kind, after=at)
        status = await settle(handle, WorkflowState.COMPLETED)
        writes = counting.stats.writes
        view = await handle.view()
        if at is not None:
            assert faulty.fired_count(kind) == 1, "the injected fault fired"
    return writes, status, view


@pytest.mark.parametrize("kind", [FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE])
async def test_a_failed_kv_write_at_any_point_never_half_records_a_step(kind: FaultKind) -> None:
    """Every write of the workflow fails once in turn; the instance dies and a fresh one
    replays. Each step is then recorded with its state and row exactly once, or re-executed."""
    clean_writes, clean, view = await _run_with_fault(None, kind)
    assert clean.output == "done" and view == [2, [0, 1]]
    assert clean_writes >= 3, "receive, two steps and the outcome are commits"
    for at in range(clean_writes):
        _, status, view = await _run_with_fault(at, kind)
        assert status.output == "done", at
        assert view == [2, [0, 1]], f"fault at write {at}: state and rows {view}"


async def test_a_second_registry_takes_over_mid_workflow_and_continues(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    steps = 12
    definition = ledger_flow(steps, pause=0.05)
    async with Registry([definition], kv=url).run() as first:
        old = first.get_or_create("flow", "k")
        await old.send("go", True)
        with anyio.fail_after(10):
            while (await old.view())[0] < 3:
                await anyio.sleep(0.02)
        async with Registry([definition], kv=url).run() as second:
            new = second.get("flow", "k")
            taken_at = (await new.view())[0]
            status = await settle(new, WorkflowState.COMPLETED)
            count, rows = await new.view()
    assert taken_at >= 3 and status.output == "done"
    assert (count, rows) == (steps, list(range(steps))), "every step exactly once, in order"


async def test_sigkill_mid_workflow_then_restart_applies_every_step_once(tmp_path: Path) -> None:
    """A process runs the `stepper` workflow and is SIGKILLed three times at different points
    (often inside a step's transaction); after the last restart every step's row and state
    change is there exactly once."""
    url = f"file://{tmp_path}/store"
    program = (
        "import anyio, sys\n"
        "from actor_defs import stepper\n"
        "from pagekv.actor import Registry\n"
        "async def main():\n"
        f"    async with Registry([stepper], kv={url!r}).run() as client:\n"
        "        await client.get_or_create('stepper', 'k').progress()\n"
        "        await anyio.sleep_forever()\n"
        "anyio.run(main)\n"
    )
    store = open_kv(url)
    seen = []
    try:
        for target in (5, 15, 25):
            process = subprocess.Popen([sys.executable, "-c", program], cwd=Path(__file__).parent)
            try:
                with anyio.fail_after(30):
                    while (count := await anyio.to_thread.run_sync(_committed, store)) < target:
                        await anyio.sleep(0.02)
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait()
            seen.append(count)
    finally:
        store.close()
    async with Registry([stepper], kv=url).run() as client:
        handle = client.get("stepper", "k")
        status = await settle(handle, WorkflowState.COMPLETED)
        view = await handle.progress()
    assert seen == sorted(seen) and seen[-1] < STEPS, "killed mid-workflow each time"
    assert status.output == STEPS
    assert view == {"count": STEPS, "rows": list(range(STEPS))}


_SERVE_STEPPER = """
import anyio, signal, sys
from actor_defs import stepper
from pagekv.actor import Registry
async def main():
    registry = Registry([stepper], kv=sys.argv[1], lease=float(sys.argv[2]))
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async with registry.run() as client:
            await client.get_or_create("stepper", "k").progress()
            async for _ in signals:
                break
anyio.run(main)
"""
"""A registry that wakes the `stepper` (its workflow starts), and stops gracefully on SIGTERM."""


@pytest.mark.parametrize(
    ("stop", "lease", "within"),
    [(signal.SIGTERM, 60.0, 20.0), (signal.SIGKILL, 2.0, 30.0)],
    ids=["graceful-stop", "sigkill"],
)
async def test_a_workflow_cut_off_by_its_process_resumes_with_no_request(
    tmp_path: Path, stop: signal.Signals, lease: float, within: float
) -> None:
    """The process running a workflow stops (gracefully, or by SIGKILL) mid-workflow; the next
    registry of the store is sent nothing. It must resume the workflow by itself: at once after
    a graceful stop (the lease is longer than the test waits), within one lease after a crash.
    Every step's row and state change lands exactly once."""
    url = f"file://{tmp_path}/store"
    store = open_kv(url)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _SERVE_STEPPER, url, str(lease)],
            cwd=Path(__file__).parent,
            env={**os.environ, "STEPPER_PAUSE_S": "0.1"},  # 3.5 s left after step 5
        )
        try:
            with anyio.fail_after(30):
                while await anyio.to_thread.run_sync(_committed, store) < 5:
                    await anyio.sleep(0.02)
        finally:
            child.send_signal(stop)
            code = await anyio.to_thread.run_sync(child.wait)
        cut_at = await anyio.to_thread.run_sync(_committed, store)
        assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL), (code, cut_at)
        assert cut_at < STEPS, "the workflow finished before the stop"
        async with Registry([stepper], kv=url, lease=lease).run():
            with anyio.fail_after(within):
                while (done := await anyio.to_thread.run_sync(_committed, store)) < STEPS:
                    assert done >= cut_at, (done, cut_at)
                    await anyio.sleep(0.05)
        with open_database(store.namespace("stepper/k"), read_only=True) as db:
            rows = [i for (i,) in db.execute("SELECT i FROM done ORDER BY rowid")]
            state = cbor2.loads(db.execute("SELECT data FROM _pagekv_state").fetchall()[0][0])
    finally:
        store.close()
    assert rows == list(range(STEPS)) and state["count"] == STEPS, (cut_at, rows)


def _committed(store: KvStore) -> int:
    """Steps committed so far, read from a snapshot (no takeover, never a write)."""
    try:
        with open_database(store.namespace("stepper/k"), read_only=True) as db:
            return db.execute("SELECT count(*) FROM done").fetchall()[0][0]
    except apsw.SQLError:
        return 0


async def test_a_sleeping_workflow_survives_a_restart_of_everything(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"

    a = actor("sleeper", state=None)

    @a.workflow
    async def run(wf: WorkflowContext) -> str:
        await wf.sleep("night", 1.0)
        return "morning"

    @a.action
    async def ping(ctx: ActorContext) -> None:
        return None

    async with Registry([a], kv=url).run() as client:
        handle = client.get_or_create("sleeper", "k")
        await durably(handle, WorkflowState.SLEEPING)
    registry = Registry([a], kv=url)
    async with registry.run() as client:
        with anyio.fail_after(10):
            while not registry.live():
                await anyio.sleep(0.02)
        status = await settle(client.get("sleeper", "k"), WorkflowState.COMPLETED)
    assert status.output == "morning", "the restarted registry woke the actor on its own"


def fixture_flow():
    """The workflow of `fixtures/make_internal_v2.py`, with step bodies that would return
    different values: a replay must use the recorded ones."""
    a = actor("orders", state={"steps": 0})

    async def fresh(step: StepContext) -> str:
        return "re-executed"

    @a.workflow
    async def fulfil(wf: WorkflowContext) -> Any:
        order = await wf.step("load", fresh)
        seen = []
        async for it in wf.loop("poll", state=0):
            seen.append(await it.step("check", fresh))
            it.state += 1
            if it.index == 2:
                break
        both = await wf.join(
            "fan", {"a": lambda w: w.step("x", fresh), "b": lambda w: w.step("y", fresh)}
        )
        approval = await wf.queue.next("approval", names=["approve"])
        return [order, seen, both, approval.body if approval else None]

    return a


async def test_a_workflow_of_format_1_continues_with_the_current_code() -> None:
    store = load_fixture(2)
    async with Registry([fixture_flow()], kv=store).run() as client:
        handle = client.get("orders", "fixture")
        await settle(handle, WorkflowState.SLEEPING)
        await handle.send("approve", "yes")
        status = await settle(handle, WorkflowState.COMPLETED)
    recorded = "recorded"
    assert status.output == [
        recorded,
        [recorded],  # a completed loop replays its last iteration only
        {"a": recorded, "b": recorded},
        "yes",
    ]


async def test_a_newer_workflow_format_is_refused_clearly() -> None:
    store = load_fixture(2)
    with open_database(store.namespace("orders/fixture")) as db:
        db.execute("UPDATE _pagekv_workflow SET value = 99 WHERE key = 'format_version'")
    async with Registry([fixture_flow()], kv=store).run() as client:
        handle = client.get("orders", "fixture")
        with pytest.raises(
            WorkflowFormatError,
            match=f"format version 99; this pagekv reads up to {FORMAT_VERSION}",
        ):
            await handle.workflow.status()


class _HoldsAWrite(KvWrapper):
    """Holds the first write after `armed` is set until `release` is set."""

    def __init__(self, inner: ActorKv) -> None:
        super().__init__(inner)
        self.armed, self.holding, self.release = False, threading.Event(), threading.Event()

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if op == "write" and self.armed:
            self.armed = False
            self.holding.set()
            assert self.release.wait(30)
        return fn(*args, **kwargs)


async def test_a_completed_workflow_is_reported_only_once_its_outcome_is_committed() -> None:
    """While the commit of the outcome is under way, `status()` said `completed` from memory: a
    crash then would run the workflow again, after a client had been told it was done."""
    store = MemoryStore()
    held = _HoldsAWrite(store.namespace("short/k"))
    flow = actor("short")

    @flow.workflow
    async def run(wf: WorkflowContext) -> str:
        await wf.step("one", _one)
        held.armed = True  # the next write of the actor's database: the outcome's commit
        return "out"

    class _Store:
        def namespace(self, actor_id: str) -> ActorKv:
            return held if actor_id == "short/k" else store.namespace(actor_id)

        def close(self) -> None:
            store.close()

    async with Registry([flow], kv=_Store()).run() as client:  # type: ignore[arg-type]
        handle = client.get_or_create("short", "k")
        await handle.workflow.wake()
        assert await anyio.to_thread.run_sync(held.holding.wait, 30)
        during = await handle.workflow.status()
        held.release.set()
        after = await settle(handle, WorkflowState.COMPLETED)
    assert during.state is WorkflowState.RUNNING and during.output is None, during
    assert after.output == "out"


async def _one(step: StepContext) -> int:
    return 1
