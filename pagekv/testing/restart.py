"""The restart part: what a store acknowledged is there after it is closed and reopened, and after
its process is killed.

Each run takes a fresh location, two or three namespaces and a seeded sequence of calls (puts,
deletes, batches, fenced and not, takeovers, stale fences that must fail, range deletes, drops,
values as large as the store advertises), each checked against the contract's `Model` as it
runs. The store is restarted one of two ways:

- clean: `store.close()`, then the factory called again with the same location. Everything
  acknowledged must be there, generations and `used_bytes()` exactly.
- kill: the calls run in a forked child, which acknowledges each one over a pipe; the parent
  sends SIGKILL right after a seeded call's acknowledgement, or a seeded few milliseconds later
  (the child runs on until it lands), and reopens the location. Every acknowledged call must be
  there, the one in flight entirely or not at all, and nothing else.

After a run's last restart a takeover of each namespace must return one more than the generation
it came back with. A restart is blamed only for what it changed: a clean run reads every
namespace back after each call, and a kill's finding is first run again clean, without restarts.
A failure is minimised (delta debugging over the calls and restart points; a kill candidate is
tried a few times, since where a kill lands varies) and its report names the earliest
acknowledged call whose effect is missing.

A namespace's model starts at the generation it has when the run opens it (a fresh namespace
need not be at 0). The answers the contract allows a backend that cannot tell are taken as a
client would: a call answering `KvUnavailable` applied nothing and is made again (a read
answering `KvIndeterminate` too); a write answering `KvIndeterminate` may have applied, so the
namespace is read back, and the model follows what it holds, as before the call or as after it.
A run whose call gets no definite answer in `_TRIES` tries is not checked.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import random
import select
import shutil
import signal
import struct
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from pagekv.kv import ActorKv, KvError, KvIndeterminate, KvLimits, KvUnavailable
from pagekv.testing.model import (
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
from pagekv.testing.subject import NAMESPACE, FactoryFailed, Subject, UsageError
from pagekv.testing.violation import Violation, show

CLEAN: Final = "clean"
KILL: Final = "kill"
_NAMES: Final = (NAMESPACE, f"{NAMESPACE}-2", f"{NAMESPACE}-3")
_KEYS: Final = tuple(b"k%02d" % n for n in range(12))
_KILL_TRIES: Final = 3
"""Times a kill candidate is run while minimising before it is taken not to fail."""
_MINIMISE_SECONDS: Final = 10.0
"""The most a failure's minimisation takes (what is left of the part's `seconds`, at least 1 s)."""
_TRIES: Final = 5
"""Times a call is made while it answers `KvUnavailable` (or, for a read, `KvIndeterminate`)."""
_MOST_STEPS: Final = 200
"""The longest scenario a replay file may ask for (the part makes 6 to 40 calls)."""
_MOST_DELAY: Final = 1.0
_CHILD_SECONDS: Final = 10.0
"""How long a child may take to reach its kill point; it is killed then wherever it is."""
_RECORD: Final = struct.Struct("<iI")
"""An acknowledgement from the child: the call's index (-1: the store opened) and a status;
8 bytes, so one `write` of it is atomic on a pipe."""
_LENGTH: Final = struct.Struct("<I")
_OK, _WRONG, _BROKEN, _NOT_APPLIED, _UNSETTLED = 0, 1, 2, 3, 4
"""A child's statuses: acknowledged as the model requires; answered otherwise; the store did not
open (index -1) or our own code failed (index -2); answered `KvIndeterminate` and read back as
not applied; no definite answer in `_TRIES` tries. A text follows all but `_OK` and
`_NOT_APPLIED`, and the open's `_OK` (its text: the namespaces' first generations)."""
_OPENED: Final = -1
_CRASHED: Final = -2


@dataclass(frozen=True)
class _Clause:
    name: str
    requires: str


_CLOSE_KEEPS: Final = _Clause(
    "close() keeps everything acknowledged",
    "a store opened again at the same location after close() holds every write, takeover and "
    "drop it acknowledged",
)
_KILL_KEEPS: Final = _Clause(
    "acknowledged writes survive a kill",
    "a store reopened after its process was killed (SIGKILL) holds every write it acknowledged; "
    "the call in flight applied entirely or not at all",
)
_GENERATION: Final = _Clause(
    "the generation survives a restart",
    "after a reopen, generation() is that of the last acknowledged takeover, and the next "
    "takeover returns one more",
)
_WHOLE: Final = _Clause(
    "a call in flight at a kill applies entirely or not at all",
    "after a kill, the call that had not been acknowledged left all of its effects or none",
)
_NOTHING_ELSE: Final = _Clause(
    "a restart changes nothing not acknowledged",
    "a reopened namespace holds what its acknowledged calls left (and the call in flight, "
    "entirely or not at all), nothing else",
)
_USAGE: Final = _Clause(
    "used_bytes() is exact after a restart",
    "after a reopen, used_bytes() is the sizes of the keys and values the namespace holds",
)
_ANSWERS: Final = _Clause(
    "calls answer as the contract requires",
    "each call of a restart run answers as the contract's model does and leaves the namespaces "
    "as the model has them (so that what a restart changes is told from what a call did)",
)
_TYPES: Final = _Clause(RESULT_TYPES, RESULT_TYPES_REQUIRES)
_REOPENS: Final = _Clause(
    "the store reopens after a restart",
    "the factory called again with the same location opens the store, and its namespaces "
    "answer reads",
)


@dataclass(frozen=True)
class Step:
    """A call `op` on the run's namespace number `ns`, or a restart (`op` None)."""

    ns: int = 0
    op: Op | None = None

    def to_json(self) -> dict[str, Any]:
        return {"restart": True} if self.op is None else {"ns": self.ns, "op": self.op.to_json()}

    @staticmethod
    def from_json(data: object, names: int) -> Step:
        """The step `to_json` wrote, of a scenario of `names` namespaces; `UsageError` else."""
        if data == {"restart": True}:
            return Step()
        if not isinstance(data, dict) or set(data) != {"ns", "op"}:
            raise UsageError(f"a restart step is {{ns, op}} or {{restart: true}}, not {show(data)}")
        ns = data["ns"]
        if type(ns) is not int or not 0 <= ns < names:
            raise UsageError(f"a restart step's ns must be below {names}, not {show(ns)}")
        return Step(ns, Op.from_json(data["op"]))


