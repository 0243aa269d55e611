"""The concurrent part of `check_backend`: the linearizability checker on histories made by hand,
the part passing on pagekv's own backends, and catching racy backends by the clause they break."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pagekv.kv import (
    FenceMismatch,
    KvIndeterminate,
    KvLimits,
    KvNamespace,
    KvStore,
    MemoryStore,
    open_kv,
)
from pagekv.kv.fence import check_fence
from pagekv.kv.limits import WriteBatch, check_quota, entry_size, quota_delta
from pagekv.testing.concurrent import (
    BATCH_ATOMIC,
    FENCE_ATOMIC,
    FENCE_REFUSED,
    FRESH_READS,
    KV_ERRORS,
    RETURNS,
    TAKEOVERS,
    Event,
    Inconclusive,
    check_history,
    replay_concurrent,
    run_concurrent,
)
from pagekv.testing.model import Model, Op, Outcome
from pagekv.testing.outcome import Status
from pagekv.testing.subject import Subject

# --- the checker on hand-made histories ------------------------------------------------------


def call(
    thread: int, start: int, end: int, method: str, *args: Any, returns: Any = None, **kw: Any
) -> Event:
    """An event of a call that returned `returns`."""
    return Event(thread, Op.of(method, *args, **kw), Outcome(returns), start, end)


def refused(thread: int, start: int, end: int, method: str, *args: Any, **kw: Any) -> Event:
    error = FenceMismatch(kw.get("fence", 0), 0)
    outcome = Outcome(errors=frozenset({FenceMismatch}), raised=error)
    return Event(thread, Op.of(method, *args, **kw), outcome, start, end)


def fresh() -> Model:
    return Model(KvLimits())


def test_overlapping_calls_may_take_effect_in_either_order() -> None:
    for seen in (None, b"1"):
        history = [
            call(0, 0, 10, "put", {b"a": b"1"}),
            call(1, 5, 15, "get", [b"a"], returns=[seen]),
        ]
        assert check_history(history, fresh()) is None


def test_a_read_after_an_acknowledged_write_must_see_it() -> None:
    history = [
        call(0, 0, 10, "put", {b"a": b"1"}),
        call(1, 20, 30, "get", [b"a"], returns=[None]),
    ]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == FRESH_READS
    assert failure.event is history[1]
    assert "t1 put(" in failure.got
    assert failure.expected == "returns [b'1']"


def test_two_takeovers_returning_one_generation_fail() -> None:
    history = [call(0, 0, 10, "takeover", returns=1), call(1, 5, 15, "takeover", returns=1)]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == TAKEOVERS
    assert failure.event is history[1]
    assert "as did t1 takeover()" in failure.got
    assert "1..2" in failure.expected


def test_two_overlapping_takeovers_may_return_either_generation() -> None:
    history = [call(0, 0, 10, "takeover", returns=2), call(1, 5, 15, "takeover", returns=1)]
    assert check_history(history, fresh()) is None


def test_a_fenced_write_after_a_completed_takeover_must_be_refused() -> None:
    history = [
        call(0, 0, 10, "takeover", returns=1),
        call(1, 20, 30, "put", {b"a": b"1"}, fence=0),
    ]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == FENCE_REFUSED
    assert failure.event is history[1]
    assert failure.expected == "raises FenceMismatch"
    assert (
        check_history([history[0], refused(1, 20, 30, "put", {b"a": b"1"}, fence=0)], fresh())
        is None
    )


def test_a_write_overtaken_between_its_fence_check_and_its_write_fails() -> None:
    """t1's write began before t2's takeover, so it may come first; but then t2's own fenced
    write, after its takeover, must win: the final value shows t1's write landed last."""
    history = [
        call(0, 0, 100, "put", {b"a": b"t1"}, fence=0),
        call(1, 10, 20, "takeover", returns=1),
        call(1, 30, 40, "put", {b"a": b"t2"}, fence=1),
        call(-1, 200, 210, "list", returns=[(b"a", b"t1")]),
    ]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == FENCE_ATOMIC
    assert failure.event is history[0]
    assert "t2 takeover() -> 1" in failure.got
    history[-1] = call(-1, 200, 210, "list", returns=[(b"a", b"t2")])
    assert check_history(history, fresh()) is None


def test_a_reader_seeing_half_a_batch_fails_and_names_the_batch() -> None:
    history = [
        call(0, 0, 100, "write", put={b"a": b"1", b"b": b"1"}, delete=[]),
        call(1, 10, 20, "get", [b"a", b"b"], returns=[b"1", None]),
    ]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == BATCH_ATOMIC
    assert failure.event is history[0]
    assert "t2 get(" in failure.got
    history[1] = call(1, 10, 20, "get", [b"a", b"b"], returns=[b"1", b"1"])
    assert check_history(history, fresh()) is None


