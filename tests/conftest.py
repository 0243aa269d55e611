"""Session-wide fixtures: the PostgreSQL server that every `postgresql://` test runs against;
what a memory store holds of actors (for tests of refused input); and a check that no compiled
module is older than its source.

`./test` needs nothing else: the first test that asks for `postgres_server` starts a throwaway
cluster (temporary directory, 127.0.0.1, a random free port, as the `postgres` user when run as
root; see `pagekv.kv.pg_cluster`) and the session stops and deletes it at the end.

- `PAGEKV_TEST_POSTGRES_URL=postgresql://...` runs the tests against that server instead (each
  test store uses its own schema, dropped at the end; tests that stop the server are skipped).
- Without PostgreSQL binaries the Postgres tests are skipped, with a reason that says how to
  enable them (shown in the `-ra` summary). Under CI (`CI=true`) that is a failure instead, so CI
  can never pass without having run them.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.kv import MemoryStore
from pagekv.kv.pg_cluster import HOW_TO_INSTALL, TempCluster, find_pg_bin

_ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Escape lone surrogates in a report's captured output and logs: tests send them on
    purpose (a hostile client, an action raising with one), the server logs what it got, and
    pytest-xdist cannot send a report holding one from its worker (its worker crashes)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [(name, _utf8(text)) for name, text in report.sections]
    if isinstance(report.longrepr, str):
        report.longrepr = _utf8(report.longrepr)


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test stale compiled code: Python imports `pages.cpython-*.so` before
    `page_store.py`, so an edit to a compiled module does nothing until it is rebuilt (`./test` does
    that itself; a bare `pytest` does not)."""
    with open(_ROOT / "pyproject.toml", "rb") as f:
        compiled = tomllib.load(f)["tool"]["pagekv"]["compiled"]
    for name in compiled:
        source = _ROOT / name
        for built in source.parent.glob(f"{source.stem}.*.so"):
            if built.stat().st_mtime < source.stat().st_mtime:
                pytest.exit(
                    f"{built.name} is older than {name}: rebuild it (./test does, or "
                    "`pip install -e .`)",
                    returncode=2,
                )


@dataclass
class PostgresServer:
    """The server of this test session. `cluster` is None for an external server."""

    url: str
    cluster: TempCluster | None
    schemas: set[str] = field(default_factory=set)

    def store_url(self, key: str, **options: object) -> str:
        """The URL of a store in a schema of its own, named after `key` (same key, same schema).

        `pool_timeout=2`: a test that stops the server should not wait the default 10 s per
        request to see `KvUnavailable`.
        """
        schema = "t_" + hashlib.sha1(key.encode()).hexdigest()[:24]
        self.schemas.add(schema)
        query = "&".join(f"{k}={v}" for k, v in {"pool_timeout": 2, **options}.items())
        return f"{self.url}?schema={schema}&{query}"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL server for the whole session (see the module docstring)."""
    external = os.environ.get("PAGEKV_TEST_POSTGRES_URL")
    if external:
        server = PostgresServer(external, None)
        yield server
        with psycopg.connect(external, autocommit=True) as conn:
            for schema in server.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        return
    if find_pg_bin() is None:
        message = (
            "PostgreSQL tests need initdb/pg_ctl to start a throwaway server: "
            f"{HOW_TO_INSTALL}; or set PAGEKV_TEST_POSTGRES_URL to an existing server"
        )
        if _in_ci():
            pytest.fail(f"CI=true but {message}", pytrace=False)
        pytest.skip(message)
    cluster = TempCluster()
    try:
        cluster.start()
        yield PostgresServer(cluster.url, cluster)
    finally:
        cluster.destroy()


def _stored_actors(store: MemoryStore) -> tuple[list[str], list[bytes]]:
    """What `store` holds of actors: their namespaces, and the registry's entries of actors
    (index, lease and due entries; not the registries' own member entries). Both are empty on
    a store where no actor was ever created."""
    namespaces = [n for n in store.actor_ids() if n != REGISTRY_NAMESPACE]
    listed = store.namespace(REGISTRY_NAMESPACE).list()
    entries = [key for key, _ in listed if not key.startswith(b"member/")]
    return namespaces, entries


@pytest.fixture
def stored_actors() -> Callable[[MemoryStore], tuple[list[str], list[bytes]]]:
    """For tests of refused input, which must leave no trace of the actor they addressed."""
    return _stored_actors
