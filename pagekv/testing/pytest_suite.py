"""The contract clauses as a pytest suite: subclass `KvContract` and give it a `kv_factory`.

    from pagekv.testing import KvContract

    class TestMyKv(KvContract):
        @pytest.fixture
        def kv_factory(self):
            return my_factory  # the factory contract of `pagekv.testing.subject`

Each clause is a test of its own, `test_clause[<clause name>]`: it passes when the clause holds,
fails with the violation's report when it does not, and is skipped, with the reason, when the
factory cannot run it (it needs a store, or small limits the factory does not take). The only
module of `pagekv.testing` that imports pytest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pagekv.testing import contract as _contract  # noqa: F401  (registers the clauses)
from pagekv.testing.clauses import CLAUSES, Clause, NotChecked, run_clause
from pagekv.testing.subject import Factory, Subject
from pagekv.testing.violation import Violation


class KvContract:
    """Every contract clause as a test, against the factory the `kv_factory` fixture gives."""

    @pytest.fixture
    def kv_factory(self) -> Factory:
        """Override with the factory to check (a fixture, so it may use other fixtures)."""
        raise NotImplementedError(f"{type(self).__name__} must define the kv_factory fixture")

    @pytest.fixture
    def kv_subject(self, kv_factory: Factory) -> Iterator[Subject]:
        subject = Subject(kv_factory)
        yield subject
        subject.close()

    def not_checked(self, subject: Subject, clause: Clause, reason: str) -> None:
        """A clause the factory cannot run: skipped. Override to fail instead where a factory
        must run every clause (so a change that makes one unrunnable cannot pass unseen)."""
        pytest.skip(f"not checked: {reason}")

    @pytest.mark.parametrize("contract_clause", CLAUSES, ids=[c.name for c in CLAUSES])
    def test_clause(self, kv_subject: Subject, contract_clause: Clause) -> None:
        outcome: NotChecked | Violation
        try:
            run_clause(kv_subject, contract_clause)
            return
        except (NotChecked, Violation) as e:
            outcome = e
        # out of the except block, so that pytest shows the report alone, not chained
        if isinstance(outcome, Violation):
            pytest.fail(outcome.report(), pytrace=False)
        self.not_checked(kv_subject, contract_clause, str(outcome))
