"""`pagekv.testing`: the hypothesis machine passes on pagekv and catches a broken backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from pagekv.fuzz import FuzzFailure
from pagekv.kv import MemoryStore
from pagekv.kv.wrappers import KvWrapper
from pagekv.testing import machine

T = TypeVar("T")
SETTINGS = settings(
    max_examples=15,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_machine_passes_on_pagekv() -> None:
    run_state_machine_as_test(
        machine(lambda: MemoryStore().namespace("a"), max_blob=64 * 1024), settings=SETTINGS
    )


class _IgnoresFences(KvWrapper):
    def _call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if "fence" in kwargs:
            kwargs["fence"] = None
        return fn(*args, **kwargs)


def test_machine_catches_a_backend_without_fencing() -> None:
    broken = machine(lambda: _IgnoresFences(MemoryStore().namespace("a")), max_blob=4096)
    with pytest.raises(FuzzFailure, match="taken-over instance committed"):
        run_state_machine_as_test(broken, settings=settings(SETTINGS, max_examples=100))
