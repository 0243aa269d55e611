"""`wf`: the replayable primitives a workflow is written with.

Every primitive is an entry at a location (scope + name). On each execution the workflow runs from
the top: a primitive whose entry is recorded returns the recorded outcome, the first one that is
not executes for real. Replay checks the kind and the name at every location, refuses a name used
twice in one scope, and refuses to make progress past recorded entries that the code skipped
(`HistoryDiverged`, before any side effect); `removed` is how code retires an operation.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

import anyio
import cbor2

from pagekv.actor.errors import STORAGE_ERRORS, ActorStopped, ActorTakenOver, UserError
from pagekv.actor.queue import Message
from pagekv.actor.workflow.errors import (
    Critical,
    EntryInProgress,
    HistoryDiverged,
    JoinError,
    RaceError,
    RollbackCheckpointError,
    StepCritical,
    StepError,
    StepExhausted,
    StepTimeout,
    WorkflowFormatError,
)
from pagekv.actor.workflow.history import (
    Entry,
    Status,
    child,
    iteration_index,
    iteration_scope,
    subtree_range,
)
from pagekv.actor.workflow.hosts import ScopeHost
from pagekv.actor.workflow.payloads import (
    PENDING_BRANCH,
    Branch,
    BranchStatus,
    Iteration,
    Join,
    Kind,
    LoopProgress,
    Messages,
    Payload,
    Race,
    Removed,
    RollbackCheckpoint,
    Sleep,
    StepDone,
    StepFailed,
    StepPending,
    StepRetrying,
    VersionCheck,
)
from pagekv.actor.workflow.step import (
    FailureKind,
    RollbackFn,
    StepContext,
    StepFailure,
    StepResult,
)

T = TypeVar("T")
StepFn = Callable[[StepContext], Awaitable[Any]]
BranchFn = Callable[["WorkflowContext"], Awaitable[Any]]
_FAILURES: dict[str, type[StepError]] = {
    "critical": StepCritical,
    "timeout": StepTimeout,
    "exhausted": StepExhausted,
}


class _TimedOut(Exception):
    """A step attempt ran past its timeout (and was cancelled)."""


class RollbackStop(BaseException):
    """Rollback replay reached the first operation without a recorded outcome; internal.

    A BaseException so that workflow code catching `Exception` cannot swallow it.
    """


INFRASTRUCTURE = (ActorTakenOver, ActorStopped, *STORAGE_ERRORS)
"""Storage failures: never a step's or the workflow's failure. They end the run handler, which
tears the instance down; the next wake replays from what was committed."""

CONTROL = (HistoryDiverged, EntryInProgress, RollbackCheckpointError, RollbackStop)
"""Errors that end an execution instead of being a branch's or a step's failure, by priority."""


@dataclass(frozen=True)
class RaceResult:
    winner: str
    value: Any


def unwrap(group: BaseExceptionGroup) -> BaseException:
    """The error a task group stands for: a storage failure if any branch hit one (so it ends
    the run handler, not the workflow), else its only error, else the group itself."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        error = stack.pop()
        if isinstance(error, BaseExceptionGroup):
            stack.extend(error.exceptions)
        else:
            leaves.append(error)
    storage = [e for e in leaves if isinstance(e, INFRASTRUCTURE)]
    if storage:
        return storage[0]
    return leaves[0] if len(leaves) == 1 else group


ErrorClasses = type[Exception] | tuple[type[Exception], ...]


def _error_classes(classes: ErrorClasses) -> tuple[type[Exception], ...]:
    """`non_retryable` of a step as a tuple, refused (TypeError) unless it holds only
    exception classes."""
    found = classes if isinstance(classes, tuple) else (classes,)
    for kind in found:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise TypeError(
                f"non_retryable must be an exception class or a tuple of them, got {kind!r}"
            )
    return found


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def check_encodable(value: Any, what: str) -> None:
    try:
        cbor2.dumps(value)
    except (cbor2.CBOREncodeError, TypeError, ValueError) as e:
        raise TypeError(f"{what} must be CBOR-serialisable: {e}") from e


