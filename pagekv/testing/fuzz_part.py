"""The fuzz part: pagekv's page-I/O fuzz over the backend, every KV call checked on the model.

The fuzz alone sees a broken backend only through its symptoms (a corrupt page, a fence that
fails): it cannot say which call misbehaved. So each namespace it is given is `Monitored`: every
call the VFS makes is mirrored on the contract's `Model`, and the first call whose answer the model
does not admit is the finding, named with its arguments. A run the fuzz fails with no such call is
reported with the fuzz's own failure and the minimised steps, unless the same steps fail on
pagekv's memory store with the namespace's limits too: limits too small for the VFS (its keys,
a page in a value, a commit in a batch, the database in the quota) leave that run not checked.

The VFS takes any KV error as fatal for its connection. So the monitor makes a call again
itself while it answers `KvUnavailable` (it applied nothing), and a read while it answers
`KvIndeterminate` (it changed nothing): the VFS sees neither. A write answering
`KvIndeterminate` goes up to the VFS, and the model keeps both states (applied and not); a run
that then fails, or that got no definite answer in `_TRIES` tries, is not checked, with the
reason, rather than failed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from pagekv.fuzz import FuzzConfig, Runner, Step, minimize, run_seed
from pagekv.fuzz.session import run_options
from pagekv.fuzz.steps import EVENTS, from_json, to_json
from pagekv.kv import ActorKv, KvError, KvIndeterminate, KvLimits, KvUnavailable, MemoryStore
from pagekv.kv.wrappers import KvWrapper
from pagekv.testing.model import (
    READS,
    RESULT_TYPES,
    RESULT_TYPES_REQUIRES,
    Model,
    Op,
    Outcome,
    wrong_type,
)
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.subject import FactoryFailed, Subject, UsageError
from pagekv.testing.violation import Violation, show

T = TypeVar("T")
_SEQUENCE_SHOWN: Final = 30
_MAX_BLOB: Final = 512 * 1024
"""Blobs up to 512 KiB: values at the 128 KiB limit, staged commits, in a run of a second."""
_EVENTS: Final = frozenset(EVENTS) - {"quota"}
"""Quota runs need limits of the fuzz's choosing; the contract part checks the quota."""
_CANDIDATES: Final = 8
"""States the model keeps after indeterminate outcomes before it gives up checking a run."""
_TRIES: Final = 5
"""Times the monitor makes a call that answers `KvUnavailable` (a read: or `KvIndeterminate`)."""
_MINIMISE_LEAST: Final = 2.0
"""Seconds a finding is minimised for at least (else what is left of the part's time)."""
_DB_OPTIONS: Final = {"in_place_commits": bool}
"""The database options a replay file may set, and their types (those `run_options` makes)."""

_CLAUSES: Final = {
    "get": "get returns the value last written to each key",
    "list": "list returns the stored entries in range, in order",
    "write": "a write is applied or refused as the contract says",
    "delete_range": "delete_range deletes exactly [start, end)",
    "takeover": "takeover increments the generation by exactly one",
    "generation": "generation() is the latest takeover's",
    "used_bytes": "used_bytes() is the exact size of the stored keys and values",
    "drop": "drop removes everything and keeps the generation",
}


