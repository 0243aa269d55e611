"""Fuzz steps: what a run does, as plain data that can be generated, saved, minimised, replayed.

A step never holds random bytes, only how to make them (`Blob(size, seed)`), so a replay file is
small and a run is a pure function of its steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, assert_never

from pagekv.kv import FaultKind


@dataclass(frozen=True, slots=True)
class Blob:
    size: int
    seed: int

    def materialize(self) -> bytes:
        return random.Random(self.seed).randbytes(self.size)


Param = int | str | Blob


@dataclass(frozen=True, slots=True)
class Sql:
    sql: str
    params: tuple[Param, ...] = ()

    def bindings(self) -> tuple[Any, ...]:
        return tuple(p.materialize() if isinstance(p, Blob) else p for p in self.params)


@dataclass(frozen=True, slots=True)
class Txn:
    """Statements run in one transaction (`explicit`: inside BEGIN/COMMIT) or one autocommit."""

    statements: tuple[Sql, ...]
    explicit: bool = True


@dataclass(frozen=True, slots=True)
class InjectFault:
    """Break the `after`-th upcoming KV call (any op) of the current instance."""

    kind: FaultKind
    after: int


@dataclass(frozen=True, slots=True)
class Latency:
    """Add `ms` of round-trip latency to every KV call of the current instance from now on."""

    ms: float


@dataclass(frozen=True, slots=True)
class Crash:
    """Abandon the instance without closing it; reopen fresh."""


@dataclass(frozen=True, slots=True)
class Takeover:
    """A second instance opens the namespace; the first must die on its next write."""


@dataclass(frozen=True, slots=True)
class Compact:
    """Run compaction now."""


@dataclass(frozen=True, slots=True)
class Reopen:
    """Close cleanly and reopen."""


@dataclass(frozen=True, slots=True)
class Recreate:
    """Drop the namespace and write a new database in it while a read-only snapshot (of
    `cache_pages` pages) is in the middle of scanning the old one; the new one gets as many
    commits as the old head's txid plus `extra`, so its transaction numbers cover the old ones."""

    cache_pages: int
    extra: int
    seed: int


Step = Txn | InjectFault | Latency | Crash | Takeover | Compact | Reopen | Recreate

EVENTS = ("fail", "indeterminate", "latency", "crash", "takeover", "compact", "quota", "recreate")
"""Names for `--faults`: which kinds of disruption a run may include. `quota` runs some runs
under a small storage quota (a run property, not a step: `session.run_quota`)."""
PROCESS_EVENTS = ("crash", "disk", "future", "shm", "stop")
"""Names for `--faults` with `--processes`: SIGKILL of a committing child, the disk filling up
under it (`RLIMIT_FSIZE`: short writes, then `EFBIG`, in the log and in folds), and what another
process does to a `file:` store under it: a newer pagekv's log header (`future`), `kv.shm`
deleted or replaced before a second writer opens the store (`shm`), a writer stopped while it
holds the flusher lock (`stop`)."""
FILE_ONLY_EVENTS = ("disk", "future", "shm", "stop")
"""The `--processes` events that act on a `file:` store's own files."""


def to_json(step: Step) -> dict[str, Any]:
    match step:
        case Txn(statements, explicit):
            return {
                "type": "txn",
                "explicit": explicit,
                "statements": [[s.sql, [_param_json(p) for p in s.params]] for s in statements],
            }
        case InjectFault(kind, after):
            return {"type": "fault", "kind": kind.value, "after": after}
        case Latency(ms):
            return {"type": "latency", "ms": ms}
        case Crash():
            return {"type": "crash"}
        case Takeover():
            return {"type": "takeover"}
        case Compact():
            return {"type": "compact"}
        case Reopen():
            return {"type": "reopen"}
        case Recreate(cache_pages, extra, seed):
            return {"type": "recreate", "cache_pages": cache_pages, "extra": extra, "seed": seed}
        case _:
            assert_never(step)


def from_json(data: dict[str, Any]) -> Step:
    kind = data["type"]
    if kind == "txn":
        statements = tuple(
            Sql(sql, tuple(_param_from_json(p) for p in params))
            for sql, params in data["statements"]
        )
        return Txn(statements, data["explicit"])
    if kind == "fault":
        return InjectFault(FaultKind(data["kind"]), data["after"])
    if kind == "latency":
        return Latency(data["ms"])
    if kind == "recreate":
        return Recreate(data["cache_pages"], data["extra"], data["seed"])
    simple: dict[str, Step] = {
        "crash": Crash(),
        "takeover": Takeover(),
        "compact": Compact(),
        "reopen": Reopen(),
    }
    if kind not in simple:
        raise ValueError(f"unknown step type {kind!r} in replay file")
    return simple[kind]


def _param_json(p: Param) -> Any:
    return {"blob": [p.size, p.seed]} if isinstance(p, Blob) else p


def _param_from_json(p: Any) -> Param:
    if isinstance(p, dict):
        size, seed = p["blob"]
        return Blob(size, seed)
    return p


