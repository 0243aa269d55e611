"""How a contract clause is written and run: `clause`, `Trial`, `run_clause`.

A clause is a function of a `Trial`: it opens fresh namespaces through the trial, makes calls on
them (each recorded), and states what the contract requires with `expect`, `check` and `raises`.
A broken requirement raises a `Violation` naming the call, what was required and what came back.
A clause that cannot run against a factory (it needs a store, or limits the factory does not take)
raises `NotChecked` with the reason, and is reported as not checked rather than passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pagekv.kv import ActorKv, KvLimits
from pagekv.testing.report import Call, Violation, show
from pagekv.testing.subject import NAMESPACE, Probe, Subject

Snapshot = tuple[list[tuple[bytes, bytes]], int, int]
_SEQUENCE_SHOWN: Final = 40
"""Calls of a clause shown in its report (the latest ones)."""


class NotChecked(Exception):
    """A clause needs what this factory does not offer; the message says what."""


@dataclass(frozen=True)
class Clause:
    name: str
    """A short name, unique: `test_id`s and `--replay` use it."""
    requires: str
    """The clause as the contract states it."""
    run: Callable[[Trial], None]


CLAUSES: list[Clause] = []
"""Every clause, in the order they run."""


def clause(requires: str) -> Callable[[Callable[[Trial], None]], Callable[[Trial], None]]:
    """Register a clause; its name is the function's, with `_` as spaces."""

    def register(fn: Callable[[Trial], None]) -> Callable[[Trial], None]:
        name = fn.__name__.replace("_", " ")
        if any(c.name == name for c in CLAUSES):
            raise ValueError(f"two clauses named {name!r}")
        CLAUSES.append(Clause(name, requires, fn))
        return fn

    return register


class _Label(str):
    """A handle's name as a call's result, shown bare: `store.namespace('a') -> kv2`."""

    def __repr__(self) -> str:
        return str(self)


def _shown(got: object, want: object) -> str:
    """`got` for a report, with where it departs from `want`: a long list is shown only in part."""
    text = show(got)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            if g != w or type(g) is not type(w):
                return f"{text} (first difference at [{i}]: {show(g)}, expected {show(w)})"
        if len(got) != len(want):
            same = min(len(got), len(want))
            return f"{text} ({len(got)} items, expected {len(want)}; the first {same} as expected)"
    if got == want and type(got) is not type(want):
        return f"{text} (a {type(got).__name__}, expected a {type(want).__name__})"
    return text


