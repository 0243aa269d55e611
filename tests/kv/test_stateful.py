"""Model-based test: random op sequences on an `ActorKv` against a dict model, on every backend.

The limits are tiny so that every limit, the quota and stale fences are hit within a few steps.
When a request breaks more than one rule the contract does not say which error wins, so the model
computes the set of errors the request deserves and accepts any one of them — but the call must
raise, and the namespace must be exactly as it was before.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagekv.kv import (
    ActorKv,
    BatchTooLarge,
    Fault,
    FaultKind,
    FaultyKv,
    FenceMismatch,
    InjectedIndeterminate,
    InjectedUnavailable,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvLimits,
    KvStore,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
)

LIMITS = KvLimits(
    max_key_bytes=3,
    max_value_bytes=12,
    max_batch_entries=4,
    max_batch_bytes=32,
    max_storage_bytes=48,
)
OpenStore = Callable[..., KvStore]
_machine_ids = itertools.count()

# A 3-symbol alphabet keeps the key space small (39 keys), so puts, deletes and ranges collide.
small_keys = st.lists(st.sampled_from([0x00, 0x61, 0xFF]), min_size=1, max_size=3).map(bytes)
ALL_SMALL_KEYS = [
    bytes(key) for n in (1, 2, 3) for key in itertools.product([0x00, 0x61, 0xFF], repeat=n)
]
oversize_keys = st.binary(min_size=LIMITS.max_key_bytes + 1, max_size=LIMITS.max_key_bytes + 2)
any_keys = st.one_of(small_keys, small_keys, small_keys, oversize_keys)
# Sizes drawn evenly (plain `st.binary` favours tiny values), so batch and quota limits are reached.
values = st.integers(0, LIMITS.max_value_bytes + 1).map(lambda n: bytes([n]) * n)
# Mostly valid fences, so that stale ones do not hide the other errors.
fence_choices = st.sampled_from(["none"] * 3 + ["current"] * 3 + ["older", "newer"])


def charge(key: bytes, value: bytes) -> int:
    return len(key) + len(value)


class KvMachine(RuleBasedStateMachine):
    def __init__(self, open_store: OpenStore, persistent: bool, seen: Counter[str]) -> None:
        super().__init__()
        self.seen = seen
        self.open_store = open_store
        self.persistent = persistent
        self.location = f"machine-{next(_machine_ids)}"  # a fresh store per example
        self.store = open_store(LIMITS, location=self.location)
        self.kv: ActorKv = self.store.namespace("actor")
        assert self.kv.list() == [] and self.kv.used_bytes() == 0
        self.model: dict[bytes, bytes] = {}
        self.used = 0
        self.gen = self.kv.generation()
        self.bystander = self.store.namespace("bystander")
        self.bystander.put({b"b": b"untouched"})

    # --- helpers ---

    def fence_for(self, choice: str) -> int | None:
        return {
            "none": None,
            "current": self.gen,
            "older": self.gen - 1,
            "newer": self.gen + 1,
        }[choice]

    def snapshot(self) -> tuple[list[tuple[bytes, bytes]], int, int]:
        return self.kv.list(), self.kv.used_bytes(), self.kv.generation()

    def expect(self, errors: set[type[KvError]], call: Callable[[], Any]) -> Any:
        """Run `call`; if `errors` is non-empty it must raise one of them and change nothing."""
        if not errors:
            return call()
        before = self.snapshot()
        try:
            call()
        except KvError as e:
            self.seen[type(e).__name__] += 1
            assert type(e) in errors, f"raised {type(e).__name__}, expected one of {errors}"
        else:
            raise AssertionError(f"expected one of {errors}, nothing was raised")
        assert self.snapshot() == before
        return None

    def fence_errors(self, fence: int | None) -> set[type[KvError]]:
        """A negative fence was never a generation; any other but the current one is stale."""
        if fence is None or fence == self.gen:
            return set()
        return {InvalidArgument} if fence < 0 else {FenceMismatch}

    def write_errors(
        self, pairs: list[tuple[bytes, bytes]], deletes: list[bytes], fence: int | None
    ) -> set[type[KvError]]:
        """The errors a write deserves; its limits count the request as sent, repeats included."""
        errors = self.fence_errors(fence)
        puts = dict(pairs)  # the last put of a key wins
        if any(len(k) > LIMITS.max_key_bytes for k in (*puts, *deletes)):
            errors.add(KeyTooLarge)
        if any(len(v) > LIMITS.max_value_bytes for _, v in pairs):
            errors.add(ValueTooLarge)
        if set(puts) & set(deletes):
            errors.add(InvalidKey)
        if len(pairs) + len(deletes) > LIMITS.max_batch_entries:
            errors.add(TooManyEntries)
        payload = sum(charge(k, v) for k, v in pairs) + sum(map(len, deletes))
        if payload > LIMITS.max_batch_bytes:
            errors.add(BatchTooLarge)
        deletes = list(dict.fromkeys(deletes))
        old = {k: charge(k, v) for k, v in self.model.items() if k in puts or k in deletes}
        delta = sum(charge(k, v) - old.get(k, 0) for k, v in puts.items())
        delta -= sum(old.get(k, 0) for k in deletes)
        if delta > 0 and self.used + delta > LIMITS.max_storage_bytes:
            errors.add(StorageQuotaExceeded)
        return errors

    def apply_write(self, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
        for k in deletes:
            if k in self.model:
                self.used -= charge(k, self.model.pop(k))
        for k, v in puts.items():
            if k in self.model:
                self.used -= charge(k, self.model[k])
            self.model[k] = v
            self.used += charge(k, v)

    # --- rules ---

    @rule(
        puts=st.lists(st.tuples(small_keys, values), max_size=5),
        deletes=st.lists(small_keys, max_size=3),
        fence=fence_choices,
    )
    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], fence: str) -> None:
        """Puts and deletes may repeat a key (the key space is small, so they often do)."""
        deletes = [k for k in deletes if k not in dict(puts)]  # see put_and_delete_the_same_key
        f = self.fence_for(fence)
        errors = self.write_errors(puts, deletes, f)
        self.expect(errors, lambda: self.kv.write(put=puts, delete=deletes, fence=f))
        if not errors:
            self.apply_write(dict(puts), deletes)

    @rule(
        puts=st.dictionaries(
            small_keys,
            st.integers(6, LIMITS.max_value_bytes).map(lambda n: b"L" * n),
            min_size=2,
            max_size=LIMITS.max_batch_entries,
        ),
        fence=fence_choices,
    )
    def write_large_values(self, puts: dict[bytes, bytes], fence: str) -> None:
        """Valid entries of 7-15 bytes: often over the batch bytes, and fills up the quota."""
        self.write(list(puts.items()), [], fence)

    @rule(over=st.booleans())
    def fill_to_the_quota(self, over: bool) -> None:
        """Fill the namespace up to exactly the quota, then (if `over`) put one byte past it."""
        for key in ALL_SMALL_KEYS:
            room = LIMITS.max_storage_bytes - self.used
            if key in self.model:
                room += charge(key, self.model[key])
            size = room - len(key) + over
            if size <= LIMITS.max_value_bytes:
                self.write([(key, b"Q" * max(size, 0))], [], "none")
                return
            self.write([(key, b"Q" * LIMITS.max_value_bytes)], [], "none")

    @rule(
        puts=st.dictionaries(small_keys, values, max_size=3),
        bad_key=oversize_keys,
        as_delete=st.booleans(),
        fence=fence_choices,
    )
    def write_with_an_oversize_key(
        self, puts: dict[bytes, bytes], bad_key: bytes, as_delete: bool, fence: str
    ) -> None:
        deletes = [bad_key] if as_delete else []
        if not as_delete:
            puts = {**puts, bad_key: b"v"}
        f = self.fence_for(fence)
        errors = self.write_errors(list(puts.items()), deletes, f)
        assert KeyTooLarge in errors
        self.expect(errors, lambda: self.kv.write(put=puts, delete=deletes, fence=f))

    @rule(
        puts=st.dictionaries(small_keys, values, min_size=1, max_size=3),
        fence=fence_choices,
    )
    def put_and_delete_the_same_key(self, puts: dict[bytes, bytes], fence: str) -> None:
        deletes = [next(iter(puts))]
        f = self.fence_for(fence)
        errors = self.write_errors(list(puts.items()), deletes, f)
        assert InvalidKey in errors
        self.expect(errors, lambda: self.kv.write(put=puts, delete=deletes, fence=f))

    @rule(
        kind=st.sampled_from(list(FaultKind)),
        puts=st.dictionaries(small_keys, values, max_size=3),
        deletes=st.lists(small_keys, max_size=2, unique=True),
        fence=fence_choices,
    )
    def faulty_write(
        self, kind: FaultKind, puts: dict[bytes, bytes], deletes: list[bytes], fence: str
    ) -> None:
        faulty = FaultyKv(self.kv, faults=[Fault(0, kind)])
        f = self.fence_for(fence)
        errors = self.write_errors(list(puts.items()), deletes, f)
        if kind is FaultKind.FAIL_BEFORE:
            call = lambda: faulty.write(put=puts, delete=deletes, fence=f)  # noqa: E731
            self.expect({InjectedUnavailable}, call)
        elif errors:  # the store refuses the request before the fault could matter
            self.expect(errors, lambda: faulty.write(put=puts, delete=deletes, fence=f))
        else:
            try:
                faulty.write(put=puts, delete=deletes, fence=f)
            except KvIndeterminate as e:
                self.seen[type(e).__name__] += 1
            else:
                raise AssertionError("APPLY_THEN_RAISE did not raise")
            self.apply_write(puts, deletes)
        assert [fired.kind for fired in faulty.fired] == [kind]

    @rule(start=any_keys, end=small_keys, fence=fence_choices)
    def delete_range(self, start: bytes, end: bytes, fence: str) -> None:
        f = self.fence_for(fence)
        errors = self.fence_errors(f)
        if len(start) > LIMITS.max_key_bytes:
            errors.add(KeyTooLarge)
        self.expect(errors, lambda: self.kv.delete_range(start, end, fence=f))
        if not errors:
            self.apply_write({}, [k for k in self.model if start <= k < end])

    @rule()
    def takeover(self) -> None:
        self.gen += 1
        assert self.kv.takeover() == self.gen

    @rule(fence=fence_choices)
    def drop(self, fence: str) -> None:
        f = self.fence_for(fence)
        errors = self.fence_errors(f)
        self.expect(errors, lambda: self.kv.drop(fence=f))
        if not errors:
            self.model.clear()
            self.used = 0

    @rule(keys=st.lists(any_keys, max_size=LIMITS.max_batch_entries + 2))
    def get(self, keys: list[bytes]) -> None:
        errors: set[type[KvError]] = set()
        if any(len(k) > LIMITS.max_key_bytes for k in keys):
            errors.add(KeyTooLarge)
        if len(keys) > LIMITS.max_batch_entries:
            errors.add(TooManyEntries)
        got = self.expect(errors, lambda: self.kv.get(keys))
        if not errors:
            assert got == [self.model.get(k) for k in keys]

    @rule(
        start=st.none() | small_keys,
        end=st.none() | small_keys,
        limit=st.none() | st.integers(1, 5),
        reverse=st.booleans(),
    )
    def list_range(
        self, start: bytes | None, end: bytes | None, limit: int | None, reverse: bool
    ) -> None:
        expected = sorted(
            (k, v)
            for k, v in self.model.items()
            if (start is None or k >= start) and (end is None or k < end)
        )
        if reverse:
            expected.reverse()
        if limit is not None:
            expected = expected[:limit]
        assert self.kv.list(start=start, end=end, limit=limit, reverse=reverse) == expected

    @rule(prefix=small_keys, limit=st.none() | st.integers(1, 5), reverse=st.booleans())
    def list_prefix(self, prefix: bytes, limit: int | None, reverse: bool) -> None:
        expected = sorted((k, v) for k, v in self.model.items() if k.startswith(prefix))
        if reverse:
            expected.reverse()
        if limit is not None:
            expected = expected[:limit]
        assert self.kv.list(prefix=prefix, limit=limit, reverse=reverse) == expected

    @precondition(lambda self: self.persistent)
    @rule()
    def reopen_store(self) -> None:
        self.store.close()
        self.store = self.open_store(LIMITS, location=self.location)
        self.kv = self.store.namespace("actor")
        self.bystander = self.store.namespace("bystander")

    @rule()
    def new_handle(self) -> None:
        self.kv = self.store.namespace("actor")

    # --- invariants ---

    @invariant()
    def matches_model(self) -> None:
        assert self.kv.list() == sorted(self.model.items())
        assert self.kv.used_bytes() == self.used
        assert self.kv.generation() == self.gen
        assert self.used == sum(charge(k, v) for k, v in self.model.items())
        assert self.used <= LIMITS.max_storage_bytes

    def teardown(self) -> None:
        try:
            assert self.bystander.list() == [(b"b", b"untouched")]
            assert self.bystander.used_bytes() == len(b"b") + len(b"untouched")
        finally:
            self.store.close()


def test_actor_kv_matches_model(open_store: OpenStore, backend: Any) -> None:
    seen: Counter[str] = Counter()
    run_state_machine_as_test(
        lambda: KvMachine(open_store, backend.persistent, seen),
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    # The run must actually have provoked every error it models, or it proved little.
    expected = {
        KeyTooLarge,
        ValueTooLarge,
        TooManyEntries,
        BatchTooLarge,
        StorageQuotaExceeded,
        FenceMismatch,
        InvalidArgument,
        InvalidKey,
        InjectedUnavailable,
        InjectedIndeterminate,
    }
    assert {e.__name__ for e in expected} <= set(seen), seen