class WorkflowContext:
    """One scope of a workflow: the root, a loop iteration, or a join/race branch.

    At most one primitive may be pending per context at a time (`EntryInProgress`); run work
    concurrently through `join` and `race`, whose branches get contexts of their own.

    Over ~20 methods: the primitives are what user code sees as one `wf` object, and each
    primitive's named steps share this scope's bookkeeping (`_op`, `_recorded`, `_fresh`).
    """

    def __init__(self, runner: ScopeHost, scope: str) -> None:
        self._runner = runner
        self._scope = scope
        self._busy = False
        self._used: set[str] = set()
        self._open_loop: Loop | None = None
        self.queue = WorkflowQueue(self)

    @property
    def actor_id(self) -> str:
        return self._runner.instance.actor_id

    # -- bookkeeping -------------------------------------------------------------------------

    @contextmanager
    def _op(self, name: str) -> Iterator[str]:
        if self._busy:
            raise EntryInProgress(
                f"{name!r} started while another operation of this workflow context is pending"
            )
        self._close_loop()
        if name in self._used:
            raise HistoryDiverged(f"the name {name!r} is used twice in one scope")
        self._used.add(name)
        self._busy = True
        try:
            yield child(self._scope, self._runner.history.name_index(name))
        finally:
            self._busy = False

    def _recorded(self, location: str, name: str, kind: Kind) -> Entry | None:
        entry = self._runner.history.entries.get(location)
        if entry is None:
            return None
        if entry.kind is not kind:
            raise HistoryDiverged(
                f"the code runs {kind.value} {name!r} where the history recorded a "
                f"{entry.kind.value}; use wf.removed({name!r}, {entry.kind.value!r}) to retire it"
            )
        self._runner.history.unvisited[self._scope].discard(location)
        return entry

    def _fresh(self, location: str, name: str, kind: Kind, data: Payload) -> Entry:
        """A new entry; refused while recorded entries of this scope were skipped."""
        self._refuse_skipped(f"{kind.value} {name!r}")
        if self._runner.rollback_mode:
            raise RollbackStop
        return self._runner.history.new_entry(location, name, kind, data)

    def _refuse_skipped(self, what: str) -> None:
        skipped = self._runner.history.unvisited[self._scope]
        if skipped:
            names = sorted(self._runner.history.entries[loc].name for loc in skipped)
            raise HistoryDiverged(
                f"{what} is new, but the history has operations the code no longer reaches in "
                f"this scope: {names}; retire them with wf.removed(name, kind)"
            )

    def _close_loop(self) -> None:
        """A primitive on this context while one of its loops is open means the loop was left."""
        if self._open_loop is not None:
            loop, self._open_loop = self._open_loop, None
            loop.leave()

    def _finish(self) -> None:
        """The scope's code has ended: close its open loop, and every entry must be visited."""
        self._close_loop()
        self._refuse_skipped("the end of the scope")

    # -- primitives --------------------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: StepFn,
        *,
        max_retries: int = 3,
        backoff: float = 0.1,
        backoff_max: float = 30.0,
        timeout: float | None = 30.0,
        retry_on_timeout: bool = False,
        rollback: RollbackFn | None = None,
        non_retryable: ErrorClasses = (),
    ) -> Any:
        """Run `fn(step_ctx)` once, durably: its result, state and SQL changes commit together.

        A failed attempt is rolled back and retried up to `max_retries` times, each
        `backoff * 2**(attempt-1)` seconds after it failed (at most `backoff_max`;
        deterministic). A failure a retry would only repeat fails the step at once, as
        `critical` (`StepCritical`): raising `Critical` or a `UserError`, or an exception of
        a class in `non_retryable` (a class or a tuple of classes, as `except` takes them:
        `non_retryable=(ValueError, KeyError)`). A timeout fails it unless `retry_on_timeout`.
        A failure of the store is never the step's: it is not caught by any of these.
        """
        result = await self.try_step(
            name,
            fn,
            catch=(),
            max_retries=max_retries,
            backoff=backoff,
            backoff_max=backoff_max,
            timeout=timeout,
            retry_on_timeout=retry_on_timeout,
            rollback=rollback,
            non_retryable=non_retryable,
        )
        return result.value

    async def try_step(
        self,
        name: str,
        fn: StepFn,
        *,
        catch: Sequence[FailureKind] = ("critical", "timeout", "exhausted"),
        max_retries: int = 3,
        backoff: float = 0.1,
        backoff_max: float = 30.0,
        timeout: float | None = 30.0,
        retry_on_timeout: bool = False,
        rollback: RollbackFn | None = None,
        non_retryable: ErrorClasses = (),
    ) -> StepResult:
        """`step`, returning a `StepResult` for the failure kinds in `catch` instead of raising."""
        result = await self._step(
            name,
            fn,
            max_retries,
            backoff,
            backoff_max,
            timeout,
            retry_on_timeout,
            rollback,
            _error_classes(non_retryable),
        )
        if result.failure is not None and result.failure.kind not in catch:
            failure = result.failure
            raise _FAILURES[failure.kind](failure.step, failure.attempts, failure.error)
        return result

    async def _step(
        self,
        name: str,
        fn: StepFn,
        max_retries: int,
        backoff: float,
        backoff_max: float,
        timeout: float | None,
        retry_on_timeout: bool,
        rollback: RollbackFn | None,
        non_retryable: tuple[type[Exception], ...],
    ) -> StepResult:
        runner = self._runner
        with self._op(name) as location:
            if rollback is not None and not runner.checkpointed:
                raise RollbackCheckpointError(
                    f"step {name!r} has a rollback handler but runs before any "
                    "wf.rollback_checkpoint(...)"
                )
            entry = self._recorded(location, name, Kind.STEP)
            if entry is None:
                entry = self._fresh(location, name, Kind.STEP, StepPending())
            match entry.status:
                case Status.COMPLETED:
                    if rollback is not None:
                        runner.register_rollback(entry, rollback)
                    return StepResult(True, entry.payload(StepDone).output)
                case Status.EXHAUSTED:
                    return _failed(entry)
                case Status.PENDING | Status.RUNNING | Status.FAILED:
                    if runner.rollback_mode:
                        raise RollbackStop
                case _:
                    assert_never(entry.status)
            while True:
                if entry.status is Status.FAILED:
                    await runner.wait(entry.payload(StepRetrying).retry_at)
                settled = await self._attempt(
                    entry,
                    fn,
                    timeout,
                    retry_on_timeout,
                    max_retries,
                    rollback is not None,
                    non_retryable,
                )
                if settled.status is Status.COMPLETED:
                    if rollback is not None:
                        runner.register_rollback(settled, rollback)
                    return StepResult(True, settled.payload(StepDone).output)
                if settled.status is Status.EXHAUSTED:
                    return _failed(settled)
                delay = min(backoff_max, backoff * 2 ** (settled.attempts - 1))
                settled.data = StepRetrying(time.time() + delay)
                entry = settled

    async def _attempt(
        self,
        entry: Entry,
        fn: StepFn,
        timeout: float | None,
        retry_on_timeout: bool,
        max_retries: int,
        undoable: bool,
        non_retryable: tuple[type[Exception], ...],
    ) -> Entry:
        """One attempt in one transaction; returns the entry as recorded afterwards. A step
        with a rollback handler records so (`undoable`): loop pruning keeps its history."""
        runner = self._runner
        attempt = entry.attempts + 1
        step_ctx = StepContext(runner.instance.ctx, entry.name, attempt)
        started = time.time()
        kind: FailureKind | None = None
        critical: tuple[type[Exception], ...] = (Critical, UserError, *non_retryable)
        try:
            async with runner.transaction() as staged:
                with anyio.move_on_after(timeout) as deadline:
                    value = await fn(step_ctx)
                if deadline.cancelled_caught:
                    raise _TimedOut(f"timed out after {timeout}s")
                try:
                    check_encodable(value, f"the result of step {entry.name!r}")
                except TypeError as e:
                    raise Critical(str(e)) from e
                data = StepDone(value, undoable)
                staged.append(
                    entry.settled(data=data, attempts=attempt, last_attempt=started, error=None)
                )
            return staged[0]
        except INFRASTRUCTURE:
            raise
        except _TimedOut as e:
            error: BaseException = e
            kind = None if retry_on_timeout else "timeout"
        except critical as e:
            error, kind = e, "critical"
        except Exception as e:
            error = e
        finally:
            step_ctx.close()
        entry.attempts, entry.last_attempt = attempt, started
        entry.error = describe_error(error)
        if kind is None and attempt <= max_retries:
            entry.status = Status.FAILED
        else:
            entry.status = Status.EXHAUSTED
            entry.data = StepFailed(kind or "exhausted")
        runner.history.put(entry)
        return entry

    async def sleep(self, name: str, seconds: float) -> None:
        """Sleep durably; the actor may sleep meanwhile and is woken on time."""
        await self._sleep(name, lambda: time.time() + seconds)

    async def sleep_until(self, name: str, timestamp: float) -> None:
        await self._sleep(name, lambda: timestamp)

    async def _sleep(self, name: str, deadline: Callable[[], float]) -> None:
        runner = self._runner
        with self._op(name) as location:
            entry = self._recorded(location, name, Kind.SLEEP)
            if entry is not None and entry.status is Status.COMPLETED:
                return
            if entry is None:
                entry = self._fresh(location, name, Kind.SLEEP, Sleep(deadline()))
                runner.history.put(entry)
            elif runner.rollback_mode:
                raise RollbackStop
            await runner.wait(entry.payload(Sleep).deadline)
            entry.status, entry.completed = Status.COMPLETED, time.time()
            runner.history.put(entry)

    def loop(
        self, name: str, *, state: Any = None, history_size: int = 20, prune_every: int = 20
    ) -> Loop:
        """`async for it in wf.loop(name, state=...)`: a durable loop.

        Each iteration gets a context `it` of its own (`it.step(...)`, ...) with `it.index` and
        `it.state`; set `it.state` to carry state into the next iteration, `break` to leave.
        Only the last `history_size` iterations keep their history (pruned every
        `prune_every`), so a loop may run forever in bounded space. A replay resumes at the
        recorded iteration (a completed loop replays its last one), so carry data from one
        iteration to the next in `it.state`, not in local variables.
        """
        if history_size < 1 or prune_every < 1:
            raise ValueError("history_size and prune_every must be >= 1")
        return Loop(self, name, state, history_size, prune_every)

    async def join(self, name: str, branches: Mapping[str, BranchFn]) -> dict[str, Any]:
        """Run every branch concurrently, each in a context of its own; all their outputs.

        Raises `JoinError` naming the failed branches once all have settled.
        """
        runner = self._runner
        with self._op(name) as location:
            entry = self._recorded(location, name, Kind.JOIN)
            if entry is None:
                pending = dict.fromkeys(branches, PENDING_BRANCH)
                entry = self._fresh(location, name, Kind.JOIN, Join(pending))
                runner.history.put(entry)
                await runner.flush()
            statuses = entry.payload(Join).branches
            if runner.rollback_mode:
                await self._replay_branches(location, branches)
                if entry.status is not Status.COMPLETED:
                    raise RollbackStop
                return _joined(name, statuses, branches)
            control: list[BaseException] = []

            async def run(branch: str, fn: BranchFn) -> None:
                status = statuses.setdefault(branch, PENDING_BRANCH)
                if status.status in (BranchStatus.COMPLETED, BranchStatus.FAILED):
                    return
                outcome = await self._branch(location, branch, fn, control)
                if outcome is not None:
                    statuses[branch] = outcome
                    runner.history.put(entry)

            try:
                async with anyio.create_task_group() as tg:
                    for branch, fn in branches.items():
                        tg.start_soon(run, branch, fn)
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
            _raise_control(control)
            entry.status, entry.completed = Status.COMPLETED, time.time()
            runner.history.put(entry)
            await runner.flush()
            return _joined(name, statuses, branches)

    async def race(
        self, name: str, branches: Mapping[str, BranchFn] | Sequence[BranchFn]
    ) -> RaceResult:
        """Run the branches concurrently; the first to succeed wins and the others are
        cancelled. Raises `RaceError` if all fail.

        A loser's history is deleted, and what it had received given back (`return_messages`),
        unless it completed a step with a rollback handler: then its history is kept, so that a
        failure of the workflow rolls that step back too."""
        named = _named_branches(branches)
        with self._op(name) as location:
            entry = self._recorded(location, name, Kind.RACE)
            if entry is None:
                entry = await self._start_race(location, name, named)
            else:
                if self._runner.rollback_mode:
                    await self._replay_race(location, entry, named)
                if entry.status is Status.COMPLETED:
                    return _won(entry.payload(Race))
            race = entry.payload(Race)
            winner = await self._first_to_complete(location, named, race.branches)
            if winner is None:
                self._runner.history.put(entry)
                await self._runner.flush()
                raise RaceError(name, {b: s.error or "cancelled" for b, s in race.branches.items()})
            await self._settle_race(location, entry, named, winner)
            return _won(race)

    async def _start_race(self, location: str, name: str, named: Mapping[str, BranchFn]) -> Entry:
        """The race's entry, every branch pending, committed before any branch runs."""
        pending = dict.fromkeys(named, PENDING_BRANCH)
        entry = self._fresh(location, name, Kind.RACE, Race(None, pending))
        self._runner.history.put(entry)
        await self._runner.flush()
        return entry

    async def _replay_race(
        self, location: str, entry: Entry, named: Mapping[str, BranchFn]
    ) -> None:
        """Rollback mode: replay the branches that may hold steps to roll back (every branch of
        a race that did not settle; of a settled one, the winner and the losers whose history
        was kept). A race that did not settle is where the replay stops (`RollbackStop`)."""
        recorded = entry.payload(Race)
        settled = entry.status is Status.COMPLETED
        await self._replay_branches(
            location,
            {
                b: f
                for b, f in named.items()
                if not settled or b == recorded.winner or recorded.branches[b].kept
            },
        )
        if not settled:
            raise RollbackStop

    async def _first_to_complete(
        self, location: str, named: Mapping[str, BranchFn], statuses: dict[str, Branch]
    ) -> str | None:
        """Run the branches concurrently, each one's outcome recorded in `statuses`; the first to
        complete cancels the others. The winner, or None if no branch completed."""
        control: list[BaseException] = []
        won: list[str] = []

        async def run(branch: str, fn: BranchFn, scope: anyio.CancelScope) -> None:
            outcome = await self._branch(location, branch, fn, control)
            if outcome is None:
                return
            statuses[branch] = outcome
            if outcome.status is BranchStatus.COMPLETED and not won:
                won.append(branch)
                scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                for branch, fn in named.items():
                    tg.start_soon(run, branch, fn, tg.cancel_scope)
        except BaseExceptionGroup as group:
            raise unwrap(group) from None
        _raise_control(control)
        return won[0] if won else None

    async def _settle_race(
        self, location: str, entry: Entry, named: Mapping[str, BranchFn], winner: str
    ) -> None:
        """Record the race as `winner` won it: each loser cancelled, its history deleted or kept
        (see `race`), and what the deleted history had received given back."""
        history = self._runner.history
        race = entry.payload(Race)
        gone: list[Entry] = []
        kept: list[Entry] = []
        for branch in named:
            if branch != winner:
                low, high = subtree_range(child(location, history.name_index(branch)))
                if history.undoable_in(low, high):
                    kept += history.within(low, high)
                    race.branches[branch] = Branch(BranchStatus.CANCELLED, kept=True)
                else:
                    gone += history.delete_range(low, high)
                    race.branches[branch] = Branch(BranchStatus.CANCELLED)
        race.winner = winner
        entry.status, entry.completed = Status.COMPLETED, time.time()
        history.put(entry)
        await self._runner.return_messages(gone, kept)

    async def _replay_branches(self, location: str, branches: Mapping[str, BranchFn]) -> None:
        """Rollback mode: replay `branches` (settled ones too) so that their completed steps
        register their handlers; each ends at its first operation without an outcome."""
        control: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:
                for branch, fn in branches.items():
                    tg.start_soon(self._branch, location, branch, fn, control)
        except BaseExceptionGroup as group:
            raise unwrap(group) from None

    async def _branch(
        self, location: str, branch: str, fn: BranchFn, control: list[BaseException]
    ) -> Branch | None:
        """Run one branch; its outcome, or None if it hit a control error."""
        scope = child(location, self._runner.history.name_index(branch))
        context = WorkflowContext(self._runner, scope)
        try:
            value = await fn(context)
            context._finish()
            check_encodable(value, f"the output of branch {branch!r}")
        except CONTROL as e:
            control.append(e)
            return None
        except INFRASTRUCTURE:
            raise
        except Exception as e:
            return Branch(BranchStatus.FAILED, error=describe_error(e))
        return Branch(BranchStatus.COMPLETED, output=value)

    async def rollback_checkpoint(self, name: str) -> None:
        """From here on, a failure of the workflow runs the rollback handlers of the steps that
        completed, newest first."""
        with self._op(name) as location:
            if self._recorded(location, name, Kind.ROLLBACK_CHECKPOINT) is None:
                entry = self._fresh(location, name, Kind.ROLLBACK_CHECKPOINT, RollbackCheckpoint())
                entry.status, entry.completed = Status.COMPLETED, time.time()
                self._runner.history.put(entry)
            self._runner.checkpointed = True

    async def removed(self, name: str, kind: str) -> None:
        """Retire an operation the code no longer runs: accepts its recorded entry of `kind`."""
        original = Kind(kind)
        with self._op(name) as location:
            entry = self._runner.history.entries.get(location)
            if entry is not None and entry.kind not in (original, Kind.REMOVED):
                raise HistoryDiverged(
                    f"removed({name!r}, {kind!r}) but the history has a {entry.kind.value} there"
                )
            if entry is not None:
                self._runner.history.unvisited[self._scope].discard(location)
                return
            if self._runner.rollback_mode:
                return
            entry = self._runner.history.new_entry(location, name, Kind.REMOVED, Removed(kind))
            entry.status, entry.completed = Status.COMPLETED, time.time()
            self._runner.history.put(entry)

    async def get_version(self, name: str, latest: int) -> int:
        """The code version this execution follows at this point: `latest` for a run that had
        not got here before the change, 1 for one that already ran past it with older code."""
        if latest < 1:
            raise ValueError(f"latest must be >= 1, got {latest}")
        runner = self._runner
        with self._op(name) as location:
            entry = self._recorded(location, name, Kind.VERSION_CHECK)
            if entry is not None:
                return int(entry.payload(VersionCheck).resolved)
            if runner.rollback_mode:
                raise RollbackStop
            resolved = 1 if runner.history.unvisited[self._scope] else latest
            data = VersionCheck(resolved, latest)
            entry = runner.history.new_entry(location, name, Kind.VERSION_CHECK, data)
            entry.status, entry.completed = Status.COMPLETED, time.time()
            runner.history.put(entry)
            await runner.flush()
            return resolved


