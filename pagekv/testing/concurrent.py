"""The concurrent part of a backend check: threads race on one namespace, and what they saw must
be linearizable against the sequential contract (`model.Model`).

Each round runs a small random `Program`: 3-4 threads of 4-8 calls over 4 keys, so that calls
collide: fenced writes with the thread's own generation (from its last takeover), takeovers racing
each other and the writes, unfenced writes, gets of several keys, lists, range deletes, reads of
the generation and the usage, now and then a fenced drop. The threads start together and run with
the interpreter switching often; each call's invocation and response times and its outcome make
the history, closed by a sequential `list()`, `get()` of every key, `generation()` and
`used_bytes()`. How the threads reach the namespace varies too: one shared object, each its own
object of one store, or objects of two stores open at one location (`Program.handles`); a store
that refuses a second open at one location has that shape reported as not checked.

Every result must be of the contract's types (`model.wrong_type`) before it is compared. A call
answering `KvUnavailable` took no effect and one answering `KvIndeterminate` may have; the
setup's own reads are made again when they get either. The threads' calls are timed by the
round (`Subject.call_timeout` for all of them), the setup's and the closing reads by the
subject.

A history is linearizable when every call can be given one instant between its invocation and its
response such that the calls, applied to the model in that order, return what was observed. The
search is Wing & Gong's with Lowe's memo (`check_history`). A history that is not linearizable is
minimised (threads and calls dropped while a re-run still fails) and its cause named:
`_diagnose` finds the call and the clause it breaks, by direct checks (two takeovers returning one
generation) and by relaxations: a history that only a torn batch, or a fence checked apart from
its write, would explain names that call and that clause.
"""

from __future__ import annotations

import itertools
import json
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final

from pagekv.kv import FenceMismatch, KvIndeterminate, KvUnavailable
from pagekv.testing.model import (
    FENCED,
    READS,
    RESULT_TYPES,
    RESULT_TYPES_REQUIRES,
    Model,
    Op,
    Outcome,
    ResultTypeError,
    observe,
)
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import (
    NAMESPACE,
    RETURNS,
    RETURNS_REQUIRES,
    CallTimeout,
    FactoryFailed,
    Subject,
    UsageError,
    switching_often,
)
from pagekv.testing.violation import Violation, show

PART: Final = "concurrent"
KEYS: Final = (b"a", b"b", b"c", b"d")
"""The keyspace of a round: tiny, so that calls of different threads touch the same keys."""
NODE_BUDGET: Final = 100_000
"""Search nodes for one history; past it the history counts as inconclusive, never as passed."""
_RELAXED_BUDGET: Final = 20_000
_ATTEMPTS: Final = 50
"""Re-runs of a candidate program while minimising, at most (a race need not show every time)."""
_ATTEMPTS_LEAST: Final = 20
_CANDIDATE_SECONDS: Final = 2.0
_MINIMISE_SECONDS: Final = (2.0, 20.0)
"""The least and the most time a minimisation takes (else what is left of the part's time)."""
_SETUP_TRIES: Final = 5
"""Times a round's setup is tried when it gets `KvUnavailable` or `KvIndeterminate`."""
_MOST_THREADS, _MOST_STEPS = 16, 100
"""The largest program a replay file may ask for (the part makes 3-4 threads of 4-8 calls)."""
_REPLAY_ATTEMPTS: Final = 3000
_REPLAY_SECONDS: Final = 15.0
"""A replay stops at its first failure; these bound the search for one. A program the minimiser
had no time to shrink (a loaded machine) may fail once in hundreds of runs."""
FINAL: Final = -1
"""The thread of the sequential reads made after the threads joined: `_CLOSING`."""
_CLOSING: Final = (
    Op.of("list"),
    Op.of("get", list(KEYS)),
    Op.of("generation"),
    Op.of("used_bytes"),
)

TAKEOVERS: Final = "concurrent takeovers get distinct generations"
FENCE_REFUSED: Final = "a fenced write is refused once a takeover has completed"
FENCE_ATOMIC: Final = "a fenced write is atomic with its fence check"
BATCH_ATOMIC: Final = "a batch is atomic to concurrent readers"
GET_ATOMIC: Final = "a get of several keys reads one state"
FRESH_READS: Final = "reads see every write acknowledged before they began"
LINEARIZABLE: Final = "calls are linearizable"
KV_ERRORS: Final = "every error is a KvError"

REQUIRES: Final = {
    TAKEOVERS: "takeover() raises the generation by one atomically: no two takeovers return the "
    "same generation, and each returns more than every takeover that completed before it began",
    FENCE_REFUSED: "once a takeover to a later generation has completed, a write fenced with an "
    "older one raises FenceMismatch and writes nothing",
    FENCE_ATOMIC: "a fenced write checks its fence and applies in one atomic step: no takeover "
    "takes effect between the check and the write",
    BATCH_ATOMIC: "a write's puts and deletes take effect at one instant: a concurrent read sees "
    "all of them or none",
    GET_ATOMIC: "get(keys) returns the values its keys held at one instant",
    FRESH_READS: "a read reflects every write acknowledged before the read began",
    LINEARIZABLE: "every call takes effect at one instant between its invocation and its "
    "response, and returns what the sequential contract returns at that instant",
    KV_ERRORS: "every error a call raises is a KvError (pagekv.kv.errors), also while other "
    "threads call the namespace",
    RETURNS: f"{RETURNS_REQUIRES}, also while other threads call the namespace",
    RESULT_TYPES: RESULT_TYPES_REQUIRES,
}

