"""A fuzz session: many seeded runs, minimisation of a failure, replay files, coverage report."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pagekv.fuzz.execution import Coverage, FuzzFailure, Runner
from pagekv.fuzz.steps import EVENTS, Step, StepGenerator, from_json, to_json
from pagekv.kv import ActorKv, KvLimits, KvStore, MemoryStore, open_kv
from pagekv.vfs import caused_by_interrupt

KvFactory = Callable[[], ActorKv]


@dataclass(frozen=True)
class FuzzConfig:
    kv: str = "memory://"
    kv_factory: str | None = None
    """The `MODULE:CALLABLE` the runs' namespaces come from instead of `kv`, if any: a replay file
    names it, so that the failure is replayed on the same backend."""
    seed: int = 0
    runs: int | None = None
    seconds: float | None = 60.0
    steps_per_run: int = 40
    events: frozenset[str] = frozenset(EVENTS)
    max_blob: int = 3 * 2**20
    db_options: dict[str, Any] = field(default_factory=dict)
    minimize_seconds: float = 60.0


@dataclass
class Found:
    """A failing run: its seed, the minimised steps and the failure they reproduce."""

    seed: int
    steps: list[Step]
    failure: FuzzFailure
    db_options: dict[str, Any]
    """The run's options (`run_options`), which a replay must use too."""
    quota: int | None = None
    """The run's storage quota (`run_quota`), which a replay must use too."""

    def save(self, path: Path, config: FuzzConfig) -> None:
        made_on = (
            {"kv": config.kv} if config.kv_factory is None else {"kv_factory": config.kv_factory}
        )
        path.write_text(
            json.dumps(
                {
                    "seed": self.seed,
                    **made_on,
                    "db_options": self.db_options,
                    "max_storage_bytes": self.quota,
                    "failure": str(self.failure),
                    "steps": [to_json(s) for s in self.steps],
                },
                indent=1,
            )
        )


def load_replay(path: Path) -> tuple[list[Step], dict[str, Any]]:
    data = json.loads(path.read_text())
    return [from_json(s) for s in data["steps"]], data


def run_seed(seed: int, config: FuzzConfig) -> list[Step]:
    rng = random.Random(seed)
    return StepGenerator(rng, config.events, config.max_blob).steps(config.steps_per_run)


@dataclass
class _Namespaces:
    """Fresh namespaces for runs: a new in-memory store each time, or a new actor id in `url`;
    under a storage quota of `quota` bytes where it is set (one store per quota)."""

    url: str
    quota: int | None = None
    stores: dict[int | None, KvStore] = field(default_factory=dict)
    count: int = 0
    used: list[ActorKv] = field(default_factory=list)

    def __call__(self) -> ActorKv:
        self.count += 1
        limits = None if self.quota is None else KvLimits(max_storage_bytes=self.quota)
        if self.url.startswith("memory:"):
            return MemoryStore(limits=limits).namespace("fuzz")
        store = self.stores.get(self.quota)
        if store is None:
            store = self.stores[self.quota] = open_kv(self.url, limits=limits)
        ns = store.namespace(f"pagekv-fuzz/{time.time_ns()}/{self.count}")
        self.used.append(ns)
        return ns

    def cleanup(self) -> None:
        for ns in self.used:
            ns.drop()
        self.used.clear()
        for store in self.stores.values():
            store.close()
        self.stores.clear()


QUOTAS: Final = (256 * 1024, 2**20, 4 * 2**20)
"""Storage quotas of the runs that have one: small enough that commits meet them."""


def run_quota(seed: int, config: FuzzConfig) -> int | None:
    """The storage quota of run `seed`: one run in three has one when `quota` is an event."""
    if "quota" not in config.events or seed % 3 != 1:
        return None
    return random.Random(seed).choice(QUOTAS)


def run_options(seed: int, config: FuzzConfig) -> dict[str, Any]:
    """The database options of run `seed`: every other run writes each commit as a delta, so
    that delta commits and compaction are fuzzed as much as in-place commits; `config.db_options`
    overrides."""
    return {"in_place_commits": seed % 2 == 0, **config.db_options}


