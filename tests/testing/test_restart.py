"""The restart part (`pagekv.testing.restart`): passes a durable store, and names the lost call
of stores that lose acknowledged writes or generations on a kill or a clean restart."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pagekv.kv import KvLimits, MemoryStore, open_kv
from pagekv.kv.fence import check_fence
from pagekv.kv.limits import WriteBatch, check_quota, entry_size, quota_delta
from pagekv.kv.namespace import KvNamespace
from pagekv.testing.outcome import PartResult, Status
from pagekv.testing.restart import Scenario, replay_restart, run_restart
from pagekv.testing.subject import Subject, UsageError
from pagekv.testing.violation import Violation


def file_store(location: Path, limits: KvLimits | None = None) -> Any:
    return open_kv(location.resolve().as_uri(), limits=limits)


@dataclass
class _Space:
    values: dict[bytes, bytes] = field(default_factory=dict)
    generation: int = 0
    used: int = 0


class ToyStore:
    """A persistent toy store: every namespace pickled to `location/state.pickle` (a temporary
    file, fsynced, renamed over it). Durable before it acknowledges by default; each flag
    breaks it one way:

    - `behind`: acknowledges at once and persists from a thread every 50 ms (write-behind);
    - `flush_on_close=False`: close() does not persist what the thread has not yet;
    - `keep_generation=False`: generations are not persisted (every takeover count restarts).
    """

    def __init__(
        self,
        location: Path,
        *,
        behind: bool = False,
        flush_on_close: bool = True,
        keep_generation: bool = True,
    ) -> None:
        self.limits = KvLimits()
        self._path = location / "state.pickle"
        self._behind = behind
        self._flush_on_close = flush_on_close
        self._keep_generation = keep_generation
        self.lock = threading.RLock()
        self.spaces: dict[str, _Space] = (
            pickle.loads(self._path.read_bytes()) if self._path.exists() else {}
        )
        self._dirty = False
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if behind:
            self._thread = threading.Thread(target=self._persist_behind, daemon=True)
            self._thread.start()

    def namespace(self, name: str) -> ToyNamespace:
        with self.lock:
            self.spaces.setdefault(name, _Space())
        return ToyNamespace(name, self)

    def acknowledge(self) -> None:
        """Called under `lock` by every change before it returns."""
        if self._behind:
            self._dirty = True
        else:
            self._persist()

    def _persist(self) -> None:
        with self.lock:
            spaces = {
                name: _Space(dict(s.values), s.generation if self._keep_generation else 0, s.used)
                for name, s in self.spaces.items()
            }
            self._dirty = False
            data = pickle.dumps(spaces)
            temporary = self._path.with_suffix(".tmp")
            with open(temporary, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self._path)

    def _persist_behind(self) -> None:
        while not self._closed.wait(0.05):
            if self._dirty:
                self._persist()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        if self._flush_on_close:
            self._persist()


class ToyNamespace(KvNamespace):
    def __init__(self, name: str, store: ToyStore) -> None:
        super().__init__(name, store.limits)
        self._store = store

    @property
    def _space(self) -> _Space:
        return self._store.spaces[self.actor_id]

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        with self._store.lock:
            return [self._space.values.get(k) for k in keys]

    def _list(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        with self._store.lock:
            values = self._space.values
            keys = sorted(
                k for k in values if (start is None or k >= start) and (end is None or k < end)
            )
            if reverse:
                keys.reverse()
            return [(k, values[k]) for k in keys[:limit]]

    def _write(self, batch: WriteBatch, fence: int | None) -> None:
        with self._store.lock:
            space = self._space
            check_fence(fence, space.generation)
            space.used = check_quota(self.limits, space.used, quota_delta(batch, space.values))
            for key in batch.deletes:
                space.values.pop(key, None)
            space.values.update(batch.puts)
            self._store.acknowledge()

    def _delete_range(self, start: bytes, end: bytes, fence: int | None) -> None:
        with self._store.lock:
            space = self._space
            check_fence(fence, space.generation)
            for key in [k for k in space.values if start <= k < end]:
                space.used -= entry_size(key, space.values.pop(key))
            self._store.acknowledge()

    def takeover(self) -> int:
        with self._store.lock:
            self._space.generation += 1
            self._store.acknowledge()
            return self._space.generation

    def generation(self) -> int:
        with self._store.lock:
            return self._space.generation

    def used_bytes(self) -> int:
        with self._store.lock:
            return self._space.used

    def _drop(self, fence: int | None) -> None:
        with self._store.lock:
            space = self._space
            check_fence(fence, space.generation)
            space.values.clear()
            space.used = 0
            self._store.acknowledge()


def toy(**flags: bool) -> Callable[..., ToyStore]:
    def factory(location: Path) -> ToyStore:
        return ToyStore(location, **flags)

    return factory


def restart(factory: Callable[..., Any], seconds: float, seed: int = 30) -> PartResult:
    subject = Subject(factory)
    try:
        return run_restart(subject, seconds=seconds, seed=seed)
    finally:
        subject.close()


def test_a_durable_file_store_loses_nothing() -> None:
    result = restart(file_store, seconds=1.5)
    assert result.status is Status.PASSED, result.violation
    assert result.violations == [] and result.not_checked == []
    assert "nothing lost" in result.summary
    counts = result.summary.replace(",", "").split()
    runs, restarts, kills = (int(counts[n]) for n in (0, 2, 5))
    assert runs >= 10 and restarts >= 5 and kills >= 5, result.summary


def test_a_toy_store_durable_before_it_acknowledges_loses_nothing() -> None:
    """The toy stores below fail by their flags alone."""
    result = restart(toy(), seconds=0.5)
    assert result.status is Status.PASSED, result.violation


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        (lambda: MemoryStore().namespace("n"), "returns namespaces"),
        (lambda limits=None: MemoryStore(limits=limits), "takes no location="),
    ],
    ids=["namespace", "memory store"],
)
def test_not_checked_without_a_store_factory_taking_a_location(
    factory: Callable[..., Any], why: str
) -> None:
    result = restart(factory, seconds=1.0)
    assert result.status is Status.NOT_CHECKED
    assert "needs a store factory taking location=" in result.summary and why in result.summary
    subject = Subject(factory)
    with pytest.raises(UsageError, match=why):
        replay_restart(subject, {"scenario": {"kind": "clean", "names": ["n"], "steps": []}})


def _lost(result: PartResult, clause: str) -> Violation:
    """The violation, which must name an acknowledged call of its sequence, and replay."""
    assert result.status is Status.FAILED
    v = result.violation
    assert v is not None and v.part == "restart" and v.clause == clause, v
    assert any(line.startswith(v.call) for line in v.sequence), v
    assert v.got.startswith("after the restart, "), v
    assert v.seed == 30
    details = json.loads(json.dumps(v.details))
    assert Scenario.from_json(details["scenario"]).to_json() == v.details["scenario"]
    return v


def test_a_write_behind_store_loses_acknowledged_writes_to_a_kill() -> None:
    v = _lost(restart(toy(behind=True), seconds=10), "acknowledged writes survive a kill")
    assert v.call.split(".")[1].startswith(("put(", "write(", "delete(", "delete_range(", "drop"))
    assert any(line.startswith("SIGKILL") for line in v.sequence)
    assert len(Scenario.from_json(v.details["scenario"]).calls()) <= 3, v
    subject = Subject(toy(behind=True))
    try:
        again = replay_restart(subject, v.details)
        assert again is not None and again.clause == v.clause
    finally:
        subject.close()
    subject = Subject(file_store)
    try:
        assert replay_restart(subject, v.details) is None
    finally:
        subject.close()


def test_without_kills_the_write_behind_store_passes() -> None:
    """Off the main thread there are no kills (and the result says so): a store that flushes
    on close passes clean restarts, so only a kill finds write-behind."""
    results: list[PartResult] = []
    thread = threading.Thread(target=lambda: results.append(restart(toy(behind=True), 0.5)))
    thread.start()
    thread.join()
    (result,) = results
    assert result.status is Status.PASSED, result.violation
    assert result.not_checked and "main thread" in result.not_checked[0]
    assert "0 kills" in result.summary


def test_a_store_that_does_not_persist_on_close_loses_writes_to_a_clean_restart() -> None:
    factory = toy(behind=True, flush_on_close=False)
    v = _lost(restart(factory, seconds=10), "close() keeps everything acknowledged")
    assert not any(line.startswith("SIGKILL") for line in v.sequence)
    assert len(Scenario.from_json(v.details["scenario"]).calls()) <= 2, v


def test_a_store_that_does_not_persist_the_generation_is_caught() -> None:
    started = time.monotonic()
    v = _lost(restart(toy(keep_generation=False), seconds=10), "the generation survives a restart")
    assert v.call.endswith(".takeover() -> 1"), v
    assert v.got.endswith(".generation() -> 0") and v.expected == "1", v
    assert time.monotonic() - started < 10