@dataclass(frozen=True)
class Scenario:
    """One run: its kind of restart, its namespaces and its steps.

    A clean scenario restarts at each of its restart steps; a kill scenario has exactly one, the
    point the kill is sent at, and every call of it runs in the child."""

    kind: str
    names: tuple[str, ...]
    steps: tuple[Step, ...]
    delay: float = 0.0
    """Seconds from the acknowledgement the kill follows to the kill: a kill that lands in the
    middle of the next call (0: at once)."""

    def calls(self) -> list[Step]:
        return [s for s in self.steps if s.op is not None]

    @property
    def kill_after(self) -> int:
        """The index of the call whose acknowledgement the kill is sent after (-1: the open)."""
        return sum(1 for s in self.steps[: self.steps.index(Step())] if s.op is not None) - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "names": list(self.names),
            "steps": [s.to_json() for s in self.steps],
            "delay": self.delay,
        }

    @staticmethod
    def from_json(data: object) -> Scenario:
        """The scenario `to_json` wrote; `UsageError` for anything else (the part's own
        namespace names only, a kill with one kill point and a delay of a second at most)."""
        if not isinstance(data, dict) or data.get("kind") not in (CLEAN, KILL):
            raise UsageError(f"a restart scenario's kind is {CLEAN} or {KILL}")
        names, steps, delay = data.get("names"), data.get("steps"), data.get("delay", 0.0)
        if not isinstance(names, list) or not names or not set(names) <= set(_NAMES):
            raise UsageError(f"a restart scenario's names are some of {', '.join(_NAMES)}")
        if len(set(names)) != len(names):
            raise UsageError("a restart scenario names each namespace once")
        if not isinstance(steps, list) or len(steps) > _MOST_STEPS:
            raise UsageError(f"a restart scenario has a list of {_MOST_STEPS} steps at most")
        if type(delay) not in (int, float) or not 0 <= delay <= _MOST_DELAY:
            raise UsageError(f"a restart scenario's delay is 0 to {_MOST_DELAY:g} s")
        parsed = tuple(Step.from_json(s, len(names)) for s in steps)
        if data["kind"] == KILL and parsed.count(Step()) != 1:
            raise UsageError("a kill scenario has exactly one restart step, its kill point")
        return Scenario(data["kind"], tuple(names), parsed, float(delay))


@dataclass
class _Tally:
    runs: int = 0
    restarts: int = 0
    kills: int = 0
    calls: int = 0
    unsettled: int = 0
    """Runs given up on: a call of theirs got no definite answer."""

    def add(self, run: _Run) -> None:
        self.runs += 1
        self.restarts += run.restarts
        self.kills += run.scenario.kind == KILL
        self.calls += run.calls

    def __str__(self) -> str:
        return (
            f"{self.runs:,} runs, {self.restarts:,} clean restarts, {self.kills:,} kills, "
            f"{self.calls:,} ops"
        )


def run_restart(subject: Subject, *, seconds: float, seed: int) -> PartResult:
    """Seeded runs until `seconds` are used (at least one); the first failure, minimised within
    what is left of `seconds`."""
    started = time.monotonic()
    if not subject.reopens:
        return PartResult("restart", Status.NOT_CHECKED, _cannot_reopen(subject))
    no_kills = _cannot_kill()
    not_checked = [] if no_kills is None else [no_kills]
    limits, first = _fresh(subject)
    rng = random.Random(seed)
    tally = _Tally()
    while tally.runs + tally.unsettled < 1 or time.monotonic() - started < seconds:
        kind = KILL if no_kills is None and (tally.runs + tally.unsettled) % 2 else CLEAN
        scenario = _generate(random.Random(rng.getrandbits(64)), kind, limits, first)
        run = _Run(subject, scenario, limits, seed)
        try:
            found = run.execute()
        except _Unsettled:
            tally.unsettled += 1
            continue
        tally.add(run)
        if found is not None:
            found_after = time.monotonic() - started
            scenario, found = _blame(subject, scenario, limits, seed, found)
            budget = min(_MINIMISE_SECONDS, max(1.0, seconds - found_after))
            found = _minimise(subject, scenario, limits, seed, found, budget)
            calls = len(Scenario.from_json(found.details["scenario"]).calls())
            summary = (
                f"{tally}; run {tally.runs} ({kind}) failed, minimised to {calls} "
                f"call{'s' if calls != 1 else ''}"
            )
            took = time.monotonic() - started
            return PartResult(
                "restart", Status.FAILED, summary, took, [found], not_checked, found_after
            )
    if tally.unsettled:
        not_checked.append(
            f"{tally.unsettled} runs given up: a call got no definite answer (KvUnavailable, or "
            f"KvIndeterminate from a read) in {_TRIES} tries"
        )
    summary = f"{tally}, nothing lost" + (f"; no kills: {no_kills}" if no_kills else "")
    status = Status.PASSED if tally.runs else Status.NOT_CHECKED
    return PartResult("restart", status, summary, time.monotonic() - started, [], not_checked)