_HANDLES: Final = {
    "shared": "one namespace object, shared by every thread",
    "own": "each thread its own namespace object of one store",
    "stores": "two stores open at one location, the threads alternating between them, each "
    "with its own namespace object",
}


class Inconclusive(Exception):
    """The search for a linearization ran out of its node budget: neither passed nor failed."""


# --- programs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One call of a thread's program. A `fenced` one is called with `fence=` the thread's own
    generation: what its last takeover returned (the namespace's first generation before any)."""

    op: Op
    fenced: bool = False

    def resolve(self, generation: int) -> Op:
        if not self.fenced:
            return self.op
        return replace(self.op, kwargs=(*self.op.kwargs, ("fence", generation)))

    def __str__(self) -> str:
        text = str(self.op)
        if not self.fenced:
            return text
        head = text[:-1]
        return f"{head}{'' if head.endswith('(') else ', '}fence=own)"


@dataclass(frozen=True)
class Program:
    """What a round runs: each thread's calls, and how the threads reach the namespace."""

    threads: tuple[tuple[Step, ...], ...]
    handles: str = "shared"
    """A key of `_HANDLES`."""

    @property
    def calls(self) -> int:
        return sum(map(len, self.threads))

    def handle(self, thread: int) -> str:
        """The name a thread's namespace object goes by in a report."""
        t = max(thread, 0)
        if self.handles == "own":
            return f"kv{t + 1}"
        if self.handles == "stores":
            return f"store{t % 2 + 1}.kv{t + 1}"
        return "kv"

    def smaller(self) -> Iterator[Program]:
        """Each program one step simpler: a thread fewer, plainer handles, a call fewer."""
        if len(self.threads) > 1:
            for t in range(len(self.threads)):
                yield replace(self, threads=self.threads[:t] + self.threads[t + 1 :])
        if self.handles == "stores":
            yield replace(self, handles="own")
        if self.handles != "shared":
            yield replace(self, handles="shared")
        for t, steps in enumerate(self.threads):
            for i in reversed(range(len(steps))):
                fewer = steps[:i] + steps[i + 1 :]
                threads = self.threads[:t] + ((fewer,) if fewer else ()) + self.threads[t + 1 :]
                if threads:
                    yield replace(self, threads=threads)

    def to_json(self) -> dict[str, Any]:
        return {
            "handles": self.handles,
            "threads": [
                [{"op": s.op.to_json(), "fenced": s.fenced} for s in steps]
                for steps in self.threads
            ],
        }

    @staticmethod
    def from_json(data: object) -> Program:
        """The program `to_json` wrote; `UsageError` for anything else."""
        if not isinstance(data, dict) or data.get("handles", "shared") not in _HANDLES:
            raise UsageError(f"a concurrent program must name its handles ({', '.join(_HANDLES)})")
        threads = data.get("threads")
        if not isinstance(threads, list) or not 0 < len(threads) <= _MOST_THREADS:
            raise UsageError(f"a concurrent program has 1 to {_MOST_THREADS} threads")
        if not all(isinstance(t, list) and 0 < len(t) <= _MOST_STEPS for t in threads):
            raise UsageError(f"each thread of a concurrent program has 1 to {_MOST_STEPS} steps")
        return Program(
            tuple(tuple(map(_step_from_json, steps)) for steps in threads),
            data.get("handles", "shared"),
        )


def _step_from_json(data: object) -> Step:
    if not isinstance(data, dict) or not isinstance(data.get("fenced"), bool):
        raise UsageError(f"a step of a concurrent program is {{op, fenced}}, not {show(data)}")
    op = Op.from_json(data.get("op"))
    if data["fenced"] and (op.method not in FENCED or "fence" in dict(op.kwargs)):
        raise UsageError(f"a fenced step must be a write without a fence of its own, not {op}")
    return Step(op, data["fenced"])


def _generate(rng: random.Random, subject: Subject, two_stores: bool) -> Program:
    """A random program; `two_stores`: its threads may reach the namespace through two stores
    open at one location."""
    handles = "shared"
    if subject.returns_store and rng.random() < 0.5:
        handles = "stores" if two_stores and subject.reopens and rng.random() < 0.5 else "own"
    values = (f"v{n}".encode() for n in itertools.count(1))
    threads = tuple(
        tuple(_step(rng, i == 0, next(values)) for i in range(rng.randint(4, 8)))
        for _ in range(rng.randint(3, 4))
    )
    return Program(threads, handles)


_KINDS: Final = {
    "put": 4.0,
    "batch": 3.0,
    "delete": 1.0,
    "delete_range": 1.0,
    "takeover": 3.0,
    "get": 3.0,
    "list": 2.0,
    "generation": 1.0,
    "used_bytes": 1.0,
    "drop": 0.6,
}
_LISTS: Final[tuple[dict[str, Any], ...]] = (
    {},
    {},
    {"start": b"b"},
    {"reverse": True},
    {"limit": 2},
)


def _step(rng: random.Random, first: bool, value: bytes) -> Step:
    """A random call (a takeover, more often than not, if `first`); a write writes `value`,
    which no other call of the program writes, so a history tells whose write a read saw."""
    fenced = rng.random() < 0.8
    kind = "takeover"
    if not first or rng.random() >= 0.6:
        kind = rng.choices(list(_KINDS), weights=list(_KINDS.values()))[0]
    match kind:
        case "put":
            keys = rng.sample(KEYS, rng.randint(1, 2))
            return Step(Op.of("put", dict.fromkeys(keys, value)), fenced)
        case "batch":
            a, b, c = rng.sample(KEYS, 3)
            return Step(Op.of("write", put={a: value, b: value}, delete=[c]), fenced)
        case "delete":
            return Step(Op.of("delete", [rng.choice(KEYS)]), fenced)
        case "delete_range":
            lo, hi = sorted(rng.sample((*KEYS, b"e"), 2))
            return Step(Op.of("delete_range", lo, hi), rng.random() < 0.5)
        case "get":
            return Step(Op.of("get", rng.sample(KEYS, rng.randint(2, 3))))
        case "list":
            return Step(Op.of("list", **rng.choice(_LISTS)))
        case "drop":
            return Step(Op.of("drop"), True)
        case other:
            return Step(Op.of(other))


# --- running a round -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One call as it happened: its thread, the call, its outcome, and when it was invoked and
    when it returned (`time.perf_counter_ns`). `outcome` is None when it raised `error`, an
    exception that is not a `KvError`, or when it never returned (`error` None too)."""

    thread: int
    op: Op
    outcome: Outcome | None
    start: int
    end: int
    error: BaseException | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome is not None and not self.outcome.failed

    @property
    def label(self) -> str:
        return "after" if self.thread == FINAL else f"t{self.thread + 1}"

    def value(self) -> str:
        """What it returned, shown (for a call that returned)."""
        return show(self.outcome.value if self.outcome is not None else None)

    def result(self) -> str:
        if isinstance(self.error, ResultTypeError):
            return str(self.error)
        if self.error is not None:
            return f"raised {show(self.error)}"
        if self.outcome is None:
            return "did not return"
        if self.outcome.raised is not None:
            return f"raised {type(self.outcome.raised).__name__}"
        return f"-> {show(self.outcome.value)}"

    def __str__(self) -> str:
        return f"{self.label} {self.op} {self.result()}"


@dataclass
class _Round:
    program: Program
    events: list[Event]
    initial: Model
    timeout: float
    hung: list[Event] = field(default_factory=list)


class _NotRun(Exception):
    """A round's setup got no definite answer (`KvUnavailable`, `KvIndeterminate`) in
    `_SETUP_TRIES` tries: the round is not run, and nothing is concluded from it."""


class _Refused(Exception):
    """The factory refused the second store at one location: the shape cannot run here."""


def _transient(error: BaseException) -> bool:
    """An error after which a setup step is tried again: nothing definite was answered."""
    if isinstance(error, FactoryFailed):
        error = error.error
    return isinstance(error, KvUnavailable | KvIndeterminate)


def _open(subject: Subject, program: Program) -> list[Any]:
    """The namespace objects of a fresh namespace, one per thread or one shared (each as the
    subject guards it). Raises `_Refused` when the second store at one location is refused,
    `FactoryFailed` when the factory or a store's `namespace()` fails."""
    n = len(program.threads)
    try:
        if program.handles == "stores" and subject.reopens:
            location = subject.location()
            stores = [subject.open_store(location=location)]
            try:
                stores.append(subject.open_store(location=location))
            except FactoryFailed as e:
                if _transient(e):
                    raise
                raise _Refused(f"a second store at one location: {e}") from e
            return [stores[t % 2].namespace(NAMESPACE) for t in range(n)]
        if program.handles != "shared" and subject.returns_store:
            store = subject.open_store()
            return [store.namespace(NAMESPACE) for _ in range(n)]
    except (FactoryFailed, _Refused):
        raise
    except Exception as e:
        raise FactoryFailed(f"store.namespace({NAMESPACE!r})", e) from e
    return [subject.namespace()]


def _setup(subject: Subject, program: Program) -> tuple[list[Any], Event]:
    """The round's handles and its first generation, read before the threads start; both made
    again while they get no definite answer."""
    for _ in range(_SETUP_TRIES):
        try:
            handles = _open(subject, program)
        except FactoryFailed as e:
            if not _transient(e):
                raise
            subject.close()
            continue
        first = _call(handles[0], FINAL, Op.of("generation"))
        if first.outcome is None or not _transient_outcome(first.outcome):
            return handles, first
        subject.close()
    raise _NotRun(f"the round's setup got no definite answer in {_SETUP_TRIES} tries")


def _transient_outcome(outcome: Outcome) -> bool:
    return outcome.raised is not None and _transient(outcome.raised)


def _call(kv: Any, thread: int, op: Op) -> Event:
    """`op` on `kv` as an event; whatever the backend raises is its outcome or error, but a
    `KeyboardInterrupt` (the user's) and a `CallTimeout` (the subject's) end the round."""
    start = time.perf_counter_ns()
    try:
        outcome = observe(kv, op)
    except (KeyboardInterrupt, CallTimeout):
        raise
    except BaseException as e:
        return Event(thread, op, None, start, time.perf_counter_ns(), e)
    return Event(thread, op, outcome, start, time.perf_counter_ns())


class _Crew:
    """The threads that run the rounds, kept for a whole part: starting four threads costs ~2 ms
    on a small machine, more than a round's calls. Thread `t` runs the jobs given as number `t`.
    A crew one of whose jobs did not finish is not used again."""

    def __init__(self) -> None:
        self._inboxes: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._done: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()
        self._hung = False

    def _serve(self, t: int, inbox: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := inbox.get()) is not None:
            try:
                job()
            except BaseException as e:
                self._done.put((t, e))
            else:
                self._done.put((t, None))

    def run(self, jobs: Sequence[Callable[[], None]], timeout: float) -> set[int]:
        """Run the jobs at once, one a thread; the numbers of those that finished within
        `timeout` seconds (an exception a job raised is raised here)."""
        assert not self._hung
        while len(self._inboxes) < len(jobs):
            t, inbox = len(self._inboxes), queue.SimpleQueue[Callable[[], None] | None]()
            name = f"pagekv-check-t{t + 1}"
            threading.Thread(target=self._serve, args=(t, inbox), name=name, daemon=True).start()
            self._inboxes.append(inbox)
        for inbox, job in zip(self._inboxes, jobs, strict=False):
            inbox.put(job)
        deadline = time.monotonic() + timeout
        finished: set[int] = set()
        errors: list[BaseException] = []
        while len(finished) < len(jobs):
            try:
                t, error = self._done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._hung = True
                break
            finished.add(t)
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]
        return finished

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)


