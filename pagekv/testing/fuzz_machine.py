"""Fuzzing building blocks for your own tests: hypothesis strategies of fuzz steps, and a
stateful machine that drives pagekv on any `ActorKv` against the native SQLite oracle.

    from pagekv.testing import machine
    TestMyBackend = machine(lambda: MyKv(...)).TestCase

Every rule is one fuzz step and is checked exactly as `pagekv fuzz` checks it; hypothesis then
shrinks a failure to a short sequence of steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
except ModuleNotFoundError as e:  # hypothesis is not a dependency of pagekv itself
    if (e.name or "").partition(".")[0] != "hypothesis":
        raise
    raise ModuleNotFoundError(
        "pagekv.testing needs hypothesis, which pagekv's testing extra installs: "
        "pip install 'pagekv[testing]'",
        name=e.name,
    ) from e

from pagekv.fuzz import (
    Blob,
    Compact,
    Crash,
    InjectFault,
    Latency,
    Reopen,
    Runner,
    Sql,
    Step,
    StepGenerator,
    Takeover,
    Txn,
)
from pagekv.kv import ActorKv, FaultKind

TABLES = [f"t{n}" for n in range(StepGenerator.TABLES)]


def blobs(max_size: int = 256 * 1024) -> st.SearchStrategy[Blob]:
    return st.builds(Blob, st.integers(0, max_size), st.integers(0, 2**31 - 1))


def statements(max_blob: int = 256 * 1024) -> st.SearchStrategy[Sql]:
    table = st.sampled_from(TABLES)
    modulus = st.integers(2, 5)
    return st.one_of(
        st.builds(
            lambda t, k, b: Sql(f"INSERT INTO {t}(k, v) VALUES (?, ?)", (k, b)),
            table,
            st.integers(0, 1000),
            blobs(max_blob),
        ),
        st.builds(
            lambda t, m, b: Sql(f"UPDATE {t} SET v = ?, k = k + 1 WHERE id % {m} = 0", (b,)),
            table,
            modulus,
            blobs(max_blob),
        ),
        st.builds(lambda t, m: Sql(f"DELETE FROM {t} WHERE id % {m} = 0"), table, modulus),
        st.builds(lambda t: Sql(f"CREATE INDEX IF NOT EXISTS {t}_k ON {t}(k)"), table),
        st.builds(lambda t: Sql(f"DROP INDEX IF EXISTS {t}_k"), table),
    )


def transactions(max_blob: int = 256 * 1024) -> st.SearchStrategy[Txn]:
    body = st.lists(statements(max_blob), min_size=1, max_size=5)
    rollback = st.builds(
        lambda inner: (Sql("SAVEPOINT sp"), *inner, Sql("ROLLBACK TO sp"), Sql("RELEASE sp")),
        body,
    )
    return st.one_of(
        st.builds(lambda s: Txn(tuple(s)), body),
        st.builds(lambda before, rb: Txn((*before, *rb)), body, rollback),
        st.just(Txn((Sql("VACUUM"),), explicit=False)),
    )


def faults() -> st.SearchStrategy[InjectFault]:
    return st.builds(InjectFault, st.sampled_from(list(FaultKind)), st.integers(0, 3))


def steps(max_blob: int = 256 * 1024) -> st.SearchStrategy[Step]:
    return st.one_of(
        transactions(max_blob),
        faults(),
        st.builds(Latency, st.sampled_from([0.0, 0.5])),
        st.sampled_from([Crash(), Takeover(), Compact(), Reopen()]),
    )


def machine(
    kv_factory: Callable[[], ActorKv], *, max_blob: int = 256 * 1024, **db_options: Any
) -> type[RuleBasedStateMachine]:
    """A state machine running fuzz steps on a fresh namespace from `kv_factory` per example."""

    class PagekvMachine(RuleBasedStateMachine):
        runner: Runner

        @initialize()
        def open(self) -> None:
            self.runner = Runner(kv_factory, **db_options)
            for table in TABLES:
                columns = "id INTEGER PRIMARY KEY, k INTEGER, v BLOB"
                self.runner.step(Txn((Sql(f"CREATE TABLE {table}({columns})"),)))

        failed = False

        @rule(step=steps(max_blob))
        def run_step(self, step: Step) -> None:
            try:
                self.runner.step(step)
            except BaseException:
                self.failed = True
                raise

        def teardown(self) -> None:
            """The final reopen check, unless a step already failed (its error is the report)."""
            runner = getattr(self, "runner", None)
            if runner is not None:
                try:
                    if not self.failed:
                        runner.finish()
                finally:
                    runner.close()

    return PagekvMachine