def replay_restart(subject: Subject, details: dict[str, Any]) -> Violation | None:
    """Run a reported scenario again (a kill one up to a few times); its violation, or None.

    Raises `UsageError` where it cannot run (a factory that cannot reopen, a kill without fork)
    or when `details` are not a scenario."""
    if not subject.reopens:
        raise UsageError(f"cannot replay a restart: {_cannot_reopen(subject)}")
    scenario = Scenario.from_json(details.get("scenario"))
    if scenario.kind == KILL and (reason := _cannot_kill()) is not None:
        raise UsageError(f"cannot replay a kill: {reason}")
    limits, _ = _fresh(subject)
    for _ in range(_KILL_TRIES if scenario.kind == KILL else 1):
        found = _attempt(_Run(subject, scenario, limits, details.get("seed")))
        if found is not None:
            return found
    return None


def _cannot_reopen(subject: Subject) -> str:
    why = (
        "this one returns namespaces"
        if not subject.returns_store
        else "this one takes no location= argument"
    )
    return f"needs a store factory taking location= (to reopen a store): {why}"


def _cannot_kill() -> str | None:
    """Why this process cannot run kills, or None: a kill forks, from the main thread only."""
    if not hasattr(os, "fork") or "fork" not in multiprocessing.get_all_start_methods():
        return "killing a store's process needs os.fork, which this platform lacks"
    if threading.current_thread() is not threading.main_thread():
        return "killing a store's process forks, which is done only from the main thread"
    return None


def _fresh(subject: Subject) -> tuple[KvLimits, int]:
    """The limits a fresh namespace of the factory's advertises and its generation: what the
    calls are generated within, and the generation their fences start from (the runs read
    their own namespaces' generations; this one only makes fences current as intended)."""
    location = subject.location()
    store = subject.open_store(location=location, track=False)
    try:
        try:
            kv = store.namespace(_NAMES[0])
        except Exception as e:
            raise FactoryFailed(f"store.namespace({_NAMES[0]!r})", e) from e
        generation = _observe(kv, Op.of("generation"))
        first = generation.value if not generation.failed else 0
        return subject.limits_of(kv, None), first
    finally:
        _close_quietly(store)
        shutil.rmtree(location, ignore_errors=True)


# --- generating a run ---------------------------------------------------------------------------


def _generate(rng: random.Random, kind: str, limits: KvLimits, first: int) -> Scenario:
    names = _NAMES[: rng.choice((2, 3))]
    shadows = [Model(limits, generation=first) for _ in names]
    calls: list[Step] = []
    for number in range(rng.randint(6, 40)):
        ns = rng.randrange(len(names))
        op = _next_op(rng, shadows[ns], limits, number)
        shadows[ns].apply(op)
        calls.append(Step(ns, op))
    n = len(calls)
    delay = 0.0
    if kind == CLEAN:
        cuts = set(rng.sample(range(1, n), rng.randint(0, 2))) | {n}
    else:
        cuts = {rng.randint(1, n)}
        delay = rng.choice((0.0, 0.0, rng.uniform(0, 0.001), rng.uniform(0, 0.02)))
    steps: list[Step] = []
    for done, call in enumerate(calls, 1):
        steps.append(call)
        if done in cuts:
            steps.append(Step())
    return Scenario(kind, names, tuple(steps), delay)


def _next_op(rng: random.Random, shadow: Model, limits: KvLimits, number: int) -> Op:
    """A call chosen against `shadow` (the namespace as the model has it by then), so that
    fences are current or stale as intended and deletes mostly hit."""

    def small() -> bytes:
        return b"v%d." % number + rng.randbytes(rng.randint(0, 12))

    def keys(most: int) -> list[bytes]:
        pool = shadow.keys if shadow.keys and rng.random() < 0.7 else list(_KEYS)
        return rng.sample(pool, min(len(pool), rng.randint(1, most)))

    gen = shadow.generation
    fenced: dict[str, int] = {"fence": gen} if rng.random() < 0.4 else {}
    r = rng.random()
    if r < 0.06:
        size = max(1, min(limits.max_value_bytes, limits.max_batch_bytes - 3))
        return Op.of("put", {rng.choice(_KEYS): rng.randbytes(size)}, **fenced)
    if r < 0.38:
        return Op.of("put", {k: small() for k in rng.sample(_KEYS, rng.randint(1, 3))}, **fenced)
    if r < 0.50:
        return Op.of("delete", keys(2), **fenced)
    if r < 0.62:
        gone = keys(2)
        put = {k: small() for k in rng.sample([k for k in _KEYS if k not in gone], 2)}
        return Op.of("write", put=put, delete=gone, **fenced)
    if r < 0.70:
        start, end = sorted(rng.sample(_KEYS, 2))
        return Op.of("delete_range", start, end, **fenced)
    if r < 0.83:
        return Op.of("takeover")
    if r < 0.95:
        stale = rng.choice([g for g in (gen - 1, gen + 1) if g >= 0])
        method = rng.choice(("put", "put", "delete", "delete_range", "drop"))
        if method == "put":
            return Op.of("put", {rng.choice(_KEYS): small()}, fence=stale)
        if method == "delete":
            return Op.of("delete", keys(2), fence=stale)
        if method == "delete_range":
            return Op.of("delete_range", _KEYS[0], _KEYS[-1], fence=stale)
        return Op.of("drop", fence=stale)
    return Op.of("drop", **fenced)


# --- running one ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Acked:
    """A call the namespace acknowledged: its place in the run, and how the report shows it."""

    number: int
    op: Op
    line: str


@dataclass
class _Seen:
    """A reopened namespace as its reads show it."""

    contents: Outcome
    generation: Outcome
    used: Outcome


class _Unsettled(Exception):
    """A call got no definite answer in `_TRIES` tries: its run is given up, neither passed nor
    failed."""