def _run(subject: Subject, crew: _Crew, program: Program) -> _Round:
    """Run `program` once on a fresh namespace; what the subject opened is closed after it
    (unless a call hangs: closing under it could hang too, and the subject is abandoned)."""
    hung: list[Event] = []
    timeout = subject.call_timeout
    try:
        handles, first = _setup(subject, program)
        limits = subject.limits_of(handles[0], None)
        if not first.succeeded:  # a definite wrong answer: the round is that call
            return _Round(program, [first], Model(limits), timeout)
        initial = Model(limits, generation=first.outcome.value)  # type: ignore[union-attr]
        n = len(program.threads)
        recorded: list[list[Event]] = [[] for _ in range(n)]
        calling: list[tuple[Op, int] | None] = [None] * n
        barrier = threading.Barrier(n)

        def work(t: int) -> None:
            kv, generation = handles[t % len(handles)].inner, initial.generation
            barrier.wait(timeout)
            for step in program.threads[t]:
                op = step.resolve(generation)
                calling[t] = (op, time.perf_counter_ns())
                event = _call(kv, t, op)
                recorded[t].append(event)
                if event.error is not None:
                    break
                if op.method == "takeover" and event.succeeded:
                    generation = event.outcome.value  # type: ignore[union-attr]
            calling[t] = None

        with switching_often():
            finished = crew.run([partial(work, t) for t in range(n)], timeout)
        for t, pending in enumerate(calling):
            if t not in finished and pending is not None:
                hung.append(Event(t, pending[0], None, pending[1], pending[1]))
        if len(finished) < n and not hung:
            raise RuntimeError("the check's threads did not start")
        if hung:
            call = f"{hung[0].label} {program.handle(hung[0].thread)}.{hung[0].op}"
            subject.abandon(CallTimeout(call, timeout))
        events = sorted((e for es in recorded for e in es), key=lambda e: e.start)
        if not hung:
            for op in _CLOSING:
                events.append(_call(handles[0], FINAL, op))
        return _Round(program, events, initial, timeout, hung)
    finally:
        if not hung:
            subject.close()


