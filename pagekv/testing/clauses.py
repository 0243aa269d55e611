"""How a contract clause is written and run: `clause`, `Trial`, `run_clause`.

A clause is a function of a `Trial`: it opens fresh namespaces through the trial, makes calls on
them (each recorded), and states what the contract requires with `expect`, `check` and `raises`.
A broken requirement raises a `Violation` naming the call, what was required and what came back.
A clause that cannot run against a factory (it needs a store, or limits the factory does not take)
raises `NotChecked` with the reason, and is reported as not checked rather than passed.

What the trial does on every call, so no clause has to:

- **Result types.** Every result must be of the `ActorKv` types exactly: `get` a `list` of
  `bytes` or None, `list` a `list` of `(bytes, bytes)` tuples, `takeover`, `generation` and
  `used_bytes` an `int` (not a bool), a write None. Anything else (a `bytearray`, `[key, value]`
  lists) is a violation naming the call and the type, whichever clause made it, worded as in
  every part (`model.wrong_type`).
- **Transient errors.** `KvUnavailable` means nothing was applied, so the call is made again, up
  to `ATTEMPTS` times. A read changes nothing, so one answering `KvIndeterminate` is made again
  too, and so is any other write but `takeover`: each of them, applied twice, leaves what one
  application leaves, and a correct backend answers a repeat with the outcome the contract
  requires of the first. A `takeover` whose outcome is unknown, or a call that gets no answer
  in `ATTEMPTS` tries, leaves the clause without a definite answer: it is not checked, with the
  reason, never failed.
- **Limits.** A clause asks for the limits it needs by name (`t.namespace(max_storage_bytes=100)`)
  and the factory is asked for the limits it advertises by default with those changed, so a
  backend with smaller limits of its own keeps them; every other size a clause uses comes from
  what the namespace advertises (`t.limits`).
- **Stores** a clause opens are closed exactly once (a store's `close` need not be idempotent).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from pagekv.kv import ActorKv, KvIndeterminate, KvLimits, KvUnavailable
from pagekv.testing.model import RESULT_TYPES_REQUIRES, wrong_type
from pagekv.testing.subject import NAMESPACE, Probe, Subject
from pagekv.testing.violation import Call, Violation, show

Snapshot = tuple[list[tuple[bytes, bytes]], int, int]
_SEQUENCE_SHOWN: Final = 40
"""Calls of a clause shown in its report (the latest ones)."""
_ITEMS_SHOWN: Final = 8
"""Missing or extra items of a list shown in a report."""
ATTEMPTS: Final = 5
"""Tries a call gets when it answers `KvUnavailable` (or, where a repeat is safe,
`KvIndeterminate`) before its clause is reported not checked."""


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


def _listed(items: Sequence[object]) -> str:
    """Items of a report shown one by one, at most `_ITEMS_SHOWN` of them."""
    shown = ", ".join(show(i) for i in items[:_ITEMS_SHOWN])
    more = len(items) - _ITEMS_SHOWN
    return shown + (f" (the first {_ITEMS_SHOWN} of {len(items)})" if more > 0 else "")


def _first_positions(items: Sequence[object]) -> dict[object, int]:
    """Where each item first occurs: the order missing and extra items are shown in."""
    positions: dict[object, int] = {}
    for n, item in enumerate(items):
        positions.setdefault(item, n)
    return positions


def _list_difference(got: Sequence[object], want: Sequence[object]) -> str:
    """Where `got` first departs from `want`; of entries (tuples), those one has that the other
    has not, of values (a get's), how many positions differ."""
    same = next(
        (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
        min(len(got), len(want)),
    )
    parts = [f"{len(got)} items, expected {len(want)}"] if len(got) != len(want) else []
    if same < len(got) and same < len(want):
        parts.append(
            f"first difference at [{same}]: {show(got[same])}, expected {show(want[same])}"
        )
    elif same:
        then = "nothing" if same < len(want) else "more"
        parts.append(f"the first {same} as expected, then {then} from [{same}]")
    if not all(type(item) is tuple for item in (*got, *want)):  # values by position, as get's
        differ = [i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w]
        parts.append(f"{len(differ)} of the {min(len(got), len(want))} positions compared differ")
        return "; ".join(parts)
    try:
        have, need = Counter(got), Counter(want)
    except TypeError:  # unhashable items: the result-type check reports those
        return "; ".join(parts)
    missing = sorted((need - have).elements(), key=_first_positions(want).__getitem__)
    extra = sorted((have - need).elements(), key=_first_positions(got).__getitem__)
    if missing:
        parts.append(f"missing {len(missing)}: {_listed(missing)}")
    if extra:
        parts.append(f"extra {len(extra)}: {_listed(extra)}")
    if not missing and not extra:
        parts.append("the same items in another order")
    return "; ".join(parts)


def _shown(got: object, want: object) -> str:
    """`got` for a report, with where it departs from `want`: a long list is shown only in part,
    so what it lacks or has too much is said item by item."""
    text = show(got)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple) and got != want:
        return f"{text} ({_list_difference(got, want)})"
    if got == want and type(got) is not type(want):
        return f"{text} (a {type(got).__name__}, expected a {type(want).__name__})"
    return text


def _repeatable(value: object) -> Iterator[object]:
    """`value` for each try of a call: an iterator argument is teed, so a repeat reads it all."""
    if isinstance(value, Iterator):
        return iter(itertools.tee(value, ATTEMPTS))
    return itertools.repeat(value)


class _Checked(Probe):
    """A recorded namespace whose results are type-checked and whose transient errors are
    retried (see the module's docstring)."""

    def __init__(self, inner: ActorKv, trial: Trial, handle: str) -> None:
        super().__init__(inner, trial.calls, handle)
        self._trial = trial

    def _record(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call = self._trial.attempt(self.inner, self.handle, method, args, kwargs)
        problem = wrong_type(method, call.returned)
        if problem is not None:
            raise self._trial.violation(RESULT_TYPES_REQUIRES, problem, call=call)
        return call.returned


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
        self._stores: dict[int, tuple[str, dict[str, int]]] = {}
        """`id` of each store opened through `store` -> its label and the limits it was asked."""
        self._open: list[Any] = []
        """The stores opened through `store` and not closed yet, oldest first."""
        self._defaults: KvLimits | None = None

    # --- calls -------------------------------------------------------------------------------

    def attempt(
        self, target: Any, handle: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Call:
        """Call `target.method`, recorded, again while it answers what allows a repeat; the last
        try's `Call`. Raises what the call raised, or `NotChecked` when it gets no answer."""
        tries = [_repeatable(a) for a in args]
        keyword_tries = {k: _repeatable(v) for k, v in kwargs.items()}
        for _ in range(ATTEMPTS):
            call = Call(
                method,
                tuple(next(a) for a in tries),
                {k: next(v) for k, v in keyword_tries.items()},
                handle,
            )
            self.calls.append(call)
            try:
                call.returned = getattr(target, method)(*call.args, **call.kwargs)
                return call
            except (KvUnavailable, KvIndeterminate) as e:
                call.raised = e
                if isinstance(e, KvIndeterminate) and method == "takeover":
                    raise NotChecked(
                        f"{call.invocation} raised {show(e)}: whether it took over is unknown, "
                        "and another takeover is not the same call"
                    ) from e
            except BaseException as e:
                call.raised = e
                raise
        raise NotChecked(
            f"{call.invocation} raised {type(call.raised).__name__} {ATTEMPTS} times in a row "
            f"(the last: {show(call.raised)}): no definite answer"
        ) from call.raised

    # --- namespaces --------------------------------------------------------------------------

    def _probe(self, inner: ActorKv) -> Probe:
        self._handles += 1
        return _Checked(inner, self, "kv" if self._handles == 1 else f"kv{self._handles}")

    def _asking(self, limits: dict[str, int]) -> KvLimits | None:
        """The limits to ask the factory for: those it advertises by default, with `limits`."""
        if not limits:
            return None
        if not self.subject.takes_limits:
            raise NotChecked("needs small limits: the factory takes no limits= argument")
        if self._defaults is None:
            self._defaults = self.subject.limits_of(self.subject.namespace(), None)
        return dataclasses.replace(self._defaults, **limits)

    def _advertises(self, kv: object, limits: dict[str, int]) -> None:
        """`kv` applies the limits the clause asked for (any others are its own)."""
        advertised = getattr(kv, "limits", None)
        for name, value in limits.items():
            if getattr(advertised, name, None) != value:
                raise NotChecked(
                    f"the factory was asked for {name}={value} but advertises "
                    f"{getattr(advertised, name, advertised)}"
                )

    def namespace(self, **limits: int) -> Probe:
        """A fresh, empty namespace; `limits` (`KvLimits` fields) need a factory taking them."""
        kv = self.subject.namespace(self._asking(limits))
        self._advertises(kv, limits)
        return self._probe(kv)

    def store(self, location: Path | None = None, **limits: int) -> Any:
        """A fresh store, or the one at `location` reopened: needs a store factory (and one
        taking `limits` or `location` when they are given). Closed when the clause ends, unless
        the clause closed it (`close`)."""
        if not self.subject.returns_store:
            raise NotChecked("needs a store: the factory returns namespaces")
        if location is not None and not self.subject.takes_location:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        store = self.subject.open_store(self._asking(limits), location, track=False)
        self._open.append(store)
        n = len(self._stores) + 1
        self._stores[id(store)] = ("store" if n == 1 else f"store{n}", limits)
        return store

    def location(self) -> Path:
        if not self.subject.reopens:
            raise NotChecked("needs to reopen a store: the factory takes no location= argument")
        return self.subject.location()

    def handle(self, store: Any, name: object = NAMESPACE) -> Probe:
        """A namespace object of `store`, recorded as a handle of its own (`kv2`, ...); the
        `store.namespace(name)` call is recorded too (a refused name raises from it)."""
        label, asked = self._stores.get(id(store), ("store", {}))
        call = self.attempt(store, label, "namespace", (name,), {})
        self._advertises(call.returned, asked)
        probe = self._probe(cast(ActorKv, call.returned))
        call.returned = _Label(probe.handle)
        return probe

    def close(self, store: Any) -> None:
        """Close `store` (recorded), e.g. before reopening its location; it is not closed again."""
        self._open = [s for s in self._open if s is not store]
        label, _ = self._stores.get(id(store), ("store", {}))
        call = Call("close", (), {}, label)
        self.calls.append(call)
        try:
            store.close()
        except BaseException as e:
            call.raised = e
            raise

    def close_stores(self) -> BaseException | None:
        """Close the stores the clause left open, newest first; the first error a close raised."""
        first: BaseException | None = None
        while self._open:
            try:
                self.close(self._open[-1])
            except Exception as e:
                first = first or e
        return first

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

    def expect(self, got: object, want: object, requires: str, by: Call | None = None) -> None:
        """`got` (what the last call returned, or a value derived from it) must equal `want`,
        and be of its type. `by`: the call that caused it when the last call only read it back
        (a write, whose effect a `used_bytes()` shows), named as the call in the report."""
        if got != want or type(got) is not type(want):
            shown = _shown(got, want)
            last = self.calls[-1] if self.calls else None
            if by is not None and last is not None and last is not by:
                shown = f"{last.invocation} after it returned {shown}"
            raise self.violation(requires, shown, show(want), call=by)

    def check(self, ok: bool, requires: str, got: object) -> None:
        if not ok:
            raise self.violation(requires, show(got))

    @contextmanager
    def raises(self, *errors: type[BaseException], requires: str) -> Iterator[list[BaseException]]:
        """The block's last call must raise one of `errors`; the caught error is yielded's [0]."""
        caught: list[BaseException] = []
        try:
            yield caught
        except (Violation, NotChecked):
            raise
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
    clause; any other exception is a fault of the check itself and propagates. The stores the
    clause left open are closed once it ends; a close that raises after a clause that held is a
    violation of it.
    """
    trial = Trial(subject, c)
    try:
        c.run(trial)
    except (Violation, NotChecked):
        raise
    except Exception as e:
        failed = next((call for call in reversed(trial.calls) if call.raised is e), None)
        if failed is None:
            raise
        raise trial.violation(c.requires, f"raised {show(e)}", call=failed) from e
    finally:
        closing = trial.close_stores()
    if closing is not None:
        closed = next(call for call in trial.calls if call.raised is closing)
        raise trial.violation(
            "store.close() closes a store", f"raised {show(closing)}", call=closed
        )
