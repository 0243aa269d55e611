"""The contract as a sequential model: what a conforming namespace answers to each call.

`Model.apply(op)` is the outcome the contract requires of `op` in the model's state, and the state
after it. The concurrent part checks histories against it (linearizability), the restart part
compares a reopened namespace with it, and the fuzz part mirrors every call the VFS makes on it.

Validation is our own (`pagekv.kv.limits`), which is the contract's: the model raises what a
request deserves. A request that breaks several rules may deserve several errors; `Outcome.errors`
is then the set of them, and a backend may raise any one.

Results are checked for type before they are compared (`wrong_type`): the contract's types
exactly, so a `bytearray` value or a `[key, value]` list is a violation, never equal to what the
model holds. `Op.from_json` decodes a call from a replay file and refuses anything but an
`ActorKv` method with arguments of the shapes the parts make, so a tampered file cannot call
anything else on the backend.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from pagekv.kv import (
    ACTOR_KV_METHODS,
    ActorKv,
    FenceMismatch,
    InvalidArgument,
    KvError,
    KvLimits,
    LimitError,
    StorageQuotaExceeded,
)
from pagekv.kv.limits import (
    check_fence_arg,
    check_key,
    check_keys,
    check_list,
    check_quota,
    check_write,
    entry_size,
    quota_delta,
)
from pagekv.testing.subject import UsageError
from pagekv.testing.violation import show, show_call

READS = frozenset({"get", "list", "generation", "used_bytes"})
WRITES = frozenset({"write", "put", "delete", "delete_range", "takeover", "drop"})
_ARGUMENTS: Final = {
    "get": (1, frozenset()),
    "list": (0, frozenset({"prefix", "start", "end", "limit", "reverse"})),
    "write": (0, frozenset({"put", "delete", "fence"})),
    "put": (1, frozenset({"fence"})),
    "delete": (1, frozenset({"fence"})),
    "delete_range": (2, frozenset({"fence"})),
    "takeover": (0, frozenset()),
    "generation": (0, frozenset()),
    "used_bytes": (0, frozenset()),
    "drop": (0, frozenset({"fence"})),
}
"""Each `ActorKv` method (every one but the `limits` property): its positional arguments and
the keywords it takes. A replayed call must fit these."""
assert set(_ARGUMENTS) == READS | WRITES == set(ACTOR_KV_METHODS) - {"limits"}
FENCED: Final = frozenset(m for m, (_, names) in _ARGUMENTS.items() if "fence" in names)
"""The methods that take `fence=`."""

RESULT_TYPES: Final = "every result has the contract's type"
RESULT_TYPES_REQUIRES: Final = (
    "get returns a list of bytes or None, list a list of (key, value) tuples of bytes (bytes "
    "exactly: not bytearray or memoryview), takeover, generation and used_bytes an int, the "
    "writes None"
)


@dataclass(frozen=True)
class Op:
    """One call on a namespace: `method` with keyword-normalised arguments."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(method: str, *args: Any, **kwargs: Any) -> Op:
        return Op(method, args, tuple(kwargs.items()))

    def call(self, kv: ActorKv) -> Any:
        return getattr(kv, self.method)(*self.args, **dict(self.kwargs))

    def __str__(self) -> str:
        return show_call(self.method, self.args, dict(self.kwargs))

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "args": _enc(self.args), "kwargs": _enc(dict(self.kwargs))}

    @staticmethod
    def from_json(data: object) -> Op:
        """The call `to_json` wrote. Raises `UsageError` for anything else: a method that is
        not an `ActorKv` method, arguments it does not take, values of other shapes."""
        try:
            if not isinstance(data, dict):
                raise ValueError(f"a call must be an object, not {show(data)}")
            method = data.get("method")
            if not isinstance(method, str) or method not in _ARGUMENTS:
                raise ValueError(
                    f"{method!r} is not an ActorKv method ({', '.join(sorted(_ARGUMENTS))})"
                )
            args, kwargs = _dec(data.get("args")), _dec_keywords(data.get("kwargs"))
            count, names = _ARGUMENTS[method]
            if not isinstance(args, list) or len(args) != count:
                raise ValueError(f"{method} takes {count} positional arguments, not {show(args)}")
            if not set(kwargs) <= names:
                raise ValueError(f"{method} takes no {', '.join(sorted(set(kwargs) - names))}")
        except (TypeError, ValueError) as e:
            raise UsageError(f"a replayed call is malformed: {e}") from None
        return Op(method, tuple(args), tuple(kwargs.items()))