# --- linearizability -------------------------------------------------------------------------

Check = Callable[[Model], Outcome | None]
"""One atomic step of a call on a model: moves it, and returns None when the observed outcome is
admitted there, else the outcome the model required."""


@dataclass(frozen=True)
class _Call:
    """A call as the search sees it: steps that take effect, each at its own instant, all between
    `start` and `end`, the first `in_order` of them in order and before the rest (taken in any
    order); an `optional` call may never take effect (its outcome is unknown). A call of no steps
    changed and observed nothing."""

    start: float
    end: float
    steps: tuple[Check, ...]
    in_order: int = 1 << 30
    optional: bool = False


@dataclass
class _Search:
    ok: bool
    order: list[tuple[int, int]]
    """The linearization found: (call, step), in the order they take effect."""
    rejected: list[tuple[int, Outcome]]
    """At the deepest point the search reached: the calls whose observed outcome no order
    admitted there, with the outcome the model required of each."""


def _exactly(op: Op, observed: Outcome) -> Check:
    def step(model: Model) -> Outcome | None:
        required = model.apply(op)
        return None if required.admits(observed) else required

    return step


def _applied(op: Op) -> Check:
    def step(model: Model) -> Outcome | None:
        model.apply(op)
        return None

    return step


def _as_call(event: Event) -> _Call:
    outcome = event.outcome
    if outcome is None or isinstance(outcome.raised, KvUnavailable):
        return _Call(event.start, event.end, ())
    if isinstance(outcome.raised, KvIndeterminate):
        return _Call(event.start, math.inf, (_applied(event.op),), optional=True)
    return _Call(event.start, event.end, (_exactly(event.op, outcome),))