def _observe(kv: ActorKv, op: Op) -> Outcome:
    """`op` on `kv`, made again while it answers `KvUnavailable` (it applied nothing) or, for a
    read, `KvIndeterminate` (it changed nothing); raises `_Unsettled` after `_TRIES` tries. An
    error that is no `KvError`, or a result of another type than the contract's, is an outcome
    no call is allowed (its `errors` a marker)."""
    for _ in range(_TRIES):
        try:
            outcome = observe(kv, op)
        except Exception as e:
            return Outcome(errors=frozenset({KvError}), raised=e)
        raised = outcome.raised
        if not (
            isinstance(raised, KvUnavailable)
            or (isinstance(raised, KvIndeterminate) and op.method in READS)
        ):
            return outcome
    raise _Unsettled(f"{op} {_said(outcome)}, {_TRIES} times")


def _settle(kv: ActorKv, model: Model, op: Op) -> tuple[Model, Outcome | None] | str:
    """After `op` answered `KvIndeterminate`: the namespace read back, and the model that
    follows it, with the outcome `op` had if it applied (None: it had not). The reads, shown,
    when the namespace is as neither."""
    after = model.copy()
    applied = after.apply(op)
    reads = ("list", "generation", "used_bytes")
    seen = [_observe(kv, Op.of(method)) for method in reads]
    for candidate, outcome in ((after, applied), (model, None)):
        wanted = (candidate.contents(), candidate.generation, candidate.used)
        if all(Outcome(w).admits(got) for w, got in zip(wanted, seen, strict=True)):
            return candidate, outcome
    return "; ".join(f"{m}() {_said(o)}" for m, o in zip(reads, seen, strict=True))


_UNSETTLED_EXPECTED: Final = "the namespace as it was before the call, or as the call leaves it"


def _clause_of(observed: Outcome) -> _Clause:
    """The clause a wrong answer breaks: its type's, or the answer's."""
    return _TYPES if isinstance(observed.raised, ResultTypeError) else _ANSWERS


def _said(outcome: Outcome) -> str:
    """An outcome as a report's sequence shows it: `-> value` or `raised Error`."""
    if isinstance(outcome.raised, ResultTypeError):
        return str(outcome.raised)
    if outcome.raised is not None:
        return f"raised {show(outcome.raised)}"
    if outcome.failed:
        return "raised " + " or ".join(sorted(e.__name__ for e in outcome.errors))
    return f"-> {show(outcome.value)}"


def _line(handle: str, op: Op, outcome: Outcome) -> str:
    return f"{handle}.{op} {_said(outcome)}"


def _handle(ns: int) -> str:
    return "kv" if ns == 0 else f"kv{ns + 1}"