class Monitored(KvWrapper):
    """Mirrors every call on the contract's model and records the first one it does not admit.

    The backend's answers pass through unchanged, so the VFS above sees what it would see
    without the monitor. Calls are serialised (one lock), so the model's order is the calls'."""

    def __init__(self, inner: ActorKv, limits: Any) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.calls: list[str] = []
        self.violation: Violation | None = None
        self.unsettled: str | None = None
        """The first answer that was not definite: a `KvIndeterminate` write, or a call that
        answered `KvUnavailable` every try. A run that fails after it is not checked."""
        self._written_by: dict[bytes, int] = {}
        """Each key's latest write: the index in `calls` of the call that put it."""
        self._models: list[Model] = []
        self._models = [Model(limits, generation=self.generation())]

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        call = Op(op, args, tuple(kwargs.items()))
        with self._lock:
            attempt = 1
            while True:
                try:
                    result = fn(*args, **kwargs)
                except KvError as e:
                    again = isinstance(e, KvUnavailable) or (
                        isinstance(e, KvIndeterminate) and op in READS
                    )
                    if again and attempt < _TRIES:
                        self.calls.append(f"{call} raised {show(e)} (made again)")
                        attempt += 1
                        continue
                    if again or isinstance(e, KvIndeterminate):
                        self.unsettled = self.unsettled or f"{call} raised {show(e)}"
                    self._judge(call, Outcome(errors=frozenset({type(e)}), raised=e))
                    raise
                except Exception as e:
                    self._untyped(call, e)
                    raise
                problem = wrong_type(op, result)
                if problem is None:
                    self._judge(call, Outcome(result))
                else:
                    self._wrong_type(call, result, problem)
                return result

    def _wrong_type(self, op: Op, result: object, problem: str) -> None:
        self.calls.append(f"{op} -> {show(result)}")
        if self.violation is None:
            self.violation = Violation(
                part="fuzz",
                clause=RESULT_TYPES,
                requires=RESULT_TYPES_REQUIRES,
                call=f"kv.{op}",
                got=problem,
                sequence=self.calls[-_SEQUENCE_SHOWN:],
            )

    def _untyped(self, op: Op, error: Exception) -> None:
        self.calls.append(f"{op} raised {type(error).__name__}: {error}")
        if self.violation is None:
            self.violation = Violation(
                part="fuzz",
                clause="every error is a KvError",
                requires="a backend raises only the contract's typed errors (KvError subclasses)",
                call=f"kv.{op}",
                got=f"raised {type(error).__name__}: {error}",
                sequence=self.calls[-_SEQUENCE_SHOWN:],
            )

    def _judge(self, op: Op, observed: Outcome) -> None:
        self.calls.append(f"{op} {observed}")
        if self.violation is not None or not self._models:
            return
        if isinstance(observed.raised, KvUnavailable | KvIndeterminate) and op.method in READS:
            return
        if isinstance(observed.raised, KvIndeterminate):
            applied = [m.copy() for m in self._models]
            for m in applied:
                m.apply(op)
            self._models = (self._models + applied)[:_CANDIDATES]
            return
        admitted, required = [], None
        for model in self._models:
            expected = model.apply(op)
            if expected.admits(observed):
                admitted.append(model)
            elif required is None:
                required = expected
        if admitted:
            self._models = admitted
            if op.method == "write" and not observed.errors:
                for key in dict(op.kwargs)["put"]:
                    self._written_by[key] = len(self.calls) - 1
            return
        assert required is not None
        shown = self.calls[-_SEQUENCE_SHOWN:]
        self.violation = Violation(
            part="fuzz",
            clause=_CLAUSES.get(op.method, op.method),
            requires=f"{op.method} answers as the contract's model of the namespace does",
            call=f"kv.{op}",
            got=str(observed) + self._writers(op, observed, required, len(shown)),
            expected=str(required),
            sequence=shown,
        )

    def _writers(self, op: Op, observed: Outcome, required: Outcome, shown: int) -> str:
        """Which earlier calls wrote the keys a read got wrong: often the misbehaving call."""
        if op.method != "get" or observed.errors or required.errors:
            return ""
        keys = op.args[0]
        wrong = [k for k, a, b in zip(keys, observed.value, required.value, strict=False) if a != b]
        first = len(self.calls) - shown
        notes = [
            f"{show(k)} was last written by call {self._written_by[k] - first}"
            for k in wrong
            if self._written_by.get(k, -1) >= first
        ]
        return f" ({'; '.join(notes)})" if notes else ""


@dataclass
class _Runs:
    """Fresh monitored namespaces for fuzz runs, and what the latest one found."""

    subject: Subject
    monitors: list[Monitored] = field(default_factory=list)
    failed: FactoryFailed | None = None
    """The factory failing to open a run's namespace."""
    unsettled: str | None = None
    """A run's namespace that could not even be monitored: no definite first `generation()`."""
    limits: KvLimits | None = None
    """What the latest run's namespace advertised."""

    def __call__(self) -> ActorKv:
        try:
            kv = self.subject.namespace()
        except FactoryFailed as e:
            self.failed = e
            raise
        self.limits = self.subject.limits_of(kv, None)
        try:
            monitor = Monitored(kv, self.limits)
        except (KvUnavailable, KvIndeterminate) as e:
            self.unsettled = f"generation() raised {show(e)}"
            raise
        self.monitors.append(monitor)
        return monitor

    def found(self) -> Violation | None:
        if self.failed is not None:
            return self.failed.violation("fuzz")
        return next((m.violation for m in self.monitors if m.violation is not None), None)

    def unsure(self) -> str | None:
        """Why the latest run is not checked, if it is not."""
        return next((m.unsettled for m in self.monitors if m.unsettled), self.unsettled)

    def reset(self) -> None:
        self.monitors.clear()
        self.failed = self.unsettled = self.limits = None
        self.subject.close()


def _execute(runs: _Runs, steps: list[Step], options: dict[str, Any]) -> Violation | str | None:
    """Run steps on a fresh monitored namespace: the first violation, from the model or the
    fuzz; or why the run is not checked (a failure after an answer that was not definite, or
    one the same steps meet on pagekv's memory store with the namespace's limits)."""
    runs.reset()
    failure: Exception | None = None
    try:
        Runner(runs, **options).run(steps)
    except Exception as e:  # a FuzzFailure, or the backend failing the database's open
        failure = e
    found, unsure, limits = runs.found(), runs.unsure(), runs.limits
    runs.reset()
    if found is None and failure is not None:
        if unsure is not None:
            return f"{unsure}, which the VFS takes as fatal ({type(failure).__name__}: {failure})"
        if limits is not None and _fails_on_memory(limits, steps, options):
            return (
                "the VFS cannot run these steps within the namespace's limits: they fail on "
                f"pagekv's memory store with the same limits too ({type(failure).__name__}: "
                f"{failure})"
            )
        found = Violation(
            part="fuzz",
            clause="the database survives every step",
            requires="what pagekv fuzz checks: no acknowledged commit lost, no corruption, "
            "no storage error without an injected fault",
            got=f"{type(failure).__name__}: {failure}",
        )
    return found


