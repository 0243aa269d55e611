"""Random workflow programs checked against a model of what they must do.

A program (`make_case(seed)`, rebuilt from the seed alone, also by the SIGKILL test's child
process) nests steps, flaky steps, sleeps, receives from a shared pool, loops with pruning, joins
and races at random. Half the programs start with a `rollback_checkpoint`, give some steps
rollback handlers and end with a step that fails (at the root, in a join branch or in the last
iteration of a loop), so the workflow must roll back. Each step writes its location to `log` (and
bumps `count`) in its transaction, each handler writes it to `undone` (and bumps `undone`), and
`expect` says which rows, output or failure and leftover messages a program must produce: every
run is checked on its own, not only against another run.

A race is deterministic: its loser receives a token the step before the race sent, runs its
body, then a step that sends the gate message the winner waits for first, and sleeps for an hour
(or fails). So the loser always completes its steps before it loses; a loser that completed a
step with a handler keeps its history (its handlers must run on a failure), and what it received
must come back: the token to the receive after the race, pool messages to the queue (`POOL`).

Runs: clean; with one KV write failing at a random point (FaultyStore); cancelled at a random
point (no step or handler may start after `cancel()` returned); replayed after the end, from the
start or from a recorded entry (exactly the forgotten steps run again, each once); and in a
child process SIGKILLed at random points, then finished here. Every completed step's row lands
exactly once, and after a failure `undone` holds exactly the undoable rows, newest first.

The engine bugs the fuzzer found are at the end, each as its shrunk program (a regression test
now that the engine is fixed), with the seeds that found them.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest
from flows import durably, settle

from pagekv.actor import ActorContext, Registry, actor
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.workflow import (
    Critical,
    StepContext,
    WorkflowContext,
    WorkflowState,
    WorkflowStatus,
)
from pagekv.kv import FaultKind, FaultyStore, KvStore, MemoryStore, open_kv
from pagekv.vfs import open_database

pytestmark = pytest.mark.anyio
Op = tuple[Any, ...]
View = tuple[int, int, list[str], list[str]]

PAUSE_S = 0.0
"""How long each step and handler takes (inside its transaction): a run that must be cut off
mid-way (cancel, SIGKILL) sets more."""
ATTEMPTS: list[str] = []
"""Every step attempt and handler run of this process, in order."""


# -- programs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    seed: int
    ops: list[Op]
    rollback: bool


def make_case(seed: int) -> Case:
    """The program of `seed`; a child process rebuilds the same one from the seed."""
    rng = random.Random(seed)
    rollback = rng.random() < 0.5
    while True:
        ops = program(rng, undo=rollback)
        if rollback:
            ops = [("checkpoint", "cp"), *ops]
            place_fail(rng, ops)
        expected = expect(ops)
        if 8 <= len(expected.rows) + len(expected.undoable) * rollback <= 48:
            return Case(seed, ops, rollback)


def program(rng: random.Random, depth: int = 0, *, undo: bool) -> list[Op]:
    ops: list[Op] = []
    for i in range(rng.randint(2, 6) if depth == 0 else rng.randint(1, 3)):
        label = f"op{i}"
        kinds = ["step", "step", "flaky", "sleep", "take"]
        kind = rng.choice(kinds + (["loop", "join", "race"] if depth < 2 else []))
        if kind in ("step", "flaky"):
            ops.append((kind, label, undo and rng.random() < 0.6))
        elif kind == "take":
            how = rng.choice(["plain", "plain", "complete", "hold"])
            ops.append((kind, label, undo and rng.random() < 0.6, how))
        elif kind == "sleep":
            ops.append(("sleep", label))
        elif kind == "loop":
            iterations, size, every = rng.randint(1, 4), rng.choice([1, 1, 2]), rng.choice([1, 2])
            body = program(rng, depth + 1, undo=undo)
            ops.append(("loop", label, iterations, size, every, body))
        elif kind == "join":
            ops.append(
                (
                    "join",
                    label,
                    program(rng, depth + 1, undo=undo),
                    program(rng, depth + 1, undo=undo),
                )
            )
        else:
            winner, loser = program(rng, depth + 1, undo=undo), program(rng, depth + 1, undo=undo)
            how = rng.choice(["sleep", "sleep", "fail"])
            flags = (undo and rng.random() < 0.5, undo and rng.random() < 0.5)
            ops.append(("race", label, winner, loser, how, flags))
    return ops


def place_fail(rng: random.Random, ops: list[Op]) -> None:
    """Put the failing step at the end of `ops`, or inside its last op if a loop (its last
    iteration fails) or a join (one branch fails, the other runs to its end)."""
    last = ops[-1]
    if last[0] == "loop" and rng.random() < 0.5:
        place_fail(rng, last[5])
    elif last[0] == "join" and rng.random() < 0.5:
        place_fail(rng, last[rng.choice([2, 3])])
    else:
        ops.append(("fail", f"op{len(ops)}"))


def child_path(path: str, label: str) -> str:
    """A location as `handle.workflow.history()` spells it: the rows say where a step was."""
    return f"{path}/{label}" if path else label


class _Failed(Exception):
    """The model's workflow failure; its argument is the error type the workflow reports."""