class _Run:
    """One scenario against the subject: the models of its namespaces follow what the store
    acknowledged (invariant: `models[i]` is `history[i]` applied to an empty namespace), and
    `lines` is the report's sequence so far."""

    def __init__(
        self, subject: Subject, scenario: Scenario, limits: KvLimits, seed: int | None
    ) -> None:
        self.subject = subject
        self.scenario = scenario
        self.limits = limits
        self.seed = seed
        self.first = [0 for _ in scenario.names]
        """Each namespace's generation when the run opened it: where its model starts."""
        self.models = [Model(limits) for _ in scenario.names]
        self.history: list[list[_Acked]] = [[] for _ in scenario.names]
        self.lines = ["store = factory(location=L)"] + [
            f"{_handle(i)} = store.namespace({name!r})" for i, name in enumerate(scenario.names)
        ]
        self.calls = 0
        self.restarts = 0
        self.restart = ""
        """How the last restart was done, as the report shows it."""

    def execute(self) -> Violation | None:
        location = self.subject.location()
        try:
            return self._clean(location) if self.scenario.kind == CLEAN else self._kill(location)
        finally:
            shutil.rmtree(location, ignore_errors=True)

    def violation(self, clause: _Clause, call: str, got: str, expected: str = "") -> Violation:
        return Violation(
            part="restart",
            clause=clause.name,
            requires=clause.requires,
            call=call,
            got=got,
            expected=expected,
            sequence=list(self.lines),
            seed=self.seed,
            details={"scenario": self.scenario.to_json(), "seed": self.seed},
        )

    def _begin(self, generations: list[Outcome]) -> Violation | None:
        """The models start at the generations the namespaces were opened at."""
        for ns, got in enumerate(generations):
            call = f"{_handle(ns)}.generation()"
            self.lines.append(f"{call} {_said(got)}")
            if got.failed:
                return self.violation(_clause_of(got), call, _said(got), "an int")
            self.first[ns] = got.value
            self.models[ns] = Model(self.limits, generation=got.value)
        return None

    def _ack(self, ns: int, op: Op, outcome: Outcome, note: str = "") -> None:
        line = _line(_handle(ns), op, outcome)
        self.history[ns].append(_Acked(sum(map(len, self.history)), op, line))
        self.lines.append(line + note)

    # --- clean restarts ---------------------------------------------------------------------

    def _clean(self, location: Path) -> Violation | None:
        last = max((i for i, s in enumerate(self.scenario.steps) if s.op is None), default=-1)
        store: Any = None
        try:
            store, kvs = self._open(location)
            found = self._begin([_observe(kv, Op.of("generation")) for kv in kvs])
            if found is not None:
                return found
            for i, step in enumerate(self.scenario.steps):
                if step.op is not None:
                    found = self._call(kvs[step.ns], step.ns, step.op) or self._verify(kvs)
                    if found is not None:
                        return found
                    continue
                self.restart = "store.close(); store = factory(location=L)"
                self.lines.append(f"{self.restart}  (a clean restart)")
                closing, store = store, None
                try:
                    closing.close()
                except Exception as e:
                    return self.violation(_CLOSE_KEEPS, "store.close()", f"raised {show(e)}")
                self.restarts += 1
                reopened = self._reopen(location)
                if isinstance(reopened, Violation):
                    return reopened
                store, kvs = reopened
                found = self._check(kvs, None) or (self._takeovers(kvs) if i == last else None)
                if found is not None:
                    return found
            return None
        finally:
            if store is not None:
                _close_quietly(store)

    def _call(self, kv: ActorKv, ns: int, op: Op) -> Violation | None:
        observed = _observe(kv, op)
        self.calls += 1
        if isinstance(observed.raised, KvIndeterminate):
            return self._settled(kv, ns, op, observed)
        required = self.models[ns].apply(op)
        if not required.admits(observed):
            call = f"{_handle(ns)}.{op}"
            self.lines.append(f"{call} {_said(observed)}")
            return self.violation(_clause_of(observed), call, _said(observed), str(required))
        self._ack(ns, op, required)
        return None

    def _settled(self, kv: ActorKv, ns: int, op: Op, observed: Outcome) -> Violation | None:
        """`op` answered `KvIndeterminate`: the model follows what the namespace holds."""
        call = f"{_handle(ns)}.{op}"
        settled = _settle(kv, self.models[ns], op)
        if isinstance(settled, str):
            self.lines.append(f"{call} {_said(observed)}")
            got = f"{_said(observed)}, then {settled}"
            return self.violation(_ANSWERS, call, got, _UNSETTLED_EXPECTED)
        self.models[ns], applied = settled
        if applied is None:
            self.lines.append(f"{call} {_said(observed)}  (read back: it had not applied)")
        else:
            self._ack(ns, op, applied, f"  ({_said(observed)}; read back: it had applied)")
        return None

    def _verify(self, kvs: list[ActorKv]) -> Violation | None:
        """Every namespace must be as its model after each call of a clean run: a restart is
        blamed only for what it changed."""
        for ns, kv in enumerate(kvs):
            model, h = self.models[ns], _handle(ns)
            listed = _observe(kv, Op.of("list"))
            if not Outcome(model.contents()).admits(listed):
                try:
                    got = {bytes(k): bytes(v) for k, v in listed.value}
                    key = min(
                        k for k in got.keys() | model.values if got.get(k) != model.values.get(k)
                    )
                    text = self._got(kv, h, [key], [got.get(key)], "then")
                    expected = show([model.values.get(key)])
                except (TypeError, ValueError):
                    text, expected = f"then {h}.list() {_said(listed)}", show(model.contents())
                return self.violation(_clause_of(listed), self.lines[-1], text, expected)
            for method, want in (("generation", model.generation), ("used_bytes", model.used)):
                got_value = _observe(kv, Op.of(method))
                if not Outcome(want).admits(got_value):
                    text = f"then {h}.{method}() {_said(got_value)}"
                    clause = _clause_of(got_value)
                    return self.violation(clause, self.lines[-1], text, show(want))
        return None

    def _open(self, location: Path) -> tuple[Any, list[ActorKv]]:
        """The store at `location` and the run's namespaces of it; `FactoryFailed` if either
        fails."""
        store = self.subject.open_store(location=location, track=False)
        try:
            return store, [store.namespace(n) for n in self.scenario.names]
        except Exception as e:
            _close_quietly(store)
            raise FactoryFailed("store.namespace(...)", e) from e

    def _reopen(self, location: Path) -> tuple[Any, list[ActorKv]] | Violation:
        try:
            return self._open(location)
        except FactoryFailed as e:
            call = (
                "store.namespace(...)"
                if e.call == "store.namespace(...)"
                else "factory(location=L)"
            )
            return self.violation(_REOPENS, call, f"raised {show(e.error)}")

    # --- kills ------------------------------------------------------------------------------

    def _kill(self, location: Path) -> Violation | None:
        calls = self.scenario.calls()
        kill_after = self.scenario.kill_after
        acked = 0
        for index, status, text in _run_child(self.subject, location, self.scenario, self.limits):
            if status == _BROKEN:
                if index == _CRASHED:
                    raise RuntimeError(f"the restart check's child process failed:\n{text}")
                return self.violation(
                    _ANSWERS, "factory(location=L) in a forked process", text or "failed"
                )
            if status == _UNSETTLED:
                raise _Unsettled(text or "(cut short by the kill)")
            if index == _OPENED:
                assert text is not None
                found = self._begin([Outcome(g) for g in json.loads(text)])
                if kill_after < 0:
                    self.lines.append("SIGKILL once the store is open")
                if found is not None:
                    return found
                continue
            ns, op = calls[index].ns, calls[index].op
            assert op is not None
            if status == _NOT_APPLIED:
                self.lines.append(f"{_handle(ns)}.{op} raised KvIndeterminate  (not applied)")
                acked += 1
                continue
            required = self.models[ns].apply(op)
            if status == _WRONG:
                got = text or "(cut short by the kill)"
                self.lines.append(f"{_handle(ns)}.{op} {got}")
                return self.violation(_ANSWERS, f"{_handle(ns)}.{op}", got, str(required))
            self._ack(ns, op, required, "  (after the kill was sent)" if index > kill_after else "")
            if index == kill_after:
                after = (
                    f"{self.scenario.delay * 1000:.2f} ms after" if self.scenario.delay else "once"
                )
                self.lines.append(f"SIGKILL {after} the call above returned")
            acked += 1
        self.calls += acked
        if acked <= kill_after:
            self.lines.append(f"SIGKILL after {_CHILD_SECONDS:g} s, or the process died, first")
        in_flight = calls[acked] if acked < len(calls) else None
        if in_flight is not None:
            assert in_flight.op is not None
            self.lines.append(f"{_handle(in_flight.ns)}.{in_flight.op}  (in flight at the kill)")
        self.restart = "SIGKILL; store = factory(location=L)"
        self.lines.append("store = factory(location=L)  (reopened after the kill)")
        reopened = self._reopen(location)
        if isinstance(reopened, Violation):
            return reopened
        store, kvs = reopened
        try:
            return self._check(kvs, in_flight) or self._takeovers(kvs)
        finally:
            _close_quietly(store)

    # --- checking a reopened store ----------------------------------------------------------

    def _check(self, kvs: list[ActorKv], in_flight: Step | None) -> Violation | None:
        """Each namespace must be as its model, or (in flight's) as its model after that call.

        Contents are compared first, then generations, then usage; within the first that
        differs the report is of the earliest acknowledged call whose effect is missing."""
        seen: list[_Seen] = []
        for ns, kv in enumerate(kvs):
            reads = []
            for method in ("list", "generation", "used_bytes"):
                outcome = _observe(kv, Op.of(method))
                if outcome.raised is not None:
                    got = f"after the restart, raised {show(outcome.raised)}"
                    return self.violation(_REOPENS, f"{_handle(ns)}.{method}()", got)
                reads.append(outcome)
            seen.append(_Seen(*reads))
        candidates = [[m] for m in self.models]
        applied = Outcome(None)
        if in_flight is not None and in_flight.op is not None:
            after = self.models[in_flight.ns].copy()
            applied = after.apply(in_flight.op)
            if not applied.failed and after.state() != self.models[in_flight.ns].state():
                candidates[in_flight.ns].append(after)
        aspects = (
            (lambda c, s: Outcome(c.contents()).admits(s.contents), self._wrong_contents),
            (lambda c, s: Outcome(c.generation).admits(s.generation), self._wrong_generation),
            (lambda c, s: Outcome(c.used).admits(s.used), self._wrong_usage),
        )
        for admits, wrong in aspects:
            findings: list[_Finding] = []
            for ns, kv in enumerate(kvs):
                kept = [c for c in candidates[ns] if admits(c, seen[ns])]
                if kept:
                    candidates[ns] = kept
                else:
                    findings.append(wrong(ns, kv, seen[ns], candidates[ns], in_flight))
            if findings:
                return min(findings, key=lambda f: f.number).violation
        for ns, (chosen, *_) in enumerate(candidates):
            if chosen is not self.models[ns]:
                assert in_flight is not None and in_flight.op is not None
                self._ack(ns, in_flight.op, applied, "  (it had applied)")
                self.models[ns] = chosen
        return None

    def _wrong_contents(
        self, ns: int, kv: ActorKv, seen: _Seen, candidates: list[Model], in_flight: Step | None
    ) -> _Finding:
        h = _handle(ns)
        try:
            got = {bytes(k): bytes(v) for k, v in seen.contents.value}
        except (TypeError, ValueError):
            got = None
        if got is None or any(got == c.values for c in candidates):
            text = f"after the restart, {h}.list() -> {show(seen.contents.value)}"
            expected = " or ".join(show(c.contents()) for c in candidates)
            return _Finding(math.inf, self.violation(_NOTHING_ELSE, self.restart, text, expected))
        states = self._states(ns)
        lost: list[tuple[int, bytes]] = []
        invented: list[bytes] = []
        keys = sorted(set(got).union(*(c.values for c in candidates)))
        for key in keys:
            value = got.get(key)
            if value in {c.values.get(key) for c in candidates}:
                continue
            was = [j for j, s in enumerate(states) if s.values.get(key) == value]
            if not was:
                invented.append(key)
                continue
            j = was[-1] + 1
            while states[j].values.get(key) == value:
                j += 1
            lost.append((self.history[ns][j - 1].number, key))
        if lost:
            number, key = min(lost)
            acked = next(a for a in self.history[ns] if a.number == number)
            clause = _CLOSE_KEEPS if self.scenario.kind == CLEAN else _KILL_KEEPS
            expected = _either([c.values.get(key)] for c in candidates)
            got_text = self._got(kv, h, [key], [got.get(key)])
            return _Finding(number, self.violation(clause, acked.line, got_text, expected))
        if invented:
            key = invented[0]
            expected = _either([c.values.get(key)] for c in candidates)
            got_text = self._got(kv, h, [key], [got.get(key)])
            return _Finding(
                math.inf, self.violation(_NOTHING_ELSE, self.restart, got_text, expected)
            )
        assert in_flight is not None and in_flight.op is not None
        torn = [k for k in keys if len({c.values.get(k) for c in candidates}) > 1]
        expected = _either([c.values.get(k) for k in torn] for c in candidates)
        got_text = self._got(kv, h, torn, [got.get(k) for k in torn])
        call = f"{_handle(in_flight.ns)}.{in_flight.op}"
        return _Finding(math.inf, self.violation(_WHOLE, call, got_text, expected))

    def _got(
        self,
        kv: ActorKv,
        h: str,
        keys: list[bytes],
        listed: list[bytes | None],
        when: str = "after the restart,",
    ) -> str:
        """What `get` says of `keys`, and what `list` said if it differs."""
        got = _observe(kv, Op.of("get", keys))
        text = f"{when} {h}.get({show(keys)}) {_said(got)}"
        if not Outcome(listed).admits(got):
            text += f" (and list() has {show(listed)})"
        return text

    def _wrong_generation(
        self, ns: int, kv: ActorKv, seen: _Seen, candidates: list[Model], in_flight: Step | None
    ) -> _Finding:
        value = seen.generation.value
        states = self._states(ns)
        was = [j for j, s in enumerate(states) if type(value) is int and s.generation == value]
        got = f"after the restart, {_handle(ns)}.generation() -> {show(value)}"
        expected = " or ".join(str(c.generation) for c in candidates)
        if not was or was[-1] + 1 == len(states):
            return _Finding(math.inf, self.violation(_GENERATION, self.restart, got, expected))
        j = was[-1] + 1
        while states[j].generation == value:
            j += 1
        acked = self.history[ns][j - 1]
        return _Finding(acked.number, self.violation(_GENERATION, acked.line, got, expected))

    def _wrong_usage(
        self, ns: int, kv: ActorKv, seen: _Seen, candidates: list[Model], in_flight: Step | None
    ) -> _Finding:
        got = f"after the restart, {_handle(ns)}.used_bytes() -> {show(seen.used.value)}"
        expected = " or ".join(str(c.used) for c in candidates)
        return _Finding(math.inf, self.violation(_USAGE, self.restart, got, expected))

    def _states(self, ns: int) -> list[Model]:
        """The namespace after each of its acknowledged calls, from empty."""
        model = Model(self.limits, generation=self.first[ns])
        states = [model.copy()]
        for acked in self.history[ns]:
            model.apply(acked.op)
            states.append(model.copy())
        return states

    def _takeovers(self, kvs: list[ActorKv]) -> Violation | None:
        """After the last restart, a takeover of each namespace must move its generation on."""
        for ns, kv in enumerate(kvs):
            op = Op.of("takeover")
            before = self.models[ns].generation
            observed = _observe(kv, op)
            if isinstance(observed.raised, KvIndeterminate):
                if (found := self._settled(kv, ns, op, observed)) is not None:
                    return found
                continue
            required = self.models[ns].apply(op)
            if not required.admits(observed):
                got = f"after the restart, {_line(_handle(ns), op, observed)}"
                expected = f"{required.value} (generation() was {before})"
                return self.violation(_GENERATION, f"{_handle(ns)}.takeover()", got, expected)
            self._ack(ns, op, required)
        return None