def _fails_on_memory(limits: KvLimits, steps: list[Step], options: dict[str, Any]) -> bool:
    """Whether `steps` fail on pagekv's own memory store with `limits`: then a run failing on
    the backend, every call of which the model admitted, failed for its limits (a key, value,
    batch or quota too small for the VFS), not for the backend."""
    try:
        Runner(lambda: MemoryStore(limits=limits).namespace("fuzz"), **options).run(steps)
    except Exception:
        return True
    return False


def _config(seed: int, seconds: float) -> FuzzConfig:
    """The fuzz's configuration: `run_seed(run, _config(...))` is a run's steps, whatever the
    seed and seconds."""
    return FuzzConfig(seed=seed, seconds=seconds, events=_EVENTS, max_blob=_MAX_BLOB)


def run_fuzz(subject: Subject, *, seconds: float, seed: int) -> PartResult:
    started = time.monotonic()
    config = _config(seed, seconds)
    runs = _Runs(subject)
    rng = random.Random(seed)
    n = 0
    unsure: list[str] = []
    while time.monotonic() - started < seconds:
        n += 1
        run = rng.randrange(2**63)
        steps = run_seed(run, config)
        options = run_options(run, config)
        found = _execute(runs, steps, options)
        if isinstance(found, str):
            unsure.append(found)
        elif found is not None:
            return _failed(runs, found, run, steps, options, seed, started, seconds)
    not_checked = [f"{len(unsure)} of {n} runs: {unsure[0]}"] if unsure else []
    checked = n - len(unsure)
    if checked:
        summary = (
            f"{checked} runs of {config.steps_per_run} steps, every KV call as the model requires"
        )
    else:
        summary = f"none of {n} runs could be checked"
    status = Status.PASSED if checked else Status.NOT_CHECKED
    return PartResult("fuzz", status, summary, time.monotonic() - started, [], not_checked)


def _failed(
    runs: _Runs,
    found: Violation,
    run: int,
    steps: list[Step],
    options: dict[str, Any],
    seed: int,
    started: float,
    seconds: float,
) -> PartResult:
    took = time.monotonic() - started

    def fails(candidate: list[Step]) -> bool:
        again = _execute(runs, candidate, options)
        return isinstance(again, Violation) and again.clause == found.clause

    small = minimize(steps, fails, max(_MINIMISE_LEAST, seconds - took))
    final = _execute(runs, small, options)
    if not isinstance(final, Violation):
        final = found
    final.seed = seed
    final.details = {"run": run, "db_options": options, "steps": [to_json(s) for s in small]}
    summary = f"found in run {run}; {len(small)} fuzz steps replay it"
    elapsed = time.monotonic() - started
    return PartResult("fuzz", Status.FAILED, summary, elapsed, [final], [], took)


def replay_fuzz(subject: Subject, details: dict[str, Any]) -> Violation | None:
    """Run a reported run's steps again; its violation, or None (also when the run got an
    answer that was not definite). `UsageError` when `details` are not a run's."""
    steps, options = _decode(details)
    found = _execute(_Runs(subject), steps, options)
    if not isinstance(found, Violation):
        return None
    found.details = details
    return found


def _decode(details: dict[str, Any]) -> tuple[list[Step], dict[str, Any]]:
    options = details.get("db_options", {})
    if not isinstance(options, dict) or any(
        type(options[k]) is not _DB_OPTIONS.get(k) for k in options
    ):
        raise UsageError(f"a fuzz replay's db_options are some of {sorted(_DB_OPTIONS)}")
    raw = details.get("steps")
    if not isinstance(raw, list):
        raise UsageError("a fuzz replay's steps are a list")
    try:
        steps = [from_json(s) for s in raw]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"a fuzz replay's step is malformed: {type(e).__name__}: {e}") from None
    run = details.get("run")
    if type(run) is not int or not _generated(steps, run_seed(run, _config(0, 0.0))):
        raise UsageError(
            f"a fuzz replay's steps must be steps of its run ({show(run)}), as the fuzz generated "
            "them: a replay runs no SQL of the file's own"
        )
    return steps, options


def _generated(steps: list[Step], generated: list[Step]) -> bool:
    """Whether `steps` are some of `generated`, in their order (what minimising leaves)."""
    left = iter(generated)
    return all(any(step == g for g in left) for step in steps)