def test_an_indeterminate_write_may_or_may_not_have_happened() -> None:
    error = KvIndeterminate("timed out")
    unknown = Outcome(errors=frozenset({KvIndeterminate}), raised=error)
    for seen in (None, b"1"):
        history = [
            Event(0, Op.of("put", {b"a": b"1"}), unknown, 0, 10),
            call(1, 20, 30, "get", [b"a"], returns=[seen]),
        ]
        assert check_history(history, fresh()) is None


def test_an_error_that_is_not_a_kv_error_fails() -> None:
    history = [Event(0, Op.of("get", [b"a"]), None, 0, 10, KeyError(b"a"))]
    failure = check_history(history, fresh())
    assert failure is not None
    assert failure.clause == KV_ERRORS
    assert failure.got == "raised KeyError: b'a'"


def test_a_search_past_its_budget_is_inconclusive_not_passed() -> None:
    history = [call(t, 0, 100, "put", {b"a": bytes([t])}) for t in range(4)]
    history.append(call(-1, 200, 210, "get", [b"a"], returns=[b"\x03"]))
    assert check_history(history, fresh()) is None
    with pytest.raises(Inconclusive):
        check_history(history, fresh(), budget=2)


# --- backends: pagekv's own pass, racy ones are caught ---------------------------------------