def _state(model: Model) -> tuple[Any, ...]:
    """The model's state for the memo, independent of the order its keys were inserted in."""
    return (tuple(model.contents()), model.generation, model.used)


def _search(calls: Sequence[_Call], initial: Model, budget: int) -> _Search:
    """Wing & Gong's search for a linearization, memoised on (steps done, model state) as Lowe's.

    A step may be taken next when its call was invoked before every pending call's response.
    Raises `Inconclusive` past `budget` nodes."""
    full = [(1 << len(c.steps)) - 1 for c in calls]
    by_end = sorted(range(len(calls)), key=lambda i: calls[i].end)
    seen: set[tuple[Any, ...]] = set()
    order: list[tuple[int, int]] = []
    nodes = 0
    deepest = -1
    rejected: dict[int, Outcome] = {}

    def visit(done: tuple[int, ...], model: Model, depth: int) -> bool:
        nonlocal nodes, deepest, rejected
        pending = [i for i in by_end if done[i] != full[i]]
        if all(calls[i].optional for i in pending):
            return True
        key = (done, _state(model))
        if key in seen:
            return False
        seen.add(key)
        nodes += 1
        if nodes > budget:
            raise Inconclusive(f"no decision within {budget:,} search nodes")
        horizon = min(calls[i].end for i in pending)
        for i in pending:
            call = calls[i]
            if call.start > horizon:
                continue
            for s in _next_steps(call, done[i]):
                model_after = model.copy()
                required = call.steps[s](model_after)
                if required is not None:
                    if depth > deepest:
                        deepest, rejected = depth, {}
                    if depth == deepest:
                        rejected.setdefault(i, required)
                    continue
                order.append((i, s))
                after = (*done[:i], done[i] | 1 << s, *done[i + 1 :])
                if visit(after, model_after, depth + 1):
                    return True
                order.pop()
        return False

    ok = visit(tuple(0 for _ in calls), initial.copy(), 0)
    return _Search(ok, order, list(rejected.items()))


def _next_steps(call: _Call, done: int) -> list[int]:
    undone = [s for s in range(len(call.steps)) if not done >> s & 1]
    return undone[:1] if undone[0] < call.in_order else undone


@dataclass(frozen=True)
class Failure:
    """Why a history breaks the contract: the clause, the call that broke it and how."""

    clause: str
    event: Event
    got: str
    expected: str = ""

    @property
    def requires(self) -> str:
        return REQUIRES[self.clause]


def check_history(
    events: Sequence[Event], initial: Model, budget: int = NODE_BUDGET
) -> Failure | None:
    """None when `events` (each call with its outcome) are linearizable from `initial`; else the
    failure, its cause named. Raises `Inconclusive` when the search runs out of `budget`."""
    crashed = next((e for e in events if e.error is not None), None)
    if isinstance(crashed.error if crashed else None, ResultTypeError):
        assert crashed is not None
        return Failure(RESULT_TYPES, crashed, crashed.result())
    if crashed is not None:
        return Failure(KV_ERRORS, crashed, crashed.result(), "returns, or raises a KvError")
    result = _search([_as_call(e) for e in events], initial, budget)
    return None if result.ok else _diagnose(list(events), initial, result)


@dataclass(frozen=True)
class _Case:
    """A history that is not linearizable, as the diagnosis works on it."""

    events: list[Event]
    initial: Model
    unrelaxed: _Search


def _diagnose(events: list[Event], initial: Model, unrelaxed: _Search) -> Failure:
    """The cause of a history that is not linearizable: a direct conflict between two calls, else
    the first relaxation (a call split into steps, a read allowed to be stale) that explains the
    history applied to one call, or else to every call it applies to; else the call the search
    could not get past."""
    found = _takeover_conflict(events, initial.generation) or _fenced_after_takeover(events)
    if found is not None:
        return found
    case = _Case(events, initial, unrelaxed)
    for relaxation in _RELAXATIONS:
        every = {i: c for i, e in enumerate(events) if (c := relaxation.split(e)) is not None}
        for i, relaxed in every.items():
            if (order := _linearize(case, {i: relaxed})) is not None:
                return relaxation.explain(case, i, order)
        if len(every) > 1 and (order := _linearize(case, every)) is not None:
            for i in every:
                if relaxation.witnesses(case, i, order):
                    return relaxation.explain(case, i, order)
    return _unexplained(case)


def _linearize(case: _Case, relaxed: dict[int, _Call]) -> list[tuple[int, int]] | None:
    """A linearization of the case's history with some calls relaxed, or None."""
    calls = [relaxed.get(i) or _as_call(e) for i, e in enumerate(case.events)]
    try:
        result = _search(calls, case.initial, _RELAXED_BUDGET)
    except Inconclusive:
        return None
    return result.order if result.ok else None


def _takeovers(events: Sequence[Event]) -> list[Event]:
    return [e for e in events if e.op.method == "takeover" and e.succeeded]