class Trial:
    """One run of one clause against a subject: its calls, its handles, its requirements.

    Every call a clause makes on a namespace, and every `namespace(name)` and `close()` it makes
    on a store through `handle` and `close`, is recorded in `calls`, so that a report shows them.
    """

    def __init__(self, subject: Subject, clause: Clause) -> None:
        self.subject = subject
        self.clause = clause
        self.calls: list[Call] = []
        self._handles = 0
        self._stores: dict[int, tuple[str, KvLimits | None]] = {}
        """`id` of each store opened through `store` -> its label and the limits it was asked."""

    # --- namespaces --------------------------------------------------------------------------

    def _probe(self, inner: ActorKv) -> Probe:
        self._handles += 1
        return Probe(inner, self.calls, "kv" if self._handles == 1 else f"kv{self._handles}")

    def _advertises(self, kv: ActorKv, limits: KvLimits | None) -> None:
        if limits is not None and getattr(kv, "limits", None) != limits:
            raise NotChecked(f"the factory was asked for {limits} but advertises {kv.limits}")

    def namespace(self, limits: KvLimits | None = None) -> Probe:
        """A fresh, empty namespace; `limits` needs a factory that takes them."""
        if limits is not None and not self.subject.takes_limits:
            raise NotChecked("needs small limits: the factory takes no limits= argument")
        kv = self.subject.namespace(limits)
        self._advertises(kv, limits)
        return self._probe(kv)

    def store(self, limits: KvLimits | None = None, location: Path | None = None) -> Any:
        """A fresh store, or the one at `location` reopened: needs a store factory (and one
        taking `limits` or `location` when they are given)."""
        if not self.subject.returns_store:
            raise NotChecked("needs a store: the factory returns namespaces")
        if limits is not None and not self.subject.takes_limits:
            raise NotChecked("needs small limits: the factory takes no limits= argument")
        if location is not None and not self.subject.takes_location:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        store = self.subject.open_store(limits, location)
        n = len(self._stores) + 1
        self._stores[id(store)] = ("store" if n == 1 else f"store{n}", limits)
        return store

    def location(self) -> Path:
        if not self.subject.reopens:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        return self.subject.location()

    def _store_call(self, store: Any, method: str, *args: Any) -> tuple[Call, Any]:
        label, _ = self._stores.get(id(store), ("store", None))
        call = Call(method, args, {}, label)
        self.calls.append(call)
        try:
            return call, getattr(store, method)(*args)
        except BaseException as e:
            call.raised = e
            raise

    def handle(self, store: Any, name: object = NAMESPACE) -> Probe:
        """A namespace object of `store`, recorded as a handle of its own (`kv2`, ...); the
        `store.namespace(name)` call is recorded too (a refused name raises from it)."""
        call, inner = self._store_call(store, "namespace", name)
        _, asked = self._stores.get(id(store), ("store", None))
        self._advertises(inner, asked)
        probe = self._probe(inner)
        call.returned = _Label(probe.handle)
        return probe

    def close(self, store: Any) -> None:
        """Close `store` (recorded), e.g. before reopening its location."""
        self._store_call(store, "close")

    def limits(self, kv: ActorKv) -> KvLimits:
        """The limits `kv` advertises: what every boundary is checked at."""
        return self.subject.limits_of(kv, None)

    # --- requirements ------------------------------------------------------------------------

    def violation(
        self, requires: str, got: str, expected: str = "", call: Call | None = None
    ) -> Violation:
        """The clause is broken: by `call`, by default the last call made."""
        if call is None and self.calls:
            call = self.calls[-1]
        return Violation(
            part="contract",
            clause=self.clause.name,
            requires=requires,
            call=call.invocation if call else "",
            got=got,
            expected=expected,
            sequence=[str(c) for c in self.calls[-_SEQUENCE_SHOWN:]],
            details={"clause": self.clause.name},
        )

    def expect(self, got: object, want: object, requires: str) -> None:
        """`got` (what the last call returned, or a value derived from it) must equal `want`,
        and be of its type."""
        if got != want or type(got) is not type(want):
            raise self.violation(requires, _shown(got, want), show(want))

    def check(self, ok: bool, requires: str, got: object) -> None:
        if not ok:
            raise self.violation(requires, show(got))

    @contextmanager
    def raises(self, *errors: type[BaseException], requires: str) -> Iterator[list[BaseException]]:
        """The block's last call must raise one of `errors`; the caught error is yielded's [0]."""
        caught: list[BaseException] = []
        try:
            yield caught
        except errors as e:
            caught.append(e)
            return
        except Exception as e:
            names = " or ".join(t.__name__ for t in errors)
            raise self.violation(requires, f"raised {show(e)}", f"raises {names}") from e
        names = " or ".join(t.__name__ for t in errors)
        last = self.calls[-1] if self.calls else None
        got = "returned normally" + (f" ({show(last.returned)})" if last else "")
        raise self.violation(requires, got, f"raises {names}")

    def snapshot(self, kv: ActorKv) -> Snapshot:
        """Everything observable about a namespace: contents, used bytes, generation."""
        return kv.list(), kv.used_bytes(), kv.generation()

    def unchanged(self, kv: ActorKv, before: Snapshot, requires: str) -> None:
        """`kv` must be as `before`: a refused request writes nothing. The report names the call
        made just before (the refused one), not the reads that showed the change."""
        refused = self.calls[-1] if self.calls else None
        after = self.snapshot(kv)
        for what, a, b in zip(("contents", "used_bytes", "generation"), before, after, strict=True):
            if a != b:
                raise self.violation(
                    f"{requires} ({what} must not change)",
                    f"{what} became {_shown(b, a)}",
                    show(a),
                    call=refused,
                )


def run_clause(subject: Subject, c: Clause) -> None:
    """Run one clause: raises its `Violation`, or `NotChecked`, or returns when it holds.

    An exception the backend raised where the clause needed an answer is a violation of the
    clause; any other exception is a fault of the check itself and propagates.
    """
    trial = Trial(subject, c)
    try:
        c.run(trial)
    except (Violation, NotChecked):
        raise
    except Exception as e:
        last = trial.calls[-1] if trial.calls else None
        if last is None or last.raised is not e:
            raise
        raise trial.violation(c.requires, f"raised {show(e)}") from e