class DictKv(KvNamespace):
    """A namespace that does everything under one lock: conforming, and the base of the racy
    ones below, which each change one thing."""

    def __init__(self, limits: KvLimits | None = None) -> None:
        super().__init__("check", limits or KvLimits())
        self.lock = threading.Lock()
        self.values: dict[bytes, bytes] = {}
        self.gen = 0
        self.used = 0

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        with self.lock:
            return [self.values.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        with self.lock:
            keys = sorted(
                k for k in self.values if (start is None or k >= start) and (end is None or k < end)
            )
            keys = keys[::-1] if reverse else keys
            return [(k, self.values[k]) for k in keys[:limit]]

    def apply(self, puts: dict[bytes, bytes], deletes: tuple[bytes, ...]) -> None:
        for k in deletes:
            if k in self.values:
                self.used -= entry_size(k, self.values.pop(k))
        for k, v in puts.items():
            if k in self.values:
                self.used -= entry_size(k, self.values[k])
            self.values[k] = v
            self.used += entry_size(k, v)

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        with self.lock:
            check_fence(fence, self.gen)
            check_quota(self.limits, self.used, quota_delta(batch, self.values))
            self.apply(batch.puts, batch.deletes)

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        with self.lock:
            check_fence(fence, self.gen)
            self.apply({}, tuple(k for k in self.values if start <= k < end))

    def takeover(self) -> int:
        with self.lock:
            self.gen += 1
            return self.gen

    def generation(self) -> int:
        with self.lock:
            return self.gen

    def used_bytes(self) -> int:
        with self.lock:
            return self.used

    def _drop(self, fence: int | None) -> None:
        with self.lock:
            check_fence(fence, self.gen)
            self.values.clear()
            self.used = 0


_WINDOW_S = 0.001
"""How long the racy backends below hold their race window open: a bare `sleep(0)` only offers
the GIL, and on a loaded machine the other thread may not take it for a whole round, so the
race (and its replay) would be met by chance alone."""


class FenceByRead(DictKv):
    """Checks the fence against a generation read in a round trip of its own before the write."""

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        current = self.generation()
        time.sleep(_WINDOW_S)
        check_fence(fence, current)
        with self.lock:
            check_quota(self.limits, self.used, quota_delta(batch, self.values))
            self.apply(batch.puts, batch.deletes)


class TakeoverByRead(DictKv):
    """Takes over by reading the generation, then writing it one higher."""

    def takeover(self) -> int:
        generation = self.generation() + 1
        time.sleep(_WINDOW_S)
        with self.lock:
            self.gen = generation
        return generation


class TornToReaders(DictKv):
    """Writers and takeovers queue on a lock of their own, so fences and writes are atomic among
    themselves; but a batch takes the data lock key by key, so a reader can see half of it."""

    def __init__(self, limits: KvLimits | None = None) -> None:
        super().__init__(limits)
        self.writer = threading.Lock()

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        with self.writer:
            with self.lock:
                check_fence(fence, self.gen)
                check_quota(self.limits, self.used, quota_delta(batch, self.values))
            for k in batch.deletes:
                with self.lock:
                    self.apply({}, (k,))
                time.sleep(_WINDOW_S)
            for k, v in batch.puts.items():
                with self.lock:
                    self.apply({k: v}, ())
                time.sleep(_WINDOW_S)

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        with self.writer:
            super()._delete_range(start, end, fence)

    def takeover(self) -> int:
        with self.writer:
            return super().takeover()

    def _drop(self, fence: int | None) -> None:
        with self.writer:
            super()._drop(fence)


class HandleCachedStore:
    """A store whose namespace objects each check fences against the generation they last saw
    themselves: right with one object, wrong as soon as two handles share a namespace."""

    def __init__(self, limits: KvLimits | None = None) -> None:
        self.shared = DictKv(limits)

    def namespace(self, name: str) -> DictKv:
        return _CachedHandle(self.shared)

    def close(self) -> None:
        pass


class _CachedHandle(DictKv):
    def __init__(self, shared: DictKv) -> None:
        super().__init__(shared.limits)
        self.shared = shared
        self.lock, self.values = shared.lock, shared.values
        self.seen = shared.gen

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        with self.lock:
            check_fence(fence, self.seen)
            check_quota(self.limits, self.shared.used, quota_delta(batch, self.values))
            self.shared.apply(batch.puts, batch.deletes)

    def takeover(self) -> int:
        self.seen = self.shared.takeover()
        return self.seen

    def generation(self) -> int:
        return self.shared.generation()

    def used_bytes(self) -> int:
        return self.shared.used_bytes()

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        self.shared._delete_range(start, end, fence)

    def _drop(self, fence: int | None) -> None:
        self.shared._drop(fence)


def memory_store(limits: KvLimits | None = None) -> KvStore:
    return MemoryStore(limits=limits)


def memory_namespace(limits: KvLimits | None = None) -> Any:
    return MemoryStore(limits=limits).namespace("n")


def file_store(location: Path, limits: KvLimits | None = None) -> KvStore:
    return open_kv(location.as_uri(), limits=limits)


@pytest.mark.parametrize(
    "factory",
    [memory_store, memory_namespace, file_store, DictKv],
    ids=["memory-store", "memory-namespace", "file-store", "one-lock-dict"],
)
def test_conforming_backends_pass(factory: Any) -> None:
    subject = Subject(factory)
    try:
        result = run_concurrent(subject, seconds=1.0, seed=5)
    finally:
        subject.close()
    assert result.status is Status.PASSED, result.violation
    assert "calls linearizable" in result.summary
    assert not result.not_checked


@pytest.mark.parametrize(
    ("factory", "clause", "method"),
    [
        (FenceByRead, (FENCE_ATOMIC,), ("put(", "write(", "delete(")),
        (TakeoverByRead, (TAKEOVERS,), ("takeover()",)),
        (TornToReaders, (BATCH_ATOMIC,), ("put(", "write(")),
        (HandleCachedStore, (FENCE_REFUSED, FENCE_ATOMIC), ("put(", "write(", "delete(")),
    ],
    ids=["fence-by-read", "takeover-by-read", "batch-torn-to-readers", "fence-cached-per-handle"],
)
def test_racy_backends_are_caught_by_the_clause_they_break(
    factory: Any, clause: tuple[str, ...], method: tuple[str, ...]
) -> None:
    """A handle that checks fences against its own cached generation lets a stale write through
    either after the takeover completed (refused) or while it ran, ordered after it by another
    call (atomic): which of the two a run shows first depends on the machine's timing."""
    subject = Subject(factory)
    try:
        result = run_concurrent(subject, seconds=6.0, seed=1)
        violation = result.violation
        assert result.status is Status.FAILED and violation is not None, result.summary
        assert violation.clause in clause, violation
        assert violation.part == "concurrent"
        assert violation.seed == 1
        assert any(m in violation.call for m in method), violation
        assert violation.call.startswith("t"), violation
        replayed = replay_concurrent(subject, json.loads(json.dumps(violation.details)))
    finally:
        subject.close()
    assert replayed is not None, f"the reported program did not reproduce: {violation.details}"
    assert replayed.details["program"] == violation.details["program"]


def test_a_failure_is_minimised_to_the_calls_that_race() -> None:
    subject = Subject(TakeoverByRead)
    try:
        violation = run_concurrent(subject, seconds=4.0, seed=2).violation
    finally:
        subject.close()
    assert violation is not None
    threads = violation.details["program"]["threads"]
    assert [[step["op"]["method"] for step in steps] for steps in threads] == [["takeover"]] * 2
    assert sum("takeover() -> " in line for line in violation.sequence) == 2, violation


class StuckTakeover(DictKv):
    """A takeover that waits for `release` forever, as one waiting on a lock it never gets."""

    release = threading.Event()

    def takeover(self) -> int:
        self.release.wait()
        return super().takeover()


def test_a_call_that_never_returns_is_reported() -> None:
    subject = Subject(StuckTakeover, call_timeout=0.5)
    try:
        result = run_concurrent(subject, seconds=0.1, seed=3)
    finally:
        StuckTakeover.release.set()
        subject.close()
    violation = result.violation
    assert violation is not None, result.summary
    assert violation.clause == RETURNS
    assert "takeover()" in violation.call
    assert violation.got == "did not return within 0.5 s"
    assert subject.hung is not None, "the subject makes no calls after one hung"