def _takeover_range(events: Sequence[Event], event: Event, first: int) -> str:
    """The generations `event`'s takeover could have returned, given the others' times."""
    takeovers = _takeovers(events)
    low = first + 1 + sum(1 for e in takeovers if e.end < event.start)
    high = first + sum(1 for e in takeovers if e.start <= event.end)
    if high <= low:
        return f"returns {low}"
    return f"returns one of {low}..{high}, a generation no other takeover returned"


def _takeover_conflict(events: Sequence[Event], first: int) -> Failure | None:
    """Two takeovers no order can reconcile: one generation twice, or one not above another
    that completed before it began (or not above the first generation)."""
    takeovers = sorted(_takeovers(events), key=lambda e: (e.end, e.start))
    for n, b in enumerate(takeovers):
        value = b.outcome.value  # type: ignore[union-attr]
        got = ""
        if value <= first:
            got = f"returned {value}, though the namespace was at generation {first} before"
        for a in takeovers[:n]:
            if got:
                break
            before = a.outcome.value  # type: ignore[union-attr]
            if before == value:
                got = f"returned {value}, as did {a.label} takeover() at the same time"
            elif a.end < b.start and value < before:
                got = f"returned {value}, though {a.label} takeover() -> {before} had completed"
        if got:
            return Failure(TAKEOVERS, b, got, _takeover_range(events, b, first))
    return None


def _fence(op: Op) -> int | None:
    fence = dict(op.kwargs).get("fence")
    return fence if isinstance(fence, int) else None


def _fenced_after_takeover(events: Sequence[Event]) -> Failure | None:
    """A fenced write that succeeded though a takeover to a later generation had completed
    before it began: every order puts the takeover first, so the fence was stale."""
    for event in events:
        fence = _fence(event.op)
        if fence is None or not event.succeeded:
            continue
        later = [
            t
            for t in _takeovers(events)
            if t.end < event.start and t.outcome.value > fence  # type: ignore[union-attr]
        ]
        if later:
            takeover = max(later, key=lambda t: t.end)
            got = (
                f"succeeded, though {takeover.label} takeover() "
                f"{takeover.result()} had completed before it began"
            )
            return Failure(FENCE_REFUSED, event, got, "raises FenceMismatch")
    return None


@dataclass(frozen=True)
class _Relaxation:
    clause: str
    split: Callable[[Event], _Call | None]
    """The call as a backend that broke the clause would make it, or None where it can't."""
    describe: Callable[[_Case, int, list[Event]], tuple[str, str]]
    """(got, expected) of call `i`, given its witnesses."""
    stale: bool = False
    """Whether the relaxation moves a call earlier (else it splits it into steps)."""

    def witnesses(self, case: _Case, i: int, order: list[tuple[int, int]]) -> list[Event]:
        """The calls that show call `i` relaxed in `order`: those that took effect between its
        first and last steps, or, for a stale read, the writes it missed (they completed before
        it began and took effect after it)."""
        mine = [n for n, (call, _) in enumerate(order) if call == i]
        if not mine:
            return []
        if self.stale:
            read = case.events[i]
            later = [case.events[c] for c, _ in order[mine[0] + 1 :]]
            return [e for e in later if e.end < read.start and e.op.method not in READS]
        return [case.events[c] for c, _ in order[mine[0] + 1 : mine[-1]] if c != i]

    def explain(self, case: _Case, i: int, order: list[tuple[int, int]]) -> Failure:
        got, expected = self.describe(case, i, self.witnesses(case, i, order))
        return Failure(self.clause, case.events[i], got, expected)


def _split_takeover(event: Event) -> _Call | None:
    """A takeover that reads the generation and writes it one higher in two steps."""
    if event.op.method != "takeover" or not event.succeeded:
        return None
    value: int = event.outcome.value  # type: ignore[union-attr]

    def read(model: Model) -> Outcome | None:
        return None if model.generation == value - 1 else Outcome(model.generation + 1)

    def write(model: Model) -> Outcome | None:
        model.generation = value
        return None

    return _Call(event.start, event.end, (read, write))


def _describe_takeover(case: _Case, i: int, between: list[Event]) -> tuple[str, str]:
    event = case.events[i]
    got = f"returned {event.value()}"
    if between:
        got += f", as if it read the generation before {between[0]} and wrote it after"
    return got, _takeover_range(case.events, event, case.initial.generation)


def _split_fence(event: Event) -> _Call | None:
    """A fenced write whose fence is checked in one step and whose change is made in another."""
    fence = _fence(event.op)
    if fence is None or not event.succeeded or event.outcome is None:
        return None
    unfenced = replace(event.op, kwargs=tuple(kv for kv in event.op.kwargs if kv[0] != "fence"))
    return _Call(event.start, event.end, (_fence_check(fence), _exactly(unfenced, event.outcome)))


def _fence_check(fence: int) -> Check:
    def check(model: Model) -> Outcome | None:
        return None if model.generation == fence else Outcome(errors=frozenset({FenceMismatch}))

    return check


def _describe_fence(case: _Case, i: int, between: list[Event]) -> tuple[str, str]:
    takeovers = [e for e in between if e.op.method == "takeover"]
    if not takeovers:
        return "succeeded, though its fence was stale when it took effect", "raises FenceMismatch"
    got = (
        f"succeeded, though {takeovers[0]} took effect after its fence was checked and before "
        "its write: only a write made apart from its fence check explains the history"
    )
    return got, "raises FenceMismatch, or takes effect before that takeover"