def _enc(value: Any) -> Any:
    """JSON for op arguments: bytes as `{"hex": ...}`, tuples as lists."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {"dict": [[_enc(k), _enc(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [_enc(v) for v in value]
    return value


def _dec(value: object) -> Any:
    """What `_enc` wrote: bytes, ints, bools, None, and lists and mappings of them (a mapping's
    keys hashable); anything else raises `ValueError` or `TypeError`."""
    if isinstance(value, dict):
        if set(value) == {"hex"} and isinstance(value["hex"], str):
            return bytes.fromhex(value["hex"])
        if set(value) == {"dict"} and isinstance(value["dict"], list):
            return {_dec(k): _dec(v) for k, v in map(_pair, value["dict"])}
        raise ValueError(f"{show(value)} is not an encoded value")
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if value is None or isinstance(value, int):
        return value
    raise ValueError(f"{show(value)} is not an encoded value")


def _pair(item: object) -> tuple[object, object]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError(f"{show(item)} is not a [key, value] pair")
    return item[0], item[1]


def _dec_keywords(value: object) -> dict[str, Any]:
    """Keyword arguments as `_enc` wrote them: names and encoded values."""
    if not isinstance(value, dict) or set(value) != {"dict"} or not isinstance(value["dict"], list):
        raise ValueError(
            f"keyword arguments must be encoded as {{'dict': [...]}}, not {show(value)}"
        )
    pairs = list(map(_pair, value["dict"]))
    if not all(isinstance(name, str) for name, _ in pairs):
        raise ValueError(f"keyword names must be strings, not {show([n for n, _ in pairs])}")
    return {name: _dec(v) for name, v in pairs}  # type: ignore[misc]


@dataclass(frozen=True)
class Outcome:
    """What a call did: returned `value`, or raised one of `errors` (an empty set: no error)."""

    value: Any = None
    errors: frozenset[type[KvError]] = frozenset()
    raised: BaseException | None = None
    """The exception itself, for an observed outcome."""

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def admits(self, observed: Outcome) -> bool:
        """Whether `observed` is an outcome the contract allows where this one is required."""
        if not self.errors:
            return not observed.errors and _same(self.value, observed.value)
        return observed.raised is not None and isinstance(observed.raised, tuple(self.errors))

    def __str__(self) -> str:
        if isinstance(self.raised, ResultTypeError):
            return str(self.raised)
        if self.raised is not None:
            return f"raised {type(self.raised).__name__}: {self.raised}"
        if self.errors:
            return "raises " + " or ".join(sorted(e.__name__ for e in self.errors))
        return f"returns {show(self.value)}"


def _same(a: Any, b: Any) -> bool:
    """Equal, for values of the contract's types (`wrong_type` has passed them)."""
    return bool(a == b)


def wrong_type(method: str, value: object) -> str | None:
    """How `value`, returned by `method`, breaks the contract's result type (`RESULT_TYPES`);
    None when it does not. Every part reports a type violation in these words: the type, where
    in the result, the offending value and what the contract requires there."""

    def wrong(what: object, where: str, required: str) -> str:
        at = f" at {where}" if where else ""
        return f"returned {type(what).__name__}{at}: {show(what)}; the contract requires {required}"

    if method == "get":
        if type(value) is not list:
            return wrong(value, "", "a list")
        for i, item in enumerate(value):
            if item is not None and type(item) is not bytes:
                return wrong(item, f"[{i}]", "bytes (or None for a missing key)")
        return None
    if method == "list":
        if type(value) is not list:
            return wrong(value, "", "a list")
        for i, entry in enumerate(value):
            if type(entry) is not tuple or len(entry) != 2:
                return wrong(entry, f"[{i}]", "a (key, value) tuple")
            for j, part in enumerate(entry):
                if type(part) is not bytes:
                    return wrong(part, f"[{i}][{j}]", "bytes")
        return None
    if method in ("takeover", "generation", "used_bytes"):
        return None if type(value) is int else wrong(value, "", "an int")
    return None if value is None else wrong(value, "", "None")


class ResultTypeError(Exception):
    """A call returned a value of another type than the contract's: what `observe` raises,
    its message `wrong_type`'s."""

    def __init__(self, value: object, problem: str) -> None:
        super().__init__(problem)
        self.value = value


def observe(kv: ActorKv, op: Op) -> Outcome:
    """Run `op` on a real namespace; a `KvError` becomes an outcome, a result of another type
    than the contract's raises `ResultTypeError`, anything else propagates."""
    try:
        value = op.call(kv)
    except KvError as e:
        return Outcome(errors=frozenset({type(e)}), raised=e)
    problem = wrong_type(op.method, value)
    if problem is not None:
        raise ResultTypeError(value, problem)
    return Outcome(value)