def execute(
    steps: list[Step], factory: KvFactory, options: dict[str, Any], release: Callable[[], None]
) -> Coverage:
    """Run `steps` on a fresh namespace from `factory`, then `release` what the run opened. A
    namespace the database cannot even be opened on (a user's backend) is a finding too."""
    try:
        try:
            runner = Runner(factory, **options)
        except Exception as e:
            raise FuzzFailure(
                -1, f"opening a database on a fresh namespace failed: {type(e).__name__}: {e}"
            ) from e
        return runner.run(steps)
    finally:
        release()


def minimize(steps: list[Step], fails: Callable[[list[Step]], bool], seconds: float) -> list[Step]:
    """Delta debugging: drop ever smaller chunks of steps while the failure still reproduces.

    Not hypothesis's shrinker: it shrinks only what hypothesis drew itself, and these steps come
    from a seeded run (`run_seed`) that `--seed` replays; `pagekv.testing.machine` is the fuzzer
    that hypothesis drives, and shrinks."""
    deadline = time.monotonic() + seconds
    chunk = max(len(steps) // 2, 1)
    while chunk >= 1 and time.monotonic() < deadline:
        start = 0
        removed = False
        while start < len(steps) and time.monotonic() < deadline:
            candidate = steps[:start] + steps[start + chunk :]
            if candidate and fails(candidate):
                steps = candidate
                removed = True
            else:
                start += chunk
        if not removed:
            chunk //= 2
    return steps


def fuzz(
    config: FuzzConfig,
    progress: Callable[[Coverage], None] | None = None,
    namespaces: KvFactory | None = None,
    release: Callable[[], None] | None = None,
) -> tuple[Coverage, Found | None]:
    """Run seeded runs until `runs` or `seconds` is reached or a run fails.

    Each run gets a fresh namespace from `namespaces` (any `ActorKv`: this is how a user fuzzes
    their own backend), by default from `config.kv`; `release` is called after each run (and each
    re-run while minimising), to close what the namespace came from. Runs under a storage quota
    (`run_quota`) need the default: a factory of the user's gives namespaces of its own limits.
    """
    stores = _Namespaces(config.kv)
    factory = namespaces or stores
    after = release or stores.cleanup
    total = Coverage()
    started = time.monotonic()
    for seed in _seeds(config, started):
        steps = run_seed(seed, config)
        stores.quota = run_quota(seed, config) if namespaces is None else None
        try:
            total.add(execute(steps, factory, run_options(seed, config), after))
        except FuzzFailure as failure:
            if caused_by_interrupt(failure):  # Ctrl-C that landed in a VFS callback: no finding
                raise KeyboardInterrupt from failure
            found = _minimized(seed, steps, failure, factory, after, config)
            found.quota = stores.quota
            return total, found
        if progress is not None:
            progress(total)
    return total, None


def _seeds(config: FuzzConfig, started: float) -> Iterator[int]:
    rng = random.Random(config.seed)
    n = 0
    while (config.runs is None or n < config.runs) and (
        config.seconds is None or time.monotonic() - started < config.seconds
    ):
        n += 1
        yield rng.randrange(2**63)


def _minimized(
    seed: int,
    steps: list[Step],
    failure: FuzzFailure,
    factory: KvFactory,
    release: Callable[[], None],
    config: FuzzConfig,
) -> Found:
    kind = _failure_kind(failure)
    options = run_options(seed, config)

    def fails(candidate: list[Step]) -> bool:
        try:
            execute(candidate, factory, options, release)
        except FuzzFailure as again:
            if caused_by_interrupt(again):
                raise KeyboardInterrupt from again
            return _failure_kind(again) == kind
        return False

    failing = steps[: failure.index + 1] if failure.index >= 0 else steps
    if not fails(failing):
        failing = steps
    small = minimize(failing, fails, config.minimize_seconds)
    try:
        execute(small, factory, options, release)
    except FuzzFailure as final:
        if caused_by_interrupt(final):
            raise KeyboardInterrupt from final
        failure = final
    return Found(seed, small, failure, options)


def _failure_kind(failure: FuzzFailure) -> str:
    """The failure's message without its step number and specifics, to compare reproductions."""
    text = str(failure).split(": ", 1)[-1]
    return text.split(":")[0].split("(")[0].strip()