def _pieces(op: Op) -> tuple[dict[bytes, bytes], list[bytes]] | None:
    """A write's puts and deletes, for the batch shapes `_step` makes."""
    kwargs = dict(op.kwargs)
    match op.method:
        case "write":
            return dict(kwargs.get("put", {})), list(kwargs.get("delete", []))
        case "put":
            return dict(op.args[0]), []
        case "delete":
            return {}, list(op.args[0])
    return None


def _split_batch(event: Event) -> _Call | None:
    """A batch applied one key at a time, in any order, after its fence was checked."""
    pieces = _pieces(event.op)
    if pieces is None or not event.succeeded or sum(map(len, pieces)) < 2:
        return None
    ops = [Op.of("put", {k: v}) for k, v in pieces[0].items()]
    ops += [Op.of("delete", [k]) for k in pieces[1]]
    steps = tuple(_exactly(op, Outcome(None)) for op in ops)
    fence = _fence(event.op)
    if fence is None:
        return _Call(event.start, event.end, steps, in_order=0)
    return _Call(event.start, event.end, (_fence_check(fence), *steps), in_order=1)


def _describe_batch(case: _Case, i: int, between: list[Event]) -> tuple[str, str]:
    readers = [e for e in between if e.op.method in READS]
    if readers:
        return (
            f"took effect key by key: {readers[0]} saw part of it",
            "a concurrent read sees all of its puts and deletes or none of them",
        )
    got = "took effect key by key" + (f", {between[0]} between its keys" if between else "")
    return got, "all of its puts and deletes take effect at one instant"


def _split_get(event: Event) -> _Call | None:
    """A get that reads its keys one at a time, in any order."""
    if event.op.method != "get" or not event.succeeded or event.outcome is None:
        return None
    keys, values = list(event.op.args[0]), list(event.outcome.value)
    if len(keys) < 2 or len(keys) != len(values):
        return None
    steps = tuple(
        _exactly(Op.of("get", [k]), Outcome([v])) for k, v in zip(keys, values, strict=True)
    )
    return _Call(event.start, event.end, steps, in_order=0)


def _describe_get(case: _Case, i: int, between: list[Event]) -> tuple[str, str]:
    got = f"returned {case.events[i].value()}, values its keys never held at one instant"
    if between:
        got += f" (as if read before and after {between[0]})"
    return got, "the values of one state of the namespace"


def _stale(event: Event) -> _Call | None:
    """A read that may return any state since the round began."""
    if event.op.method not in READS or not event.succeeded or event.outcome is None:
        return None
    return _Call(-math.inf, event.end, (_exactly(event.op, event.outcome),))


def _describe_stale(case: _Case, i: int, missed: list[Event]) -> tuple[str, str]:
    got = f"returned {case.events[i].value()}"
    if missed:
        got += f", as if {missed[0]}, acknowledged before it began, had not happened"
    required = dict(case.unrelaxed.rejected).get(i)
    return got, "" if required is None else str(required)


_RELAXATIONS: Final = (
    _Relaxation(TAKEOVERS, _split_takeover, _describe_takeover),
    _Relaxation(FENCE_ATOMIC, _split_fence, _describe_fence),
    _Relaxation(BATCH_ATOMIC, _split_batch, _describe_batch),
    _Relaxation(GET_ATOMIC, _split_get, _describe_get),
    _Relaxation(FRESH_READS, _stale, _describe_stale, stale=True),
)
"""Most specific first: a stale read would explain a fence raced by a takeover, too."""


def _unexplained(case: _Case) -> Failure:
    """The call the search could not get past: of those it rejected at its deepest point (never
    none, as the call that returned first can always be tried), the one due soonest."""
    events = case.events
    i, required = min(case.unrelaxed.rejected, key=lambda r: (events[r[0]].end, r[0]))
    expected = f"{required} (in every order the other calls' times allow, as far as it got)"
    return Failure(LINEARIZABLE, events[i], events[i].result(), expected)


# --- the part --------------------------------------------------------------------------------


def _judge(round_: _Round) -> Failure | None:
    if round_.hung:
        event = round_.hung[0]
        return Failure(RETURNS, event, f"did not return within {round_.timeout:g} s")
    return check_history(round_.events, round_.initial)


def _reproduce(
    subject: Subject, crew: _Crew, program: Program, attempts: int, seconds: float
) -> tuple[_Round, Failure, int] | None:
    """Re-run `program` until it breaks the contract, within the bounds: the failing round, its
    failure and how many runs it took. A program of a shape the factory refuses does not."""
    deadline = time.monotonic() + seconds
    for attempt in range(1, attempts + 1):
        try:
            round_ = _run(subject, crew, program)
        except _Refused:
            return None
        except _NotRun:
            continue
        try:
            failure = _judge(round_)
        except Inconclusive:
            failure = None
        if failure is not None:
            return round_, failure, attempt
        if time.monotonic() >= deadline:
            break
    return None


