"""The fuzzer finds real bugs (broken wrappers below), and a bounded session passes on pagekv."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pagekv.cli import main
from pagekv.fuzz import FuzzConfig, fuzz
from pagekv.kv import ActorKv, MemoryStore
from pagekv.kv.wrappers import KvWrapper
from pagekv.vfs.format import HEAD_KEY

T = TypeVar("T")
CI_SEED = 20261130


class _SilentlyDrops(KvWrapper):
    """Acknowledges a write without applying it when `drop` says so."""

    def __init__(self, inner: ActorKv, drop: Callable[[dict[bytes, bytes]], bool]) -> None:
        super().__init__(inner)
        self.drop = drop
        self.dropped = 0

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if op == "write" and self.drop(dict(kwargs["put"])):
            self.dropped += 1
            return None  # type: ignore[return-value]
        return fn(*args, **kwargs)


class _IgnoresFences(KvWrapper):
    """A store that applies every write whatever its fence: no single-writer safety."""

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if "fence" in kwargs:
            kwargs["fence"] = None
        return fn(*args, **kwargs)


LOST_WRITE_FINDINGS = (
    "content differs",
    "integrity_check",
    "database disk image is malformed",
    "is missing",
    "taken-over instance committed",
)
"""How a store that acknowledges unapplied writes shows up: lost commits, a broken database, a
page the writer committed but cannot find again, or a stale instance that seems to commit (its
fenced write was dropped before the fence check)."""


def _fuzz_broken(factory: Callable[[], ActorKv], **options: Any) -> str:
    config = FuzzConfig(seed=7, runs=40, seconds=None, minimize_seconds=20, **options)
    _, found = fuzz(config, namespaces=factory)
    assert found is not None, "the fuzzer missed a deliberately broken store"
    assert len(found.steps) <= 40
    return str(found.failure)


def _unlucky(put: dict[bytes, bytes], rng: random.Random) -> bool:
    return HEAD_KEY in put and rng.random() < 0.05


def test_catches_a_store_that_acknowledges_commits_it_never_applied() -> None:
    wrappers: list[_SilentlyDrops] = []
    rng = random.Random(1)

    def factory() -> ActorKv:
        w = _SilentlyDrops(MemoryStore().namespace("a"), lambda put: _unlucky(put, rng))
        wrappers.append(w)
        return w

    message = _fuzz_broken(factory)
    assert any(w.dropped for w in wrappers)
    assert any(finding in message for finding in LOST_WRITE_FINDINGS), message


def test_catches_a_store_that_drops_the_last_batch_of_a_staged_commit() -> None:
    wrappers: list[_SilentlyDrops] = []

    def factory() -> ActorKv:
        state = {"staged": False}

        def drop(put: dict[bytes, bytes]) -> bool:
            if HEAD_KEY not in put:
                state["staged"] = True
                return False
            last_of_staged, state["staged"] = state["staged"], False
            return last_of_staged

        w = _SilentlyDrops(MemoryStore().namespace("a"), drop)
        wrappers.append(w)
        return w

    message = _fuzz_broken(factory, db_options={"stage_pages": 16})
    assert any(w.dropped for w in wrappers)
    assert any(finding in message for finding in LOST_WRITE_FINDINGS), message


def test_catches_a_store_without_fencing() -> None:
    message = _fuzz_broken(lambda: _IgnoresFences(MemoryStore().namespace("a")))
    assert "taken-over instance committed" in message


def test_failure_is_minimised_saved_and_replayable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = FuzzConfig(seed=7, runs=40, seconds=None, minimize_seconds=20)
    _, found = fuzz(config, namespaces=lambda: _IgnoresFences(MemoryStore().namespace("a")))
    assert found is not None
    path = tmp_path / "failure.json"
    found.save(path, config)
    assert main(["fuzz", "--replay", str(path)]) == 0, "replay on a correct store must pass"
    assert "replay of" in capsys.readouterr().out


@pytest.mark.parametrize("seed", [CI_SEED, None], ids=["fixed-seed", "random-seed"])
def test_bounded_fuzz_session_passes(seed: int | None, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fuzz", "--seconds", "25"]
    if seed is not None:
        args += ["--seed", str(seed)]
    code = main(args)
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{out.splitlines()[0]}")  # the session seed, so a CI failure can be replayed
    assert code == 0, out
    assert "seed" in out.splitlines()[0]
    assert "faults fired: apply-then-raise" in out and "fail-before" in out
    for event in ("takeovers", "crashes", "compactions", "latency changes"):
        assert int(out.split(f"{event} ")[1].split(",")[0]) > 0, f"no {event} in {out}"


def test_real_crashes_with_sigkill(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["fuzz", "--processes", "--kv", f"file://{tmp_path}/kv", "--seconds", "8", "--seed", "5"]
    )
    out, err = capfd.readouterr()  # the children's stderr too: they must start cleanly
    assert code == 0, out
    crashes = int(out.split("crashes ")[1].split(",")[0])
    assert crashes >= 3, out
    assert "Warning" not in err, err
