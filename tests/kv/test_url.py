"""Stores opened by URL: each is a context manager that closes it, and a URL is shown only with
its password redacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagekv.kv import FaultyStore, KvUnavailable, MemoryStore, open_kv, redact_url


def test_a_file_store_is_a_context_manager_that_closes_it(tmp_path: Path) -> None:
    with open_kv(f"file:{tmp_path}/store") as store:
        store.namespace("a").write(put={b"k": b"v"})
    with pytest.raises(KvUnavailable):
        store.namespace("a").get([b"k"])
    with open_kv(f"file:{tmp_path}/store") as again:  # the lock was released
        assert again.namespace("a").get([b"k"]) == [b"v"]


def test_memory_and_wrapping_stores_are_context_managers() -> None:
    with open_kv("memory://") as memory:
        memory.namespace("a").write(put={b"k": b"v"})
    with FaultyStore(MemoryStore()) as faulty:
        assert faulty.namespace("a").get([b"k"]) == [None]


def test_a_bad_url_is_refused_without_its_password() -> None:
    with pytest.raises(ValueError) as refused:
        open_kv("ftp://ada:s3cret@host/x")
    assert "s3cret" not in str(refused.value) and "ada:***@host" in str(refused.value)
    with pytest.raises(ValueError) as bad_option:
        open_kv("postgresql://ada:s3cret@host/db?pool_max=x")
    assert "s3cret" not in str(bad_option.value)
    assert redact_url("postgresql://ada@host/db") == "postgresql://ada@host/db"


def test_a_password_in_the_query_string_is_redacted_too() -> None:
    shown = {
        url: redact_url(url)
        for url in (
            "postgresql://h/db?password=s3cret",
            "postgresql://ada:s3cret@h1:5432,h2:5433/db?sslmode=require&password=s3cret&x=1",
            "postgresql://h/db?mypassword=kept&password=",
            "file:/tmp/store?log_kib=12",
        )
    }
    assert shown == {
        "postgresql://h/db?password=s3cret": "postgresql://h/db?password=***",
        "postgresql://ada:s3cret@h1:5432,h2:5433/db?sslmode=require&password=s3cret&x=1": (
            "postgresql://ada:***@h1:5432,h2:5433/db?sslmode=require&password=***&x=1"
        ),
        "postgresql://h/db?mypassword=kept&password=": (
            "postgresql://h/db?mypassword=kept&password=***"
        ),
        "file:/tmp/store?log_kib=12": "file:/tmp/store?log_kib=12",
    }
    with pytest.raises(ValueError) as refused:
        open_kv("postgresql://h/db?password=s3cret&pool_max=x")
    assert "s3cret" not in str(refused.value)