def _minimise(
    subject: Subject, crew: _Crew, found: tuple[_Round, Failure], seconds: float
) -> tuple[_Round, Failure]:
    """Drop threads and calls while a re-run still fails, in passes until one changes nothing or
    time runs out. A smaller program may fail as another clause: the same fault seen more
    plainly, named more precisely.

    A candidate gets four times the runs the slowest reproduction so far took (8 to 50), and
    one that did not fail is not tried again. Not hypothesis's shrinker: a race fails only some
    of the runs of a program, and hypothesis takes one passing run as a candidate that passes
    (and a failure that does not come back as its own error, `Flaky`)."""
    deadline = time.monotonic() + seconds
    best = found
    tried: set[str] = set()
    needed: int | None = None
    """The most runs a reproduction took so far."""
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        position = 0
        while (left := deadline - time.monotonic()) > 0:
            candidates = list(best[0].program.smaller())
            if position >= len(candidates):
                break
            candidate = candidates[position]
            key = json.dumps(candidate.to_json())
            attempts = _ATTEMPTS if needed is None else max(_ATTEMPTS_LEAST, 4 * needed)
            got = None
            if key not in tried:
                bound = min(_CANDIDATE_SECONDS, left)
                got = _reproduce(subject, crew, candidate, min(_ATTEMPTS, attempts), bound)
            if got is None:
                tried.add(key)
                position += 1
            else:
                best, changed = got[:2], True
                needed = max(needed or 0, got[2])
    return best


def _violation(round_: _Round, failure: Failure, seed: int | None) -> Violation:
    program, event = round_.program, failure.event
    events = round_.events + round_.hung
    origin = min((e.start for e in events), default=0)
    sequence = [f"handles: {_HANDLES[program.handles]}"]
    sequence += [
        f"t{t + 1} runs: " + "; ".join(map(str, steps)) for t, steps in enumerate(program.threads)
    ]
    for e in sorted(events, key=lambda e: e.start):
        span = f"{(e.start - origin) // 1000:>6}..{(e.end - origin) // 1000:<6}µs"
        sequence.append(f"{e.label:<5} {span} {program.handle(e.thread)}.{e.op} {e.result()}")
    return Violation(
        part=PART,
        clause=failure.clause,
        requires=failure.requires,
        call=f"{event.label} {program.handle(event.thread)}.{event.op}",
        got=failure.got,
        expected=failure.expected,
        sequence=sequence,
        seed=seed,
        details={"program": program.to_json(), "clause": failure.clause, "seed": seed},
    )


def run_concurrent(subject: Subject, *, seconds: float, seed: int) -> PartResult:
    """Rounds of random programs until `seconds` run out or one breaks the contract, which is
    then minimised within what is left of `seconds` (2 s at least, 20 s at most). Each round
    closes whatever the subject has open when it ends."""
    started = time.monotonic()
    rng = random.Random(seed)
    rounds = calls = checked = inconclusive = not_run = 0
    not_checked: list[str] = []
    two_stores = True
    crew = _Crew()
    try:
        while True:
            program = _generate(rng, subject, two_stores)
            try:
                round_ = _run(subject, crew, program)
            except _Refused as e:
                not_checked.append(f"programs of {_HANDLES['stores']}: {e}")
                two_stores = False
                continue
            except _NotRun:
                not_run += 1
                round_ = None
            if round_ is not None:
                rounds += 1
                calls += len(round_.events)
                try:
                    failure = _judge(round_)
                except Inconclusive:
                    inconclusive += 1
                    failure = None
                else:
                    checked += 1
                if failure is not None:
                    found_after = time.monotonic() - started
                    found = round_, failure
                    if failure.clause != RETURNS:
                        low, high = _MINIMISE_SECONDS
                        bound = min(high, max(low, seconds - found_after))
                        found = _minimise(subject, crew, found, bound)
                    summary = (
                        f"{rounds:,} rounds, {calls:,} calls; round {rounds:,} broke the "
                        f"contract (minimised to {found[0].program.calls} calls)"
                    )
                    return PartResult(
                        PART,
                        Status.FAILED,
                        summary,
                        time.monotonic() - started,
                        [_violation(*found, seed)],
                        not_checked,
                        found_after,
                    )
            if time.monotonic() - started >= seconds:
                break
    finally:
        crew.close()
    summary = f"{rounds:,} rounds, {calls:,} calls linearizable"
    if inconclusive:
        summary = (
            f"{rounds:,} rounds, {checked:,} histories linearizable, "
            f"{inconclusive:,} too large to decide"
        )
        not_checked.append(f"{inconclusive} of {rounds} histories: no decision within the budget")
    if not_run:
        not_checked.append(
            f"{not_run} rounds not run: their setup got no definite answer "
            f"(KvUnavailable or KvIndeterminate) in {_SETUP_TRIES} tries"
        )
    status = Status.PASSED if checked else Status.NOT_CHECKED
    return PartResult(PART, status, summary, time.monotonic() - started, not_checked=not_checked)


def replay_concurrent(subject: Subject, details: dict[str, Any]) -> Violation | None:
    """Re-run a reported program until it breaks the contract again (None: it did not, within
    3,000 runs or 15 s; a race need not show every time)."""
    program = Program.from_json(details["program"])
    crew = _Crew()
    try:
        got = _reproduce(subject, crew, program, _REPLAY_ATTEMPTS, _REPLAY_SECONDS)
    finally:
        crew.close()
    return None if got is None else _violation(got[0], got[1], seed=details.get("seed"))
