"""The KV contract against every backend in `conftest.BACKENDS`.

The contract itself is `pagekv.testing`'s clauses, the same a backend author runs: `TestContract`
runs each of them on each backend, and fails where one cannot run there (only memory may skip,
and only what needs reopening a store). What remains here is about our own stores rather than the
contract: FaultyKv's faults, refusals made before any round trip (they still come after `close`),
what a refused namespace name leaves in `actor_ids`, limits a store refuses at open, URLs, and the
memory store's latency.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import pagekv.kv.memory
from pagekv.kv import (
    ActorKv,
    Fault,
    FaultKind,
    FaultyKv,
    FiredFault,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvLimits,
    KvStore,
    KvUnavailable,
    LimitError,
    NameTooLarge,
    open_kv,
)
from pagekv.testing import KvContract
from pagekv.testing.clauses import Clause
from pagekv.testing.contract_data import BAD_LIST_LIMITS
from pagekv.testing.contract_names import bad_names, good_names, incompressible_name
from pagekv.testing.subject import Factory, Subject

if TYPE_CHECKING:
    from conftest import Backend

OpenStore = Callable[..., KvStore]


class TestContract(KvContract):
    """Every clause of the contract on every backend."""

    @pytest.fixture
    def kv_factory(self, backend: Backend) -> Factory:
        """A store factory with limits, reopening a location where the backend persists."""
        if not backend.persistent:

            def fresh(*, limits: KvLimits | None = None) -> KvStore:
                return backend.factory(Path("unused"), limits)

            return fresh

        def at(*, limits: KvLimits | None = None, location: Path) -> KvStore:
            return backend.factory(location, limits)

        return at

    def not_checked(self, subject: Subject, clause: Clause, reason: str) -> None:
        if subject.reopens or not reason.startswith("needs to reopen"):
            pytest.fail(f"{clause.name} must run on our backends, but: {reason}", pytrace=False)
        super().not_checked(subject, clause, reason)


def snapshot(kv: ActorKv) -> tuple[list[tuple[bytes, bytes]], int, int]:
    """Everything observable about a namespace: contents, used bytes, generation."""
    return kv.list(), kv.used_bytes(), kv.generation()


@pytest.fixture
def kv(store: KvStore) -> ActorKv:
    return store.namespace("actor-1")


@pytest.fixture
def seeded(kv: ActorKv) -> ActorKv:
    kv.put({b"keep-1": b"one", b"keep-2": b"two", b"keep-3": b"three"})
    return kv


# --- FaultyKv --------------------------------------------------------------------------------


def test_fail_before_fault_applies_nothing(seeded: ActorKv) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, FaultKind.FAIL_BEFORE)])
    before = snapshot(seeded)
    with pytest.raises(KvUnavailable):
        faulty.write(put={b"new": b"x", b"keep-1": b"changed"}, delete=[b"keep-2"])
    assert faulty.fired == [FiredFault(0, "write", FaultKind.FAIL_BEFORE)]
    assert snapshot(seeded) == before


def test_apply_then_raise_fault_applies_the_whole_batch(seeded: ActorKv) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, FaultKind.APPLY_THEN_RAISE)])
    used = seeded.used_bytes()
    with pytest.raises(KvIndeterminate):
        faulty.write(put={b"new": b"x", b"keep-1": b"changed"}, delete=[b"keep-2"])
    assert faulty.fired == [FiredFault(0, "write", FaultKind.APPLY_THEN_RAISE)]
    assert seeded.list() == [(b"keep-1", b"changed"), (b"keep-3", b"three"), (b"new", b"x")]
    assert seeded.used_bytes() == used + len(b"new") + 1 + 4 - len(b"keep-2") - 3


@pytest.mark.parametrize("kind", list(FaultKind))
def test_faults_on_delete_range_and_drop(seeded: ActorKv, kind: FaultKind) -> None:
    faulty = FaultyKv(seeded, faults=[Fault(0, kind), Fault(1, kind)])
    expected_error = KvUnavailable if kind is FaultKind.FAIL_BEFORE else KvIndeterminate
    with pytest.raises(expected_error):
        faulty.delete_range(b"keep-1", b"keep-3")
    if kind is FaultKind.FAIL_BEFORE:
        assert [k for k, _ in seeded.list()] == [b"keep-1", b"keep-2", b"keep-3"]
    else:
        assert [k for k, _ in seeded.list()] == [b"keep-3"]
    with pytest.raises(expected_error):
        faulty.drop()
    assert faulty.fired == [FiredFault(0, "delete_range", kind), FiredFault(1, "drop", kind)]
    assert (seeded.list() == []) is (kind is FaultKind.APPLY_THEN_RAISE)
    assert (seeded.used_bytes() == 0) is (kind is FaultKind.APPLY_THEN_RAISE)


# --- limits and errors -----------------------------------------------------------------------


def test_default_limits_are_the_documented_ones() -> None:
    limits = KvLimits()
    assert limits.max_key_bytes == 2048
    assert limits.max_value_bytes == 131072
    assert limits.max_batch_entries == 128
    assert limits.max_batch_bytes == 999424
    assert limits.max_storage_bytes == 10 * 2**30
    assert limits.max_name_bytes == 2048


def test_every_limit_error_is_a_kv_error_naming_a_limit() -> None:
    """The clauses check the errors a backend raises; this, the classes they are made of."""
    assert issubclass(InvalidKey, KvError)
    kinds = LimitError.__subclasses__()
    assert all(issubclass(kind, KvError) for kind in kinds)
    assert sorted(kind.limit for kind in kinds) == sorted(
        f.name for f in dataclasses.fields(KvLimits)
    )


def test_store_applies_the_limits_it_was_opened_with(open_store: OpenStore) -> None:
    """The clauses with small limits are not checked on a store that does not advertise the
    limits it was asked for; ours must."""
    limits = KvLimits(max_key_bytes=10)
    kv = open_store(limits).namespace("a")
    assert kv.limits == limits
    kv.put({b"k" * 10: b"v"})
    with pytest.raises(KeyTooLarge):
        kv.put({b"k" * 11: b"v"})


@pytest.mark.parametrize("limit", BAD_LIST_LIMITS)
def test_a_list_limit_that_is_not_a_positive_int_is_refused_before_any_round_trip(
    store: KvStore, limit: object
) -> None:
    kv = store.namespace("a")
    store.close()  # from here a round trip fails (KvUnavailable) on the stores that make one
    with pytest.raises(InvalidArgument, match="limit"):
        kv.list(limit=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("fence", [True, False, -1, 2**63, 1.0, "1"])
def test_a_fence_that_is_not_a_generation_is_refused_before_any_round_trip(
    store: KvStore, fence: object
) -> None:
    """A fence is None or a generation, 0 to 2**63 - 1. PostgreSQL could not take a bool or a
    larger int (`KvUnavailable`) where the others compared it (`True` fenced generation 1)."""
    kv = store.namespace("a")
    kv.takeover()
    store.close()  # from here a round trip fails (KvUnavailable) on the stores that make one
    attempts: list[Callable[[], object]] = [
        lambda: kv.write(put={b"c": b"3"}, delete=[b"a"], fence=fence),  # type: ignore[arg-type]
        lambda: kv.put({b"a": b"changed"}, fence=fence),  # type: ignore[arg-type]
        lambda: kv.delete([b"a"], fence=fence),  # type: ignore[arg-type]
        lambda: kv.write(fence=fence),  # type: ignore[arg-type]
        lambda: kv.delete_range(b"a", b"z", fence=fence),  # type: ignore[arg-type]
        lambda: kv.drop(fence=fence),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgument, match="fence"):
            attempt()


# --- namespace names: what our stores list of them -------------------------------------------


def test_namespace_names_are_listed_in_code_point_order(store: KvStore) -> None:
    """PostgreSQL sorted them by the database's collation."""
    names = good_names(2048)
    for name in names:
        store.namespace(name).put({b"name": name.encode()})
    assert store.actor_ids() == sorted(names)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "error"), bad_names(2048))