@dataclass(frozen=True)
class _Finding:
    """A difference found in a reopened namespace: the acknowledged call it lost (its number;
    infinite where it lost none), and its report."""

    number: float
    violation: Violation


def _either(values: Any) -> str:
    return " or ".join(dict.fromkeys(show(v) for v in values))


def _close_quietly(store: Any) -> None:
    """Close a store the run is done with; a failure here is not what the run checks."""
    with contextlib.suppress(Exception):
        store.close()


# --- the child of a kill ----------------------------------------------------------------------


def _run_child(
    subject: Subject, location: Path, scenario: Scenario, limits: KvLimits
) -> list[tuple[int, int, str | None]]:
    """Run `scenario`'s calls in a forked child and kill it right after the acknowledgement of
    the call the kill follows; every acknowledgement it made before it died, in order."""
    acks, ack_w = os.pipe()
    hold_r, hold = os.pipe()
    try:
        child = multiprocessing.get_context("fork").Process(
            target=_child,
            args=(subject, location, scenario, limits, ack_w, hold_r, (acks, hold)),
            daemon=True,
        )
        try:
            child.start()
        finally:
            os.close(ack_w)
            os.close(hold_r)
        try:
            return _kill_when_due(child, acks, scenario)
        finally:
            if child.exitcode is not None:
                child.close()
    finally:
        os.close(acks)
        os.close(hold)


