"""The call chain: the frames of actor code that a call is made from, so that a call which could
only wait for one of them fails at once (`CallCycle`) instead of waiting for ever.

A frame is an action (it holds a share of its actor's gate, `gate.py`) or a transaction (it holds
the gate alone, and the database lock). An action of A inside a transaction that calls B, whose
action calls A again, would wait at A's gate for the transaction, which waits for it: a deadlock
no stop could end. The gate refuses such a call, knowing from the chain which of its holders the
call is made on behalf of.

The chain is a context variable, so it follows in-process calls (`ctx.client`) and the tasks that
user code starts for them, and travels between servers in the `Pagekv-Call-Chain` header, which
`HttpClient` sends and the gateway reads: a cycle through several servers is refused as well.
Tasks the registry starts by itself begin with an empty chain (`detached`). Invariant: every frame
on a task's chain belongs to code that waits for that task to end, which is what makes a refusal
certain rather than a guess.
"""

from __future__ import annotations

import contextvars
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pagekv.actor.errors import CallCycle

HEADER = "pagekv-call-chain"
"""Not an `X-Pagekv-*` header: clients send it (`HttpClient`), and a forwarder passes it on."""
MAX_DEPTH = 64
"""The most frames a chain may hold: deeper, a call is refused (`CallCycle`), as runaway
recursion through actors would otherwise grow it (and its header) without bound."""
_FRAME = re.compile(r"^([0-9a-f]{16})@([A-Za-z_][A-Za-z0-9_.-]{0,63}/[A-Za-z0-9_.~%-]*)$")


@dataclass(frozen=True)
class Frame:
    actor_id: str
    id: str


_chain: contextvars.ContextVar[tuple[Frame, ...]] = contextvars.ContextVar(
    "pagekv_call_chain", default=()
)


def current() -> tuple[Frame, ...]:
    """The frames this task's code runs on behalf of, outermost first."""
    return _chain.get()


@contextmanager
def entering(actor_id: str) -> Iterator[Frame]:
    """A new frame of `actor_id` on the chain while the block runs."""
    chain = _chain.get()
    if len(chain) >= MAX_DEPTH:
        raise CallCycle(f"call chain deeper than {MAX_DEPTH} actors: {describe(chain)} -> ...")
    frame = Frame(actor_id, secrets.token_hex(8))
    token = _chain.set((*chain, frame))
    try:
        yield frame
    finally:
        _chain.reset(token)


@contextmanager
def continuing(chain: tuple[Frame, ...]) -> Iterator[None]:
    """`chain` (a caller's, from another server) as this task's chain while the block runs."""
    token = _chain.set(chain)
    try:
        yield
    finally:
        _chain.reset(token)


def detached() -> None:
    """Start this task's chain afresh: a background task waits for nobody's frame."""
    _chain.set(())


def describe(chain: tuple[Frame, ...]) -> str:
    """The actors of `chain`, outermost first; a transaction inside an action of the same actor
    is one step."""
    steps = [
        f.actor_id for i, f in enumerate(chain) if i == 0 or chain[i - 1].actor_id != f.actor_id
    ]
    return " -> ".join(steps) or "(none)"


def encode(chain: tuple[Frame, ...]) -> str:
    return ",".join(f"{frame.id}@{frame.actor_id}" for frame in chain)


def decode(text: str) -> tuple[Frame, ...]:
    """The chain an `encode`d header names; `ValueError` for anything else."""
    if not text:
        return ()
    parts = text.split(",")
    if len(parts) > MAX_DEPTH:
        raise ValueError(f"{HEADER} names more than {MAX_DEPTH} frames")
    frames = []
    for part in parts:
        match = _FRAME.match(part.strip())
        if match is None:
            raise ValueError(f"{HEADER} must be comma-separated '<16 hex digits>@<actor id>'")
        frames.append(Frame(match.group(2), match.group(1)))
    return tuple(frames)