def test_a_refused_namespace_name_creates_nothing(
    store: KvStore, name: object, error: type[KvError]
) -> None:
    store.namespace("existing")
    with pytest.raises(error, match="namespace name"):
        store.namespace(name)  # type: ignore[arg-type]
    assert store.actor_ids() == ["existing"]  # type: ignore[attr-defined]


def test_a_name_over_the_stores_name_limit_creates_nothing(open_store: OpenStore) -> None:
    store = open_store(KvLimits(max_name_bytes=8))
    store.namespace("x" * 8)
    store.namespace("\u00e9" * 4)
    for name in ("x" * 9, "\u00e9" * 4 + "x"):
        with pytest.raises(NameTooLarge):
            store.namespace(name)
    assert store.actor_ids() == sorted(["x" * 8, "\u00e9" * 4])  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", ["max_key_bytes", "max_name_bytes"])
def test_a_store_holds_what_its_limits_allow_or_refuses_them_at_open(
    open_store: OpenStore, limit: str
) -> None:
    """PostgreSQL's indexes hold keys and names of about 2.6 KiB: opened with larger limits, it
    accepted them and then failed each write of a long key (`KvUnavailable`, retried in vain)."""
    size = 4096
    try:
        store = open_store(KvLimits(**{limit: size}))
    except ValueError as e:
        assert limit in str(e)
        return
    key = random.Random(3).randbytes(size) if limit == "max_key_bytes" else b"k"
    name = incompressible_name(size) if limit == "max_name_bytes" else "a"
    store.namespace(name).put({key: b"v"})
    assert store.namespace(name).list() == [(key, b"v")]


