"""What a conformance check says when a backend breaks the contract: `Violation`.

A report names the cause, not the symptom: the KV call that misbehaved, with its arguments (long
keys and values abbreviated), what the contract requires of it, what the backend did instead, and
the calls that led there, so that a backend's author can reproduce it by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

_SHOWN_BYTES: Final = 24
"""Bytes of a key or value shown in full; longer ones are shown by their head and length."""
_SHOWN_ITEMS: Final = 8
"""Entries of a list or mapping shown; the rest are counted."""
_LINE: Final = 200
"""Characters of a sequence line shown in a report (the replay file keeps everything)."""


def show(value: object) -> str:
    """A short, exact-enough rendering of a KV argument or result for a report."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if len(data) <= _SHOWN_BYTES:
            return repr(data)
        return f"{data[:8]!r}+({len(data)} bytes)"
    if isinstance(value, Mapping):
        items = [f"{show(k)}: {show(v)}" for k, v in list(value.items())[:_SHOWN_ITEMS]]
        more = len(value) - _SHOWN_ITEMS
        return "{" + ", ".join(items) + (f", ...{more} more" if more > 0 else "") + "}"
    if isinstance(value, list | tuple):
        items = [show(v) for v in value[:_SHOWN_ITEMS]]
        more = len(value) - _SHOWN_ITEMS
        inner = ", ".join(items) + (f", ...{more} more" if more > 0 else "")
        return (
            f"[{inner}]"
            if isinstance(value, list)
            else f"({inner}{',' if len(value) == 1 else ''})"
        )
    if isinstance(value, str) and len(value) > 2 * _SHOWN_BYTES:
        return f"{value[:_SHOWN_BYTES]!r}+({len(value)} characters)"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return repr(value)


def show_call(method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """`put({b'a': b'1'}, fence=3)`: a call as its author would type it."""
    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"{method}({', '.join(parts)})"


@dataclass
class Call:
    """One call made on the backend and what came of it."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    handle: str = "kv"
    """Which namespace object it went through (`kv`, `kv2`, ...), when a check uses several."""
    returned: object = None
    raised: BaseException | None = None

    @property
    def invocation(self) -> str:
        return f"{self.handle}.{show_call(self.method, self.args, self.kwargs)}"

    def __str__(self) -> str:
        outcome = f"raised {show(self.raised)}" if self.raised else f"-> {show(self.returned)}"
        return f"{self.invocation} {outcome}"


@dataclass
class Violation(AssertionError):
    """The backend broke one clause of the contract.

    An `AssertionError`, so that pytest reports it as a failed test with this report as its text.
    """

    part: str
    """Which part of the check found it: contract, concurrent, restart or fuzz."""
    clause: str
    """The contract clause, a short name (e.g. `quota credits overwrites`)."""
    requires: str
    """What the contract requires of the failing call."""
    call: str = ""
    """The call that broke it, with its arguments."""
    got: str = ""
    """What the backend returned or raised instead."""
    expected: str = ""
    """What a conforming backend returns, where a single answer is required."""
    sequence: list[str] = field(default_factory=list)
    """The calls that led to it, oldest first (minimised where the part minimises)."""
    seed: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    """What a replay needs (the part's own data, JSON-serialisable)."""

    def __post_init__(self) -> None:
        super().__init__(self.report())

    def __str__(self) -> str:
        return self.report()

    def report(self) -> str:
        lines = [f"{self.part}: {self.clause}", f"  requires: {self.requires}"]
        if self.call:
            lines.append(f"  call:     {self.call}")
        if self.got:
            lines.append(f"  got:      {self.got}")
        if self.expected:
            lines.append(f"  expected: {self.expected}")
        if self.seed is not None:
            lines.append(f"  seed:     {self.seed}")
        if self.sequence:
            lines.append(f"  sequence ({len(self.sequence)} calls):")
            lines.extend(
                f"    {n:3d} {line if len(line) <= _LINE else line[: _LINE - 3] + '...'}"
                for n, line in enumerate(self.sequence)
            )
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Violation,
            (
                self.part,
                self.clause,
                self.requires,
                self.call,
                self.got,
                self.expected,
                self.sequence,
                self.seed,
                self.details,
            ),
        )

    __hash__ = object.__hash__