class StepGenerator:
    """Seeded random workloads: DDL, writes of random sizes (rarely multi-MiB), savepoints and
    rollbacks, VACUUM, index builds and truncation-heavy deletes, mixed with disruptions."""

    TABLES = 3

    def __init__(self, rng: random.Random, events: frozenset[str], max_blob: int) -> None:
        self.rng = rng
        self.events = events
        self.max_blob = max_blob

    def steps(self, n: int) -> list[Step]:
        steps: list[Step] = [self._create(t) for t in range(self.TABLES)]
        while len(steps) < n:
            steps.append(self.step())
        return steps

    def step(self) -> Step:
        r = self.rng.random()
        events = self.events
        if r < 0.10 and events & {"fail", "indeterminate"}:
            kinds = [
                k
                for name, k in (
                    ("fail", FaultKind.FAIL_BEFORE),
                    ("indeterminate", FaultKind.APPLY_THEN_RAISE),
                )
                if name in events
            ]
            return InjectFault(self.rng.choice(kinds), self.rng.randrange(4))
        if r < 0.12 and "latency" in events:
            return Latency(self.rng.choice((0.0, 0.2, 1.0)))
        if r < 0.14 and "crash" in events:
            return Crash()
        if r < 0.18 and "takeover" in events:
            return Takeover()
        if r < 0.23 and "compact" in events:
            return Compact()
        if r < 0.25:
            return Reopen()
        if r < 0.26 and "recreate" in events:
            rng = self.rng
            return Recreate(rng.choice((1, 4, 16)), rng.randrange(8), rng.randrange(2**31))
        if r < 0.28:
            return Txn((Sql("VACUUM"),), explicit=False)
        return self._txn()

    @classmethod
    def recreation(cls, step: Recreate, commits: int) -> list[Txn]:
        """The new database of a `Recreate`: the same tables, then `commits` one-row commits
        whose rows (`k` from a million up) cannot be mistaken for a generated row."""
        rng = random.Random(step.seed)
        txns = [cls._create(t) for t in range(cls.TABLES)]
        for i in range(commits):
            blob = Blob(rng.randrange(0, 4096), rng.randrange(2**31))
            insert = f"INSERT INTO t{i % cls.TABLES}(k, v) VALUES (?, ?)"
            txns.append(Txn((Sql(insert, (1_000_000 + i, blob)),), explicit=False))
        return txns

    @staticmethod
    def _create(table: int) -> Txn:
        columns = "id INTEGER PRIMARY KEY, k INTEGER, v BLOB"
        return Txn((Sql(f"CREATE TABLE IF NOT EXISTS t{table}({columns})"),))

    def _blob(self) -> Blob:
        r = self.rng.random()
        if r < 0.02:
            size = self.rng.randrange(self.max_blob // 4, self.max_blob + 1)
        elif r < 0.15:
            size = self.rng.randrange(4096, 65536)
        else:
            size = self.rng.randrange(0, 2048)
        return Blob(size, self.rng.randrange(2**31))

    def _statement(self) -> Sql:
        rng = self.rng
        t = f"t{rng.randrange(self.TABLES)}"
        m = rng.randrange(2, 6)
        r = rng.random()
        if r < 0.45:
            return Sql(f"INSERT INTO {t}(k, v) VALUES (?, ?)", (rng.randrange(1000), self._blob()))
        if r < 0.65:
            return Sql(f"UPDATE {t} SET v = ?, k = k + 1 WHERE id % {m} = ?", (self._blob(), 0))
        if r < 0.78:
            return Sql(f"DELETE FROM {t} WHERE id % {m} = ?", (rng.randrange(m),))
        if r < 0.83:
            return Sql(f"DELETE FROM {t} WHERE id > (SELECT max(id) FROM {t}) / ?", (m,))
        if r < 0.90:
            return Sql(f"CREATE INDEX IF NOT EXISTS {t}_k ON {t}(k)")
        if r < 0.94:
            return Sql(f"DROP INDEX IF EXISTS {t}_k")
        return Sql(f"INSERT INTO {t}(k, v) SELECT k + 1, v FROM {t} WHERE id % {m} = 0")

    def _txn(self) -> Txn:
        rng = self.rng
        statements: list[Sql] = []
        for _ in range(rng.randrange(1, 6)):
            if rng.random() < 0.15:
                name = f"s{rng.randrange(100)}"
                statements.append(Sql(f"SAVEPOINT {name}"))
                statements.extend(self._statement() for _ in range(rng.randrange(1, 4)))
                end = "ROLLBACK TO" if rng.random() < 0.5 else "RELEASE"
                statements.append(Sql(f"{end} {name}"))
                if end == "ROLLBACK TO":
                    statements.append(Sql(f"RELEASE {name}"))
            else:
                statements.append(self._statement())
        autocommit = len(statements) == 1 and rng.random() < 0.3
        return Txn(tuple(statements), explicit=not autocommit)