class LoopIteration(WorkflowContext):
    """The context of one loop iteration."""

    def __init__(self, runner: ScopeHost, scope: str, index: int, state: Any) -> None:
        super().__init__(runner, scope)
        self.index = index
        self.state = state


class Loop:
    """The async iterator behind `wf.loop`; see there.

    The loop entry records the current iteration and the state it started with. A replay resumes
    at the current iteration (a completed loop replays its last one), so the code after the loop
    sees the same local variables as the first time. A rollback replay runs every iteration that
    holds a step with a rollback handler instead, so that each registers its handler: such an
    iteration records the state it started with in an `iteration` entry as it ends, and pruning
    keeps it.
    """

    def __init__(
        self, parent: WorkflowContext, name: str, state: Any, history_size: int, prune_every: int
    ) -> None:
        self._parent = parent
        self._name = name
        self._initial = state
        self._history_size = history_size
        self._prune_every = prune_every
        self._entry: Entry | None = None
        self._current: LoopIteration | None = None
        self._left = False
        self._replaying: list[tuple[int, Any]] = []
        """Rollback mode: the iterations still to replay, with their starting states."""

    def __aiter__(self) -> Loop:
        return self

    async def __anext__(self) -> LoopIteration:
        parent, runner = self._parent, self._parent._runner
        if self._left:
            raise HistoryDiverged(
                f"loop {self._name!r} was already left; inside a loop body use the iteration "
                "context (`it.step(...)`), not the enclosing one"
            )
        if self._entry is None:
            with parent._op(self._name) as location:
                entry = parent._recorded(location, self._name, Kind.LOOP)
                if entry is None:
                    check_encodable(self._initial, f"the state of loop {self._name!r}")
                    data = LoopProgress(_recorded_copy(self._initial))
                    entry = parent._fresh(location, self._name, Kind.LOOP, data)
                    runner.history.put(entry)
            self._entry = entry
            parent._open_loop = self
            if runner.rollback_mode:
                self._replaying = self._kept_iterations()
                return self._iteration(*self._replaying.pop(0))
            progress = entry.payload(LoopProgress)
            return self._iteration(progress.iteration, progress.state)
        entry, current = self._entry, self._current
        assert current is not None
        current._finish()
        if runner.rollback_mode:
            if not self._replaying:
                raise RollbackStop
            return self._iteration(*self._replaying.pop(0))
        if entry.status is Status.COMPLETED:
            raise HistoryDiverged(
                f"loop {self._name!r} ended at iteration {current.index} in the history, but "
                "the code continued it"
            )
        check_encodable(current.state, f"the state of loop {self._name!r}")
        finished = iteration_scope(entry.location, current.index)
        progress = entry.payload(LoopProgress)
        if runner.history.undoable_in(*subtree_range(finished)):
            started = Iteration(progress.state)
            start = runner.history.new_entry(finished, self._name, Kind.ITERATION, started)
            start.status, start.completed = Status.COMPLETED, time.time()
            runner.history.put(start)
        index = current.index + 1
        progress.state, progress.iteration = _recorded_copy(current.state), index
        keep_from = index - self._history_size
        if keep_from - progress.pruned >= self._prune_every:
            self._prune(progress.pruned, keep_from)
            progress.pruned = keep_from
        runner.history.put(entry)
        return self._iteration(index, progress.state)

    def _kept_iterations(self) -> list[tuple[int, Any]]:
        """The iterations a rollback replays, oldest first, with the state each started with:
        those that recorded it, and the current one."""
        entry = self._entry
        assert entry is not None
        history = self._parent._runner.history
        kept = {
            index: e.data.state
            for e in history.within(*subtree_range(entry.location))
            if isinstance(e.data, Iteration)
            and (index := iteration_index(entry.location, e.location)) is not None
            and e.location == iteration_scope(entry.location, index)
        }
        progress = entry.payload(LoopProgress)
        kept[progress.iteration] = progress.state
        return sorted(kept.items())

    def _prune(self, low: int, high: int) -> None:
        """Delete the history of iterations `low` to `high` (excluded), but for those holding a
        step whose rollback handler has not run: a failure of the workflow must still run it."""
        entry = self._entry
        assert entry is not None
        history = self._parent._runner.history
        keep = sorted(
            {
                index
                for e in history.undoable_in(
                    iteration_scope(entry.location, low), iteration_scope(entry.location, high)
                )
                if (index := iteration_index(entry.location, e.location)) is not None
            }
        )
        for start, end in zip([low, *(k + 1 for k in keep)], [*keep, high], strict=True):
            if start < end:
                history.delete_range(
                    iteration_scope(entry.location, start), iteration_scope(entry.location, end)
                )

    def _iteration(self, index: int, recorded: Any) -> LoopIteration:
        """The context of iteration `index`, whose state starts as `recorded` (a copy of it:
        the iteration may change its state in place, which must not change the record it
        replays from after a restart)."""
        entry = self._entry
        assert entry is not None
        scope = iteration_scope(entry.location, index)
        self._current = LoopIteration(self._parent._runner, scope, index, _recorded_copy(recorded))
        return self._current

    def leave(self) -> None:
        """The code left the loop (`break`, or carried on after it): the loop is complete."""
        self._left = True
        entry, current = self._entry, self._current
        assert entry is not None and current is not None
        current._finish()
        runner = self._parent._runner
        if entry.status is not Status.COMPLETED and not runner.rollback_mode:
            entry.status, entry.completed = Status.COMPLETED, time.time()
            runner.history.put(entry)