@dataclass
class Model:
    """A namespace as the contract defines it: sorted keys, values, generation, exact usage."""

    limits: KvLimits
    values: dict[bytes, bytes] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)
    generation: int = 0
    used: int = 0

    def copy(self) -> Model:
        return Model(self.limits, dict(self.values), list(self.keys), self.generation, self.used)

    def state(self) -> tuple[Any, ...]:
        """Hashable: the state, for memoisation in the linearizability search."""
        return (tuple(self.contents()), self.generation, self.used)

    def contents(self) -> list[tuple[bytes, bytes]]:
        return [(k, self.values[k]) for k in self.keys]

    def apply(self, op: Op) -> Outcome:
        """The required outcome of `op`; the model's state moves only when `op` succeeds."""
        kwargs = dict(op.kwargs)
        try:
            match op.method:
                case "get":
                    return self._get(*op.args, **kwargs)
                case "list":
                    return Outcome(self._list(*op.args, **kwargs))
                case "write":
                    return self._write(*op.args, **kwargs)
                case "put":
                    return self._write(*op.args[1:], put=op.args[0], **kwargs)
                case "delete":
                    return self._write(*op.args[1:], delete=op.args[0], **kwargs)
                case "delete_range":
                    return self._delete_range(*op.args, **kwargs)
                case "takeover":
                    self.generation += 1
                    return Outcome(self.generation)
                case "generation":
                    return Outcome(self.generation)
                case "used_bytes":
                    return Outcome(self.used)
                case "drop":
                    return self._drop(**kwargs)
                case _:
                    raise ValueError(f"no model of {op.method!r}")
        except (LimitError, InvalidArgument) as e:
            return Outcome(errors=frozenset({type(e)}))

    def _get(self, keys: Iterable[bytes]) -> Outcome:
        return Outcome([self.values.get(k) for k in check_keys(self.limits, keys)])

    def _list(
        self,
        *,
        prefix: object = None,
        start: object = None,
        end: object = None,
        limit: object = None,
        reverse: object = False,
    ) -> list[tuple[bytes, bytes]]:
        checked = check_list(self.limits, prefix, start, end, limit, reverse)
        if checked is None:
            return []
        lo, hi, n, backwards = checked
        i = 0 if lo is None else bisect.bisect_left(self.keys, lo)
        j = len(self.keys) if hi is None else bisect.bisect_left(self.keys, hi)
        chosen = self.keys[i:j] if i < j else []
        if backwards:
            chosen = chosen[::-1]
        if n is not None:
            chosen = chosen[:n]
        return [(k, self.values[k]) for k in chosen]

    def _fence_errors(self, fence: int | None) -> set[type[KvError]]:
        return {FenceMismatch} if fence is not None and fence != self.generation else set()

    def _write(self, *, put: Any = (), delete: Any = (), fence: object = None) -> Outcome:
        batch = check_write(self.limits, put, delete)
        checked = check_fence_arg(fence)
        errors = self._fence_errors(checked)
        delta = quota_delta(batch, self.values)
        try:
            after = check_quota(self.limits, self.used, delta)
        except StorageQuotaExceeded:
            errors.add(StorageQuotaExceeded)
            after = self.used
        if errors:
            return Outcome(errors=frozenset(errors))
        for key in batch.deletes:
            if key in self.values:
                del self.values[key]
                self.keys.pop(bisect.bisect_left(self.keys, key))
        for key, value in batch.puts.items():
            if key not in self.values:
                bisect.insort(self.keys, key)
            self.values[key] = bytes(value)
        self.used = after
        return Outcome(None)

    def _delete_range(self, start: object, end: object, *, fence: object = None) -> Outcome:
        lo = check_key(self.limits, start, "start key")
        hi = check_key(self.limits, end, "end key")
        errors = self._fence_errors(check_fence_arg(fence))
        if errors:
            return Outcome(errors=frozenset(errors))
        if lo < hi:
            i, j = bisect.bisect_left(self.keys, lo), bisect.bisect_left(self.keys, hi)
            for key in self.keys[i:j]:
                self.used -= entry_size(key, self.values.pop(key))
            del self.keys[i:j]
        return Outcome(None)

    def _drop(self, *, fence: object = None) -> Outcome:
        errors = self._fence_errors(check_fence_arg(fence))
        if errors:
            return Outcome(errors=frozenset(errors))
        self.values.clear()
        self.keys.clear()
        self.used = 0
        return Outcome(None)
