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
"""Every clause, in the order they run (and are listed in DESIGN.md §3's terms)."""


def clause(requires: str) -> Callable[[Callable[[Trial], None]], Callable[[Trial], None]]:
    """Register a clause; its name is the function's, with `_` as spaces."""

    def register(fn: Callable[[Trial], None]) -> Callable[[Trial], None]:
        name = fn.__name__.replace("_", " ")
        if any(c.name == name for c in CLAUSES):
            raise ValueError(f"two clauses named {name!r}")
        CLAUSES.append(Clause(name, requires, fn))
        return fn

    return register


class Trial:
    """One run of one clause against a subject: its calls, its handles, its requirements."""

    def __init__(self, subject: Subject, clause: Clause) -> None:
        self.subject = subject
        self.clause = clause
        self.calls: list[Call] = []
        self._handles = 0

    # --- namespaces --------------------------------------------------------------------------

    def _probe(self, inner: ActorKv) -> Probe:
        self._handles += 1
        return Probe(inner, self.calls, "kv" if self._handles == 1 else f"kv{self._handles}")

    def namespace(self, limits: KvLimits | None = None) -> Probe:
        """A fresh, empty namespace; `limits` needs a factory that takes them."""
        if limits is not None and not self.subject.takes_limits:
            raise NotChecked("needs small limits: the factory takes no limits= argument")
        kv = self.subject.namespace(limits)
        if limits is not None and getattr(kv, "limits", None) != limits:
            raise NotChecked(f"the factory was asked for {limits} but advertises {kv.limits}")
        return self._probe(kv)

    def store(self, limits: KvLimits | None = None, location: Path | None = None) -> Any:
        """A fresh store, or the one at `location` reopened: needs a store factory."""
        if not self.subject.returns_store:
            raise NotChecked("needs a store: the factory returns namespaces")
        if location is not None and not self.subject.takes_location:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        return self.subject.open_store(limits, location)

    def location(self) -> Path:
        if not self.subject.reopens:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        return self.subject.location()

    def handle(self, store: Any, name: str = NAMESPACE) -> Probe:
        """A namespace object of `store`, recorded as a handle of its own (`kv2`, ...)."""
        return self._probe(store.namespace(name))

    def limits(self, kv: ActorKv) -> KvLimits:
        """The limits `kv` advertises: what every boundary is checked at."""
        return self.subject.limits_of(kv, None)

    # --- requirements ------------------------------------------------------------------------

    def violation(self, requires: str, got: str, expected: str = "") -> Violation:
        last = self.calls[-1] if self.calls else None
        return Violation(
            part="contract",
            clause=self.clause.name,
            requires=requires,
            call=last.invocation if last else "",
            got=got,
            expected=expected,
            sequence=[str(c) for c in self.calls[-_SEQUENCE_SHOWN:]],
            details={"clause": self.clause.name},
        )

    def expect(self, got: object, want: object, requires: str) -> None:
        """`got` (what the last call returned, or a value derived from it) must equal `want`."""
        if got != want or type(got) is not type(want):
            raise self.violation(requires, show(got), show(want))

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
        """`kv` must be as `before`: a refused request writes nothing."""
        after = self.snapshot(kv)
        for what, a, b in zip(("contents", "used_bytes", "generation"), before, after, strict=True):
            if a != b:
                raise self.violation(f"{requires} ({what} must not change)", show(b), show(a))


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