def _recorded_copy(state: Any) -> Any:
    """`state` as a replay would read it back from the history: decoded from its CBOR, so a
    fresh object that shares nothing with the one given."""
    return cbor2.loads(cbor2.dumps(state))


class WorkflowQueue:
    """`wf.queue`: receiving messages as recorded operations."""

    def __init__(self, context: WorkflowContext) -> None:
        self._context = context

    async def next(
        self,
        name: str,
        *,
        names: Sequence[str] | None = None,
        timeout: float | None = None,
        completable: bool = False,
    ) -> Message | None:
        """The oldest message (of queues `names`, if given), or None after `timeout` seconds."""
        batch = await self.next_batch(
            name, count=1, names=names, timeout=timeout, completable=completable
        )
        return batch[0] if batch else None

    async def next_batch(
        self,
        name: str,
        *,
        count: int = 1,
        names: Sequence[str] | None = None,
        timeout: float | None = None,
        completable: bool = False,
    ) -> list[Message]:
        """Up to `count` messages, waiting until at least one arrives or `timeout` passes.

        A received message is removed from the queue in the same transaction that records it,
        unless `completable`: then it stays queued until `message.complete()`.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        context, runner = self._context, self._context._runner
        with context._op(name) as location:
            entry = context._recorded(location, name, Kind.MESSAGE)
            if entry is not None and entry.status is Status.COMPLETED:
                return runner.messages(entry)
            if entry is None:
                deadline = None if timeout is None else time.time() + timeout
                entry = context._fresh(location, name, Kind.MESSAGE, Messages(deadline))
                if deadline is not None:
                    runner.history.put(entry)
            elif runner.rollback_mode:
                raise RollbackStop
            return await runner.receive(entry, names, count, completable)


def _joined(
    name: str, statuses: dict[str, Branch], branches: Mapping[str, BranchFn]
) -> dict[str, Any]:
    """A settled join's outcome: its branches' outputs, or `JoinError` naming the failed ones."""
    errors = {b: s.error or "" for b, s in statuses.items() if s.status is BranchStatus.FAILED}
    if errors:
        raise JoinError(name, errors)
    return {b: statuses[b].output for b in branches}


def _named_branches(branches: Mapping[str, BranchFn] | Sequence[BranchFn]) -> dict[str, BranchFn]:
    """A race's branches by name: as given, or each function by its own name."""
    return dict(branches) if isinstance(branches, Mapping) else {f.__name__: f for f in branches}


def _won(race: Race) -> RaceResult:
    """A settled race's outcome, as recorded."""
    if race.winner is None:
        raise WorkflowFormatError("a settled race records no winner")
    return RaceResult(race.winner, race.branches[race.winner].output)


def _failed(entry: Entry) -> StepResult:
    kind = entry.payload(StepFailed).failure
    return StepResult(
        False, failure=StepFailure(kind, entry.name, entry.attempts, entry.error or "")
    )


def _raise_control(errors: list[BaseException]) -> None:
    for kind in CONTROL:
        for error in errors:
            if isinstance(error, kind):
                raise error