# --- URLs, the memory store ------------------------------------------------------------------


@pytest.mark.parametrize("url", ["redis://localhost/0", "s3://bucket/dir"])
def test_unknown_url_scheme_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="scheme"):
        open_kv(url)


@pytest.mark.parametrize("url", ["memory://?bogus=1", "memory://?latency_ms=-1", "file:"])
def test_malformed_urls_are_value_errors(url: str) -> None:
    with pytest.raises(ValueError):
        open_kv(url)


def test_memory_url_latency_is_slept_once_per_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(pagekv.kv.memory.time, "sleep", slept.append)
    kv = open_kv("memory://?latency_ms=5").namespace("a")
    kv.put({b"a": b"1"})
    kv.get([b"a"])
    kv.list()
    kv.delete_range(b"a", b"b")
    kv.takeover()
    kv.drop()
    assert slept == [0.005] * 6

    slept.clear()
    plain = open_kv("memory://").namespace("a")
    plain.put({b"a": b"1"})
    plain.get([b"a"])
    assert slept == []


def test_memory_stores_are_independent() -> None:
    first = open_kv("memory://")
    first.namespace("a").put({b"k": b"v"})
    assert open_kv("memory://").namespace("a").list() == []
    first.close()


def test_file_urls_absolute_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = tmp_path / "abs"
    store = open_kv(f"file://{absolute}")
    store.namespace("a").put({b"k": b"abs"})
    store.close()
    assert absolute.is_dir()

    monkeypatch.chdir(tmp_path)
    store = open_kv("file:./rel/dir")
    store.namespace("a").put({b"k": b"rel"})
    store.close()
    assert (tmp_path / "rel" / "dir").is_dir()

    for url, value in [(absolute.as_uri(), b"abs"), (f"file://{tmp_path}/rel/dir", b"rel")]:
        store = open_kv(url)
        assert store.namespace("a").get([b"k"]) == [value]
        store.close()