@dataclass
class Expected:
    rows: list[tuple[str, bool]]
    """(location, undoable) of every step's row, in no particular order."""
    outcome: Any
    """The output, or the `_Failed` the workflow ends with."""
    left: list[tuple[str, str]]
    """Race messages (queue, body) left in the queue at the end, besides the pool's: what a
    race nested in a losing branch exchanged is given back with that branch."""
    consumed: list[str]
    """The `take` rows whose pool message is consumed for good: a plain receive outside a
    losing race branch, a completed one anywhere, and one in a loop iteration of a loser that
    pruning had dropped before the loser lost (docs/workflows.md: "as a finished iteration's")."""
    returning: list[str]
    """The `take` rows of plain receives in a losing branch, whose messages go back."""

    def merge(self, other: Expected) -> None:
        self.rows += other.rows
        self.left += other.left
        self.consumed += other.consumed
        self.returning += other.returning

    @property
    def failed(self) -> bool:
        return isinstance(self.outcome, _Failed)

    @property
    def undoable(self) -> set[str]:
        return {p for p, u in self.rows if u}


def expect(ops: list[Op]) -> Expected:
    expected = Expected([], None, [], [], [])
    try:
        expected.outcome = _model(ops, "", True, False, expected)
    except _Failed as e:
        expected.outcome = e
    return expected


def _model(ops: list[Op], path: str, last: bool, losing: bool, e: Expected) -> list[Any]:
    out: list[Any] = []
    rows = e.rows
    for op in ops:
        kind, where = op[0], child_path(path, op[1])
        if kind in ("step", "flaky"):
            rows.append((where, op[2]))
            out.append(where)
        elif kind == "take":
            rows.append((f"{where}.got", op[2]))
            if op[3] == "complete" or (op[3] == "plain" and not losing):
                e.consumed.append(f"{where}.got")
            elif op[3] == "plain":
                e.returning.append(f"{where}.got")
        elif kind == "fail" and last:
            raise _Failed("StepCritical")
        elif kind == "loop":
            _, _, iterations, size, every, body = op
            dropped = _pruned(iterations, size, every) if losing else 0
            for i in range(iterations):
                sub = Expected([], None, [], [], [])
                try:
                    _model(body, f"{where}/~{i}", last and i == iterations - 1, losing, sub)
                finally:
                    if i < dropped and not sub.undoable:  # pruned before its loser lost
                        sub.consumed += sub.returning
                        sub.returning, sub.left = [], []
                    e.merge(sub)
            out.append(iterations)
        elif kind == "join":
            results, failed = {}, False
            for branch, body in (("a", op[2]), ("b", op[3])):
                try:
                    results[branch] = _model(body, f"{where}/{branch}", last, losing, e)
                except _Failed:
                    failed = True
            if failed:
                raise _Failed("JoinError")
            out.append(results)
        elif kind == "race":
            rows.append((f"{where}.tok", op[5][0]))
            _model(op[3], f"{where}/lose", last, True, e)
            rows.append((f"{where}/lose/gate", op[5][1]))
            out.append(["win", _model(op[2], f"{where}/win", last, losing, e), f"{where}.tok"])
            if losing:
                e.left += [
                    (f"tok:{where}", f"{where}.tok"),
                    (f"gate:{where}", f"{where}/lose/gate"),
                ]
    return out


def _pruned(iterations: int, history_size: int, prune_every: int) -> int:
    """How many iterations a loop's pruning has dropped by its last one (as `Loop`): all those
    before that but for the ones holding a step with a rollback handler."""
    pruned = 0
    for index in range(1, iterations):
        if index - history_size - pruned >= prune_every:
            pruned = index - history_size
    return pruned


