"""The KV contract, clause by clause, runnable against any backend.

Each clause is registered in `CLAUSES` (`clauses.py`) and checks one thing the contract promises,
at its boundaries: ordering, prefix/range/limit/reverse, what writes store and count, drop and
delete_range, namespaces, persistence (`contract_data.py`); fencing and takeover, across handles,
stores and threads (`contract_fencing.py`); atomicity of every batch under rejected entries,
every limit at its boundary, the exact quota with overwrite credit and delete and range refunds
(`contract_limits.py`); namespace names (`contract_names.py`). Importing this module registers
them all, in that order.
`pagekv check-backend`, `check_backend()` and the pytest suite (`KvContract`) all run these same
clauses; so do pagekv's own backend tests (`tests/kv/test_conformance.py`).
"""

from __future__ import annotations

from pagekv.testing import contract_data, contract_fencing, contract_limits, contract_names

__all__ = ["contract_data", "contract_fencing", "contract_limits", "contract_names"]
