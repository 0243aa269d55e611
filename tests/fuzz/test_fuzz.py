"""The fuzzer finds real bugs (broken wrappers below), and a bounded session passes on pagekv."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pagekv.cli import main
from pagekv.fuzz import FuzzConfig, fuzz
from pagekv.fuzz.execution import FuzzFailure
from pagekv.kv import ActorKv, MemoryStore, StorageQuotaExceeded
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


def test_real_crashes_of_concurrent_writers(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`--writers 3`: each child commits on three actors at once; after every kill each actor
    is verified against its own oracle, and the children's flushes per write are reported."""
    args = ["fuzz", "--processes", "--writers", "3", "--kv", f"file://{tmp_path}/kv"]
    code = main([*args, "--seconds", "8", "--seed", "11"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    crashes = int(out.split("crashes ")[1].split(",")[0])
    verifications = int(out.split("verifications ")[1].split(",")[0])
    assert crashes >= 3, out
    # Every life verifies each of its three actors (none finishes its 400 transactions in 8 s).
    assert verifications >= 3 * crashes, out
    flushes, writes = out.split("per write in the children ")[1].split("(")[1].split()[::3][:2]
    assert int(writes) >= crashes and int(flushes) > 0, out
    assert "Traceback" not in err and "Warning" not in err, err


class _QuotaAfterApplying(KvWrapper):
    """Applies a write, then says the storage quota refused it (every `every`-th big write)."""

    def __init__(self, inner: ActorKv, every: int) -> None:
        super().__init__(inner)
        self.every = every
        self.writes = 0
        self.lied = 0

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        result = fn(*args, **kwargs)
        if op == "write" and HEAD_KEY in kwargs["put"]:
            self.writes += 1
            if self.writes % self.every == 0:
                self.lied += 1
                raise StorageQuotaExceeded("storage after write", 2, 1)
        return result


class _ResetsGenerationOnDrop(KvWrapper):
    """Starts generations again at 0 after `drop`, as a careless backend might: a new database
    written after a drop then carries the generations of the old one."""

    def __init__(self, inner: ActorKv) -> None:
        super().__init__(inner)
        self.offset = 0

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if kwargs.get("fence") is not None:
            kwargs["fence"] += self.offset
        result = fn(*args, **kwargs)
        if op == "drop":
            self.offset = self.inner.generation()
        elif op in ("generation", "takeover"):
            return result - self.offset  # type: ignore[operator, no-any-return]
        return result


def test_catches_a_store_that_applies_what_it_refused_for_the_quota() -> None:
    wrappers: list[_QuotaAfterApplying] = []

    def factory() -> ActorKv:
        w = _QuotaAfterApplying(MemoryStore().namespace("a"), every=7)
        wrappers.append(w)
        return w

    message = _fuzz_broken(factory, events=frozenset({"compact"}))
    assert any(w.lied for w in wrappers)
    findings = (*LOST_WRITE_FINDINGS, "refused by the quota")  # the lie shows up either way
    assert any(s in message for s in findings), message


def test_catches_a_store_whose_generations_start_again_after_a_drop() -> None:
    message = _fuzz_broken(
        lambda: _ResetsGenerationOnDrop(MemoryStore().namespace("a")),
        events=frozenset({"recreate"}),
        steps_per_run=60,
    )
    assert "a snapshot read rows of a newer database" in message, message


def test_quota_and_recreation_runs_happen_and_pass() -> None:
    config = FuzzConfig(seed=3, runs=30, seconds=None, events=frozenset({"quota", "recreate"}))
    coverage, found = fuzz(config)
    assert found is None, found and found.failure
    assert coverage.quota_refusals > 0 and coverage.recreations > 0, coverage


@pytest.mark.parametrize("replay", sorted((Path(__file__).parent / "replays").glob("*.json")))
def test_past_findings_replay_clean(replay: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each file is a minimised failure the fuzzer once found in pagekv itself."""
    assert main(["fuzz", "--replay", str(replay)]) == 0, capsys.readouterr().err


def test_a_full_disk_under_real_children(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`--faults disk`: every child life fills the disk (RLIMIT_FSIZE) in the log or a fold and
    ends at its first failed commit; the parent checks the store each time."""
    args = ["fuzz", "--processes", "--faults", "disk", "--kv", f"file://{tmp_path}/kv"]
    code = main([*args, "--seconds", "8", "--seed", "5"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    fired = {w: int(out.split(f"disk-{w} ")[1].split(",")[0].split()[0]) for w in ("log", "fold")}
    assert fired["log"] >= 3 and fired["fold"] >= 1, out
    assert "Traceback" not in err, err


def test_the_store_refuses_what_it_cannot_read_under_real_children(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`--faults future,shm,stop`: a log header from a newer format must be refused and then
    restored untouched; a deleted or replaced `kv.shm` under a live side writer, and a side writer
    stopped while it holds the flusher lock, must lose nothing either acknowledged."""
    args = ["fuzz", "--processes", "--faults", "future,shm,stop", "--kv", f"file://{tmp_path}/kv"]
    code = main([*args, "--seconds", "12", "--seed", "3"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    fired = out.split("faults fired: ")[1].splitlines()[0]
    counts = {name: int(n) for name, n in (part.split() for part in fired.split(", "))}
    assert counts.get("future-header", 0) >= 1, out
    assert counts.get("shm-deleted", 0) + counts.get("shm-replaced", 0) >= 2, out
    assert counts.get("stopped-flusher", 0) >= 1, out
    assert "Traceback" not in err, err


class _CtrlCOnWrite(KvWrapper):
    """Ctrl-C landing in a VFS callback: the `at`-th write of the store (counted across its
    namespaces) raises `KeyboardInterrupt`, as the signal does in whatever code runs then."""

    writes = 0

    def __init__(self, inner: ActorKv, at: int) -> None:
        super().__init__(inner)
        self.at = at

    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if op == "write":
            _CtrlCOnWrite.writes += 1
            if _CtrlCOnWrite.writes == self.at:
                raise KeyboardInterrupt
        return fn(*args, **kwargs)


@pytest.mark.parametrize("at", [3, 40, 400])
def test_ctrl_c_inside_the_vfs_stops_the_session_and_is_no_finding(at: int) -> None:
    """The VFS turns the interrupt into a dead database (SQLite sees an I/O error), which the
    runner met as "storage error with no fault injected": a Ctrl-C reported as a bug, minimised
    and written to a replay file. It is the interrupt again, whatever it killed."""
    _CtrlCOnWrite.writes = 0
    config = FuzzConfig(seed=3, runs=30, seconds=None, minimize_seconds=5)
    with pytest.raises(KeyboardInterrupt) as stopped:
        fuzz(config, namespaces=lambda: _CtrlCOnWrite(MemoryStore().namespace("a"), at))
    assert _CtrlCOnWrite.writes >= at, "the interrupt never fired"
    assert isinstance(stopped.value.__cause__, FuzzFailure), "it came through the VFS's death"