def shape(ops: list[Op]) -> set[str]:
    """What a program holds, for the seed lists' coverage."""
    found: set[str] = set()
    for op in ops:
        found.add(op[0])
        if op[0] in ("step", "flaky", "take") and op[2]:
            found.add("undoable")
        if op[0] == "take":
            found.add(f"take-{op[3]}")
        elif op[0] == "loop":
            found.add(f"loop{op[3]}/{op[4]}")
            found |= shape(op[5])
            if _pruned(*op[2:5]):
                found.add("pruned")
        elif op[0] == "join":
            found |= shape(op[2]) | shape(op[3])
        elif op[0] == "race":
            found.add(f"race-{op[4]}")
            found |= shape(op[2]) | shape(op[3])
            if op[5][1] or "undoable" in shape(op[3]):
                found.add("kept-loser")
    return found


# -- the actor ----------------------------------------------------------------------------------


def forward(
    path: str,
    *,
    flaky: bool = False,
    send: str | None = None,
    got: list[Any] | None = None,
    how: str = "",
):
    """A step writing its row; `send`: and a message to that queue; `got`: and a row of what
    the receive (`how`) before it got (`[body]`, `[]` for nothing)."""

    async def fn(step: StepContext) -> str:
        ATTEMPTS.append(path)
        await step.db.execute("INSERT INTO log VALUES (?)", (path,))
        step.state["count"] += 1
        if send is not None:
            await step.queue.send(send, path)
        if got:
            await step.db.execute("INSERT INTO got VALUES (?, ?, ?)", (path, got[0], how))
        if PAUSE_S:
            await anyio.sleep(PAUSE_S)
        if flaky and step.attempt == 1:
            raise RuntimeError("first attempt fails")
        return path

    return fn


def undo(path: str):
    async def fn(step: StepContext, output: Any) -> None:
        ATTEMPTS.append(f"undo {path}")
        assert output == path, (output, path)
        await step.db.execute("INSERT INTO undone VALUES (?)", (path,))
        step.state["undone"] += 1
        if PAUSE_S:
            await anyio.sleep(PAUSE_S)

    return fn


async def boom(step: StepContext) -> None:
    ATTEMPTS.append("boom")
    raise Critical("the program fails here")


async def do_step(wf: WorkflowContext, name: str, path: str, undoable: bool, **kw: Any) -> Any:
    return await wf.step(
        name, forward(path, **kw), backoff=0, rollback=undo(path) if undoable else None
    )


async def interpret(wf: WorkflowContext, ops: list[Op], path: str, last: bool) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        kind, label = op[0], op[1]
        where = child_path(path, label)
        if kind in ("step", "flaky"):
            out.append(await do_step(wf, label, where, op[2], flaky=kind == "flaky"))
        elif kind == "sleep":
            await wf.sleep(label, 0.001)
        elif kind == "take":
            how = op[3]
            message = await wf.queue.next(
                label, names=["pool"], timeout=0, completable=how != "plain"
            )
            got = [] if message is None else [message.body]
            if message is not None and how == "complete":
                await message.complete()
            await do_step(wf, f"{label}.got", f"{where}.got", op[2], got=got, how=how)
        elif kind == "checkpoint":
            await wf.rollback_checkpoint(label)
        elif kind == "fail":
            if last:
                await wf.step(label, boom, backoff=0)
        elif kind == "loop":
            _, _, iterations, size, every, body = op
            async for it in wf.loop(label, state=0, history_size=size, prune_every=every):
                final = it.index == iterations - 1
                await interpret(it, body, f"{where}/~{it.index}", last and final)
                it.state += 1
                if final:
                    out.append(it.state)
                    break
        elif kind == "join":
            branches = {
                "a": lambda w, body=op[2], p=f"{where}/a": interpret(w, body, p, last),
                "b": lambda w, body=op[3], p=f"{where}/b": interpret(w, body, p, last),
            }
            out.append(await wf.join(label, branches))
        else:
            out.append(await race(wf, op, where, last))
    return out


async def race(wf: WorkflowContext, op: Op, where: str, last: bool) -> list[Any]:
    _, label, winner_ops, loser_ops, how, (token_undo, gate_undo) = op
    token, gate = f"tok:{where}", f"gate:{where}"
    await do_step(wf, f"{label}.tok", f"{where}.tok", token_undo, send=token)

    async def winner(w: WorkflowContext) -> list[Any]:
        await w.queue.next("gate", names=[gate])
        return await interpret(w, winner_ops, f"{where}/win", last)

    async def loser(w: WorkflowContext) -> str:
        await w.queue.next("take", names=[token])
        await interpret(w, loser_ops, f"{where}/lose", last)
        await do_step(w, "gate", f"{where}/lose/gate", gate_undo, send=gate)
        if how == "sleep":
            await w.sleep("forever", 3600)
        else:
            await w.step("boom", boom, backoff=0)
        return "the loser won"

    result = await wf.race(label, {"win": winner, "lose": loser})
    back = await wf.queue.next(f"{label}.back", names=[token], timeout=3)
    return [result.winner, result.value, back.body if back is not None else None]