def _kill_when_due(child: Any, acks: int, scenario: Scenario) -> list[tuple[int, int, str | None]]:
    """Read acknowledgements until the kill is due (or the child stops, or `_CHILD_SECONDS`
    pass), kill it, and read the rest of what it sent before it died."""
    received = _Received()
    poll = select.poll()
    poll.register(acks, select.POLLIN)
    deadline = time.monotonic() + _CHILD_SECONDS
    while time.monotonic() < deadline:
        if not poll.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
            break
        chunk = os.read(acks, 1 << 16)
        if not chunk:
            break
        if received.feed(chunk, scenario.kill_after):
            time.sleep(scenario.delay)
            break
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGKILL)
    child.join(_CHILD_SECONDS)
    os.set_blocking(acks, False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(acks, 1 << 16):
            received.feed(chunk, scenario.kill_after)
    received.finish()
    return received.records


class _Received:
    """The child's acknowledgements as they arrive over the pipe."""

    def __init__(self) -> None:
        self.buffer = b""
        self.records: list[tuple[int, int, str | None]] = []

    def feed(self, chunk: bytes, kill_after: int) -> bool:
        """Take `chunk`; whether the kill is due (the kill point, or the child stopped)."""
        self.buffer += chunk
        due = False
        while len(self.buffer) >= _RECORD.size:
            index, status = _RECORD.unpack_from(self.buffer)
            text: str | None = None
            end = _RECORD.size
            if _texted(index, status):
                if len(self.buffer) < end + _LENGTH.size:
                    break
                (length,) = _LENGTH.unpack_from(self.buffer, end)
                end += _LENGTH.size + length
                if len(self.buffer) < end:
                    break
                text = self.buffer[_RECORD.size + _LENGTH.size : end].decode()
            self.buffer = self.buffer[end:]
            self.records.append((index, status, text))
            due = due or status not in (_OK, _NOT_APPLIED) or index == kill_after
        return due

    def finish(self) -> None:
        """A report the kill cut short is kept, without its text."""
        if len(self.buffer) >= _RECORD.size:
            index, status = _RECORD.unpack_from(self.buffer)
            self.records.append((index, status, None))
        self.buffer = b""


def _texted(index: int, status: int) -> bool:
    """Whether a text follows the record (see `_OK`)."""
    return status not in (_OK, _NOT_APPLIED) or index == _OPENED


def _send(fd: int, index: int, status: int, text: str = "") -> None:
    data = _RECORD.pack(index, status)
    if _texted(index, status):
        encoded = text.encode()
        data += _LENGTH.pack(len(encoded)) + encoded
    while data:
        data = data[os.write(fd, data) :]


def _child(
    subject: Subject,
    location: Path,
    scenario: Scenario,
    limits: KvLimits,
    ack: int,
    hold: int,
    inherited: tuple[int, ...],
) -> None:
    """The forked child of a kill: opens its own store, runs every call, acknowledging each as
    the model requires it, then waits to be killed. It touches nothing of its parent's but what
    fork copied, and leaves by `os._exit` (no atexit, no finalizers run after a fork)."""
    try:
        for fd in inherited:
            os.close(fd)
        try:
            store = subject.open_store(location=location, track=False)
            kvs = [store.namespace(n) for n in scenario.names]
            generations = [_observe(kv, Op.of("generation")) for kv in kvs]
        except _Unsettled as e:
            _send(ack, _OPENED, _UNSETTLED, str(e))
            return
        except Exception as e:
            _send(ack, _OPENED, _BROKEN, f"raised {show(e)}")
            return
        wrong = next((g for g in generations if g.failed), None)
        if wrong is not None:
            _send(ack, _OPENED, _BROKEN, f"generation() {_said(wrong)}")
            return
        _send(ack, _OPENED, _OK, json.dumps([g.value for g in generations]))
        models = [Model(limits, generation=g.value) for g in generations]
        for index, step in enumerate(scenario.calls()):
            assert step.op is not None
            status, text = _child_call(kvs[step.ns], models, step)
            _send(ack, index, status, text)
            if status not in (_OK, _NOT_APPLIED):
                return
        os.read(hold, 1)
    except BaseException:
        _send(ack, _CRASHED, _BROKEN, traceback.format_exc())
    finally:
        os._exit(0)


def _child_call(kv: ActorKv, models: list[Model], step: Step) -> tuple[int, str]:
    """One call of a kill's child, as `_Run._call` makes it in a clean run: its status and the
    text that goes with it."""
    assert step.op is not None
    try:
        observed = _observe(kv, step.op)
        if isinstance(observed.raised, KvIndeterminate):
            settled = _settle(kv, models[step.ns], step.op)
            if isinstance(settled, str):
                return _WRONG, f"{_said(observed)}, then {settled}"
            models[step.ns], applied = settled
            return (_NOT_APPLIED if applied is None else _OK), ""
    except _Unsettled as e:
        return _UNSETTLED, str(e)
    if not models[step.ns].apply(step.op).admits(observed):
        return _WRONG, _said(observed)
    return _OK, ""


# --- minimising -------------------------------------------------------------------------------


def _attempt(run: _Run) -> Violation | None:
    """A re-run's violation; None also when it got no definite answer (it proves nothing)."""
    try:
        return run.execute()
    except _Unsettled:
        return None


def _blame(
    subject: Subject, scenario: Scenario, limits: KvLimits, seed: int, found: Violation
) -> tuple[Scenario, Violation]:
    """A kill run's calls again, clean and with no restart: if the namespaces go wrong without
    one, the report is of the call that did it, not of the kill (a clean run checks as it goes)."""
    if scenario.kind == CLEAN or found.clause in (_ANSWERS.name, _REOPENS.name):
        return scenario, found
    bare = Scenario(CLEAN, scenario.names, tuple(scenario.calls()))
    before = _attempt(_Run(subject, bare, limits, seed))
    return (bare, before) if before is not None else (scenario, found)


def _minimise(
    subject: Subject,
    scenario: Scenario,
    limits: KvLimits,
    seed: int,
    found: Violation,
    seconds: float,
) -> Violation:
    """The shortest scenario still failing the same clause that delta debugging finds within
    `seconds`, and its violation. A kill keeps its kill point, after one call at
    least, and loses the calls after it first (they race the kill); namespaces no call uses are
    dropped last. Not hypothesis's shrinker: where a kill lands varies from run to run, so a
    candidate is tried `_KILL_TRIES` times (hypothesis takes one passing run as final), and it
    does not know to keep the kill point."""
    deadline = time.monotonic() + seconds
    tries = _KILL_TRIES if scenario.kind == KILL else 1

    def fails(steps: list[Step], names: tuple[str, ...] = scenario.names) -> Violation | None:
        candidate = replace(scenario, names=names, steps=tuple(steps))
        for _ in range(tries):
            again = _attempt(_Run(subject, candidate, limits, seed))
            if again is not None and again.clause == found.clause:
                return again
        return None

    steps = list(scenario.steps)
    if scenario.kind == KILL:
        before = steps[: steps.index(Step()) + 1]
        if len(before) < len(steps) and (again := fails(before)) is not None:
            steps, found = before, again
    parts = 2
    while len(steps) > 1 and time.monotonic() < deadline:
        size = math.ceil(len(steps) / parts)
        for start in range(0, len(steps), size):
            kept = steps[start : start + size]
            kept = [s for s in kept if s.op is None] if scenario.kind == KILL else []
            candidate = steps[:start] + kept + steps[start + size :]
            if len(candidate) == len(steps) or (scenario.kind == KILL and candidate[0] == Step()):
                continue
            if (again := fails(candidate)) is not None:
                steps, found = candidate, again
                parts = max(parts - 1, 2)
                break
            if time.monotonic() >= deadline:
                break
        else:
            if size == 1:
                break
            parts = min(parts * 2, len(steps))
    used = sorted({s.ns for s in steps if s.op is not None})
    if len(used) < len(scenario.names):
        renumber = {ns: i for i, ns in enumerate(used)}
        fewer = [s if s.op is None else Step(renumber[s.ns], s.op) for s in steps]
        names = tuple(scenario.names[ns] for ns in used) or scenario.names[:1]
        if (again := fails(fewer, names)) is not None:
            found = again
    return found