def flow_actor(ops: list[Op]):
    a = actor("random", state={"count": 0, "undone": 0})

    @a.on_migrate
    async def schema(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS log(path TEXT)")
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS undone(path TEXT)")
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS got(path TEXT, body TEXT, how TEXT)")

    @a.workflow
    async def run(wf: WorkflowContext) -> Any:
        await wf.queue.next("start", names=["start"])
        return await interpret(wf, ops, "", True)

    @a.action
    async def view(ctx: ActorContext) -> Any:
        rows = await ctx.db.execute("SELECT path FROM log ORDER BY rowid")
        undone = await ctx.db.execute("SELECT path FROM undone ORDER BY rowid")
        state = ctx.state
        return state["count"], state["undone"], [r[0] for r in rows], [r[0] for r in undone]

    @a.action
    async def drain(ctx: ActorContext) -> Any:
        """What each `take` got (location, body), and every message left in the queue (taken
        out of it)."""
        got = await ctx.db.execute("SELECT path, body FROM got")
        left = []
        while (message := await ctx.queue.next(timeout=0)) is not None:
            left.append((message.name, message.body))
        return got, left

    return a


POOL = ["p0", "p1", "p2"]
"""Messages of the queue `pool`, sent before the start: `take` ops receive them (with no wait)
anywhere, race losers too, plain or completable (then completed, or held to the end): what a
loser received plainly goes back to the queue (unless pruning had dropped its iteration), a
completable one it had not completed stops being held, one it completed stays consumed. So
each ends in exactly one place (`Expected.consumed`)."""


async def start(handle: Any) -> None:
    for body in POOL:
        await handle.send("pool", body)
    await handle.send("start", None)


# -- checks -------------------------------------------------------------------------------------


def check(case: Case, status: WorkflowStatus, view: Any, what: str) -> View:
    """The outcome and rows the model says, each row exactly once; after a failure every
    undoable row undone exactly once, newest first."""
    count, undone_count, rows, undone = view
    expected = expect(case.ops)
    assert Counter(rows) == Counter(p for p, _ in expected.rows), f"{what}: each step once"
    assert count == len(rows), f"{what}: the state changed with the rows ({count})"
    assert undone_count == len(undone), f"{what}: handlers' state changes {undone_count}"
    if expected.failed:
        assert status.state is WorkflowState.FAILED, (what, status)
        assert status.error is not None, what
        assert status.error["type"] == expected.outcome.args[0], (what, status.error)
        assert "rollback_error" not in status.error, (what, status.error)
        newest_first = [p for p in reversed(rows) if p in expected.undoable]
        assert undone == newest_first, f"{what}: each handler once, newest first; rows {rows}"
    else:
        assert status.state is WorkflowState.COMPLETED, (what, status)
        assert status.output == expected.outcome, f"{what}: output {status.output}"
        assert undone == [], what
    return count, undone_count, rows, undone


async def check_messages(case: Case, handle: Any, what: str) -> None:
    """Every pool message is in exactly one place: consumed for good by a receive, or back in
    the queue; and the race messages left are the model's."""
    expected = expect(case.ops)
    got, left = await handle.drain()
    consumed = [body for path, body in got if path in expected.consumed]
    pool = [body for name, body in left if name == "pool"]
    assert Counter(consumed) + Counter(pool) == Counter(POOL), f"{what}: {got}, left {pool}"
    races = [tuple(m) for m in left if m[0] != "pool"]
    assert Counter(races) == Counter(expected.left), f"{what}: left {left}"


def total_rows(case: Case) -> int:
    expected = expect(case.ops)
    return len(expected.rows) + (len(expected.undoable) if expected.failed else 0)


async def settled(handle: Any, timeout: float = 30) -> WorkflowStatus:
    return await settle(handle, WorkflowState.COMPLETED, WorkflowState.FAILED, timeout=timeout)


# -- in-process runs ----------------------------------------------------------------------------

FAULT_SEEDS = list(range(1, 21))
OTHER_SEEDS = [22, 23, 24, 26, 27, 28, 30, 31]
KILL_SEEDS = [21, 25, 29, 32, 40, 47]
"""They hold every shape between them (`_check_coverage`); the SIGKILL ones kill in rollbacks
too. Sweeps of seeds 1-400 (faults, replays), 1-200 (cancel) and 1-120 (SIGKILL) pass."""


async def _run(case: Case, fault: tuple[FaultKind, int] | None) -> tuple[int, WorkflowStatus]:
    """Run the program once and check it; `fault` fails the n-th KV write counted from the
    start message's. Returns the writes after the start message and the final status."""
    store = FaultyStore(MemoryStore(), exclude=[REGISTRY_NAMESPACE])
    what = "clean" if fault is None else f"{fault[0]} at write {fault[1]}"
    async with Registry([flow_actor(case.ops)], kv=store).run() as client:
        handle = client.get_or_create("random", "k")
        await durably(handle, WorkflowState.SLEEPING)
        counting, faulty = store.counting["random/k"], store.faulty["random/k"]
        for body in POOL:
            await handle.send("pool", body)
        counting.reset()
        if fault is not None:
            faulty.arm(fault[0], after=fault[1])
        await handle.send("start", None)
        status = await settled(handle)
        writes = counting.stats.writes
        if fault is not None:
            assert faulty.fired_count(fault[0]) == 1, "the injected fault fired"
        faulty.enabled = False  # (for the reads and drain below)
        check(case, status, await handle.view(), what)
        await check_messages(case, handle, what)
    return writes, status


@pytest.mark.parametrize("seed", FAULT_SEEDS)
async def test_random_workflows_replay_to_the_same_outcome_after_a_fault(seed: int) -> None:
    case = make_case(seed)
    rng = random.Random(seed)
    writes, clean = await _run(case, None)
    for kind in (FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE):
        # 0 is the send; the last writes of a clean run may not all happen after a replay
        for at in rng.sample(range(1, max(2, writes * 3 // 4)), k=min(3, writes * 3 // 4 - 1)):
            _, status = await _run(case, (kind, at))
            assert (status.output, status.error) == (clean.output, clean.error), (kind, at)


async def _progress(handle: Any) -> int:
    count, undone_count, _, _ = await handle.view()
    return count + undone_count


@pytest.mark.parametrize("seed", OTHER_SEEDS + FAULT_SEEDS[:4])
async def test_no_step_runs_after_cancel_at_a_random_point(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel once `at` rows (forward or undone) are committed: the rows so far are a subset of
    the program's, each once, and no step or handler starts after `cancel()` returned, not even
    after a wake."""
    monkeypatch.setattr(sys.modules[__name__], "PAUSE_S", 0.01)
    case = make_case(seed)
    total = total_rows(case)
    at = random.Random(seed).randrange(0, total - 2)
    async with Registry([flow_actor(case.ops)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("random", "k")
        await durably(handle, WorkflowState.SLEEPING)
        await start(handle)
        with anyio.fail_after(30):
            while await _progress(handle) < at:
                await anyio.sleep(0.002)
        await handle.workflow.cancel()
        attempts = len(ATTEMPTS)
        count, undone_count, rows, undone = await handle.view()
        await handle.workflow.wake()
        await anyio.sleep(0.2)
        status = await handle.workflow.status()
        after = await handle.view()
    assert status.state is WorkflowState.CANCELLED
    assert ATTEMPTS[attempts:] == [], "steps ran after cancel() returned"
    assert after == (count, undone_count, rows, undone), "rows changed after cancel() returned"
    assert at <= len(rows) + len(undone) < total, "cancelled mid-way"
    expected = expect(case.ops)
    assert Counter(rows) <= Counter(p for p, _ in expected.rows) and count == len(rows), rows
    newest_first = [p for p in reversed(rows) if p in expected.undoable]
    assert undone == newest_first[: len(undone)], (rows, undone)
    assert undone_count == len(undone)


RECEIVES = ("take", "race")
FLAT = ("step", "flaky", "sleep", "fail")


def rerun_rows(case: Case, order: dict[str, int], target: str | None) -> list[str] | None:
    """The rows a `replay(target)` after the end must write again, each once: the steps it
    forgets (the entry at `target`, or the outermost loop holding it, and every entry created
    after it, by `order`, in every branch) and those under an op it forgets, which the re-run
    reaches again. None for a target the model does not cover: a receive (what it took is
    consumed for good), a race's own entry (a race re-run without the step before it sending
    the token again waits for it forever), and entries below the root but for those in root
    loops (at any depth) and in root joins of plain steps."""
    if target is None:
        return [p for p, _ in expect(case.ops).rows]
    root, _, rest = target.partition("/")
    label = root.removesuffix(".tok").removesuffix(".got")
    labels = [op[1] for op in case.ops]
    if label not in labels:
        return None
    index = labels.index(label)
    op = case.ops[index]
    if root == label and op[0] in RECEIVES:
        return None
    later = [p for p, _ in expect(case.ops[index:]).rows]
    if not rest or (op[0] == "loop" and rest.startswith("~")):
        return later  # a root loop is the outermost loop holding the target: all of it reruns
    flat = op[0] == "join" and all(o[0] in FLAT for o in op[2] + op[3])
    if not flat:
        return None
    # a step in a join branch: the join's steps created after it are forgotten too, in the
    # other branch as well, and every root op after the join
    inside = {p for p in later if p.startswith(f"{root}/")}
    return [p for p in later if p not in inside or order.get(p, len(order)) >= order[target]]


async def _ended(case: Case, handle: Any) -> dict[str, int]:
    """Run the program to its end and check it; its queue emptied, the order (by seq) of its
    history's entries."""
    await durably(handle, WorkflowState.SLEEPING)
    await start(handle)
    check(case, await settled(handle), await handle.view(), "first run")
    await check_messages(case, handle, "first run")
    return await _order(handle)


async def _order(handle: Any) -> dict[str, int]:
    history = await handle.workflow.history()
    assert history is not None
    return {e["location"]: i for i, e in enumerate(history["entries"])}  # sorted by seq


async def _replay(case: Case, handle: Any, target: str | None, rerun: list[str]) -> View:
    """`replay(target)` of the ended workflow: it must end as before, having run the steps of
    `rerun` once each and no other, and (a failed program) rolled back the re-run's steps only
    (the others' handlers already ran), newest first."""
    expected = expect(case.ops)
    what = f"replay({target!r})"
    before = await handle.view()
    await handle.workflow.replay(target)
    if target is None:
        await start(handle)
    status = await settled(handle)
    count, undone_count, rows, undone = await handle.view()
    await handle.drain()  # the re-run's takes found the pool empty, or not
    if expected.failed:
        assert status.state is WorkflowState.FAILED, (what, status)
        assert status.error is not None, what
        assert status.error["type"] == expected.outcome.args[0], (what, status.error)
    else:
        assert status.state is WorkflowState.COMPLETED, (what, status)
        assert status.output == expected.outcome, f"{what}: output {status.output}"
    new = rows[len(before[2]) :]
    assert rows[: len(before[2])] == before[2], what
    assert Counter(new) == Counter(rerun), f"{what}: the forgotten steps once, no other: {new}"
    assert count == len(rows) and undone_count == len(undone), what
    if expected.failed:
        newest_first = [p for p in reversed(new) if p in expected.undoable]
        assert undone == before[3] + newest_first, f"{what}: the re-run's handlers once"
    else:
        assert undone == [], what
    return count, undone_count, rows, undone


@pytest.mark.parametrize("seed", OTHER_SEEDS + FAULT_SEEDS[4:8])
async def test_replay_after_the_end_reruns_exactly_the_forgotten_steps(seed: int) -> None:
    """After the workflow ended (and its queue is emptied), `replay(None)` (then the start
    message again) runs every step once more; `replay(location)` reruns the steps it forgot
    and those under an op it forgot (`rerun_rows`), each once, and no other."""
    case = make_case(seed)
    rng = random.Random(seed)
    async with Registry([flow_actor(case.ops)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("random", "k")
        order = await _ended(case, handle)
        targets: list[str | None] = [None]
        targets += sorted(t for t in order if rerun_rows(case, order, t) is not None)
        for target in rng.sample(targets, k=min(2, len(targets))):
            rerun = rerun_rows(case, order, target)
            assert rerun is not None
            await _replay(case, handle, target, rerun)
            order = await _order(handle)


# -- SIGKILL ------------------------------------------------------------------------------------


async def _child(seed: int, url: str, first: bool) -> None:
    case = make_case(seed)
    async with Registry([flow_actor(case.ops)], kv=url).run() as client:
        handle = client.get_or_create("random", "k")
        if first:
            await start(handle)
        else:
            await handle.workflow.wake()
        await anyio.sleep_forever()


def _snapshot(store: KvStore) -> tuple[int, str | None]:
    """Rows committed so far (forward and undone) and the recorded workflow state, read from a
    read-only snapshot (no takeover, never a write)."""
    try:
        with open_database(store.namespace("random/k"), read_only=True) as db:
            rows = db.execute("SELECT (SELECT count(*) FROM log) + (SELECT count(*) FROM undone)")
            count = rows.fetchall()[0][0]
            state = db.execute("SELECT value FROM _pagekv_workflow WHERE key = 'state'")
            found = state.fetchall()
            return count, found[0][0] if found else None
    except apsw.SQLError:
        return 0, None


@pytest.mark.parametrize("seed", KILL_SEEDS)
async def test_sigkill_at_random_points_then_another_process_finishes(
    seed: int, tmp_path: Path
) -> None:
    """A child process runs the program (each step and handler takes 20 ms) and is SIGKILLed
    once a random number of rows (forward or undone) is committed, often inside a transaction;
    a new child takes over and is killed later on, up to 3 times; then a registry here
    finishes the workflow, with the model's outcome, rows and messages, each once."""
    case = make_case(seed)
    total = total_rows(case)
    rng = random.Random(seed)
    kills = sorted(rng.sample(range(1, total - 3), k=min(rng.randint(1, 3), total - 4)))
    url = f"file://{tmp_path}/store"
    store = open_kv(url)
    seen = []
    try:
        for n, target in enumerate(kills):
            child = subprocess.Popen(
                [sys.executable, __file__, str(seed), url, "first" if n == 0 else "again"],
                cwd=Path(__file__).parent,
            )
            try:
                with anyio.fail_after(60):
                    while (await anyio.to_thread.run_sync(_snapshot, store))[0] < target:
                        assert child.poll() is None, "the child died by itself"
                        await anyio.sleep(0.005)
            finally:
                child.send_signal(signal.SIGKILL)
                code = await anyio.to_thread.run_sync(child.wait)
            assert code == -signal.SIGKILL, code
            seen.append(await anyio.to_thread.run_sync(_snapshot, store))
    finally:
        store.close()
    assert all(state in ("running", "sleeping", "rolling_back") for _, state in seen), seen
    assert [rows for rows, _ in seen] == sorted(rows for rows, _ in seen), seen
    async with Registry([flow_actor(case.ops)], kv=url).run() as client:
        handle = client.get("random", "k")
        what = f"killed at {kills}: {seen}"
        check(case, await settled(handle, timeout=60), await handle.view(), what)
        await check_messages(case, handle, what)


# -- engine bugs the fuzzer found, each as its shrunk program --------------------------------------
# (The seeds named are `make_case` seeds that hit the bug in the tests above, shrunk here; each
# docstring says what the engine did before its fix.)

_NO_FLAGS = (False, False)


async def test_a_message_a_kept_race_loser_gave_back_is_not_given_back_twice() -> None:
    """Seeds 608, 911 (shrunk). An inner race in the outer race's loser ends: its loser is
    kept (it completed a step with a rollback handler), and what it had received, pool message
    p0, goes back to the queue (its entry marked `returned`). The outer winner then receives p0.
    When the outer race ended, its loser's history held that same kept entry, and
    `return_messages` put p0 back into the queue again, `returned` or not: p0 was delivered
    twice (got by the outer winner, and left in the queue)."""
    inner = ("race", "op0", [], [("take", "op0", True, "plain")], "sleep", _NO_FLAGS)
    outer = ("race", "op1", [("take", "op0", False, "plain")], [inner], "sleep", _NO_FLAGS)
    await _run(Case(0, [("checkpoint", "cp"), outer], False), None)


async def test_what_a_race_loser_received_in_a_pruned_iteration_stays_consumed() -> None:
    """Seeds 129, 220, 363 (shrunk). A race's loser runs a loop (history_size=1) receiving a
    pool message per iteration; pruning deletes the history of the old iterations, their
    receives with it, so when the loser loses only what the iterations still recorded
    received goes back to the queue (p1, p2). The fuzzer reported p0 lost; docs/workflows.md
    now says such a message stays consumed, "as a finished iteration's" (`Expected.consumed`)."""
    loop = ("loop", "op0", 3, 1, 1, [("take", "op0", False, "plain")])
    await _run(Case(0, [("race", "op0", [], [loop], "sleep", _NO_FLAGS)], False), None)


async def test_a_race_ends_in_one_commit_with_what_its_losers_give_back() -> None:
    """Seeds 58, 151, 231 (shrunk), with a KV write failing at any point. A race that ends
    deletes its loser's history and marks itself completed in memory (pending); it then gave the
    loser's messages back in a transaction of its own (`return_messages`). A join branch
    committing in between (here the other race's receive) wrote the pending history, completed
    race and deleted loser, without the messages; when the race's own commit then failed, the
    loser's token was in no history and not in the queue: the receive after the race timed
    out."""
    race = ("race", "op0", [], [], "sleep", _NO_FLAGS)
    case = Case(0, [("join", "op0", [race], [race])], False)
    writes, _ = await _run(case, None)
    for kind in (FaultKind.FAIL_BEFORE, FaultKind.APPLY_THEN_RAISE):
        for at in range(1, writes):
            await _run(case, (kind, at))


async def test_two_branches_never_receive_the_same_completable_message() -> None:
    """Seeds 18, 37 (clean) and 237 (after a fault), shrunk. Branch a receives p0 completable
    (it stays queued, held) while branch b's receive, woken from a sleep, is already under way:
    `Runner._take` built its `id NOT IN held` filter before awaiting the database, and `_held`
    learnt of p0 only after a's receive committed. So b took p0 too, and both completed it: one
    message delivered twice (a plain receive in b deleted it under a's hold the same way)."""
    a = [("take", "op0", False, "complete")]
    b = [("sleep", "op0"), ("take", "op1", False, "complete")]
    await _run(Case(0, [("join", "op0", a, b)], False), None)


async def test_replay_in_a_join_branch_reruns_what_it_forgot_in_the_other_one() -> None:
    """Seeds 110, 144. `replay("op0/a/op0")` forgets that step and every entry created after it,
    here branch b's sleep and step; it reopened branch a only: b stayed settled, so b's step
    never ran again and the history no longer recorded the step that wrote b's row (a rollback
    could never undo it), while the join still reported b's output."""
    ops = [("join", "op0", [("step", "op0", False)], [("sleep", "op0"), ("step", "op1", False)])]
    case = Case(0, ops, False)
    async with Registry([flow_actor(ops)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("random", "k")
        order = await _ended(case, handle)
        assert order["op0/a/op0"] < order["op0/b/op0"] < order["op0/b/op1"]
        await handle.workflow.replay("op0/a/op0")
        status = await settled(handle)
        _, _, rows, _ = await handle.view()
        recorded = await _order(handle)
    assert status.output == expect(ops).outcome
    assert set(rows) <= set(recorded), f"ran, and not in the history: {set(rows) - set(recorded)}"
    assert Counter(rows) == {"op0/a/op0": 2, "op0/b/op1": 2}, "each forgotten step once more"


async def test_replay_in_a_nested_loop_reruns_the_iteration_holding_it() -> None:
    """Seeds 24, 38, 47, 62, 115 (with targets in a nested loop). `replay` of a step in
    iteration 1 of the inner loop of the outer loop's iteration 0 rewound to the innermost loop
    (`_target`): it forgot that inner loop and every later entry, outer iteration 1 included.
    But the outer loop's own entry, older, still recorded iteration 1 (completed), so the re-run
    ran outer iteration 1 only: the replayed step never ran again and the history lost outer
    iteration 0. It now rewinds to the outermost loop: all of it runs again."""
    ops = [("loop", "op0", 2, 3, 1, [("loop", "op0", 2, 3, 1, [("step", "op0", False)])])]
    target = "op0/~0/op0/~1/op0"
    async with Registry([flow_actor(ops)], kv=MemoryStore()).run() as client:
        handle = client.get_or_create("random", "k")
        await _ended(Case(0, ops, False), handle)
        await handle.workflow.replay(target)
        status = await settled(handle)
        _, _, rows, _ = await handle.view()
        recorded = await _order(handle)
    assert status.output == expect(ops).outcome
    assert rows.count(target) == 2, f"the replayed step ran again: {rows}"
    assert set(rows) <= set(recorded), f"ran, and not in the history: {set(rows) - set(recorded)}"
    assert Counter(rows) == {p: 2 for p, _ in expect(ops).rows}, "the whole outer loop reran"


def _check_coverage() -> None:
    """The fixed seeds hold every shape the checks are for (else a change of the generator
    would quietly stop testing some of them): checked as the file is imported."""
    every = set().union(*(shape(make_case(s).ops) for s in FAULT_SEEDS + OTHER_SEEDS + KILL_SEEDS))
    wanted = {"race-sleep", "race-fail", "kept-loser", "loop1/1", "undoable", "checkpoint"}
    wanted |= {"take-plain", "take-complete", "take-hold", "pruned"}
    assert wanted <= every, f"the seeds miss {wanted - every}"
    killed = set().union(*(shape(make_case(seed).ops) for seed in KILL_SEEDS))
    assert {"race", "checkpoint", "loop"} <= killed, f"the SIGKILL seeds hold only {killed}"


_check_coverage()

if __name__ == "__main__":  # the child process of the SIGKILL test
    PAUSE_S = 0.02
    anyio.run(_child, int(sys.argv[1]), sys.argv[2], sys.argv[3] == "first")
