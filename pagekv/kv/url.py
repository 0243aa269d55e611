"""`open_kv(url)`: the one way to name a store, shared by the library, the CLI and the server."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

from pagekv.kv.api import KvStore
from pagekv.kv.file import DEFAULT_LOCK_TIMEOUT, DEFAULT_LOG_BYTES, FileStore
from pagekv.kv.limits import KvLimits
from pagekv.kv.memory import MemoryStore
from pagekv.kv.redact import redact_url

DEFAULT_URL = "file:./.pagekv"
_Number = TypeVar("_Number", int, float)


def open_kv(
    url: str = DEFAULT_URL, *, limits: KvLimits | None = None, create: bool = True
) -> KvStore:
    """Open a store by URL.

    - `memory://[?latency_ms=N]`: in-process, for tests and benchmarks;
    - `file:///abs/dir` or `file:./rel/dir` `[?log_kib=N&lock_timeout=S&flush_delay_ms=D]`: the
      embedded durable store of one machine; its log is folded into the base every `log_kib`
      KiB (default 32 MiB), and a request waits at most `lock_timeout` seconds (default 30) for
      the locks other processes hold on the directory. `flush_delay_ms` is a benchmarking aid,
      never for production: it adds D ms to every durable flush, to show on a fast disk how a
      slow one (most cloud volumes) would behave;
    - `postgresql://user@host:port/db[?schema=..&pool_max=..]` (or `postgres://`): a PostgreSQL
      server shared by many hosts; see `PostgresStore` for the options.

    With `create=False` the store must exist already (`FileNotFoundError` otherwise: no `file:`
    directory, or no PostgreSQL schema at this pagekv's version), and nothing is created or
    upgraded: what tools that only read want, rather than an empty store made where a path was
    mistyped.
    """
    return _opener(url, limits, create)()


def check_kv_url(url: str) -> None:
    """Raise the `ValueError` that `open_kv(url)` would for a malformed URL, opening nothing
    (a PostgreSQL URL's options are checked only when it is opened)."""
    _opener(url, None, True)


def _opener(url: str, limits: KvLimits | None, create: bool) -> Callable[[], KvStore]:
    parts = urlsplit(url)
    match parts.scheme:
        case "memory":
            query = parse_qs(parts.query)
            unknown = set(query) - {"latency_ms"}
            if unknown:
                raise ValueError(
                    f"unknown option(s) {sorted(unknown)} in {url!r}; known: latency_ms"
                )
            latency = _option(query, "latency_ms", float, 0.0, url)
            if latency < 0:
                raise ValueError(f"latency_ms must be >= 0 in {url!r}")
            return partial(MemoryStore, limits=limits, latency_ms=latency)
        case "file":
            path = (
                parts.netloc + parts.path if parts.netloc not in ("", "localhost") else parts.path
            )
            if not path:
                raise ValueError(f"file URL {url!r} names no directory")
            query = parse_qs(parts.query)
            unknown = set(query) - {"log_kib", "lock_timeout", "flush_delay_ms"}
            if unknown:
                raise ValueError(
                    f"unknown option(s) {sorted(unknown)} in {url!r}; "
                    "known: log_kib, lock_timeout, flush_delay_ms"
                )
            log_kib = _option(query, "log_kib", int, DEFAULT_LOG_BYTES // 1024, url)
            lock_timeout = _option(query, "lock_timeout", float, DEFAULT_LOCK_TIMEOUT, url)
            if not 0 < lock_timeout < float("inf"):
                raise ValueError(f"lock_timeout must be a number of seconds > 0 in {url!r}")
            flush_delay = _option(query, "flush_delay_ms", float, 0.0, url)
            if not 0 <= flush_delay <= 10_000:
                raise ValueError(f"flush_delay_ms must be between 0 and 10000 in {url!r}")
            directory = Path(path)

            def open_file() -> KvStore:
                if not create and not directory.is_dir():
                    raise FileNotFoundError(f"no file store at {directory}")
                return FileStore(
                    directory,
                    limits=limits,
                    log_bytes=log_kib * 1024,
                    lock_timeout=lock_timeout,
                    flush_delay_ms=flush_delay,
                )

            return open_file
        case "postgresql" | "postgres":

            def open_postgres() -> KvStore:
                # Imported here so that psycopg loads only for stores that use it.
                from pagekv.kv.postgres import PostgresStore

                return PostgresStore(url, limits=limits, create=create)

            return open_postgres
        case _:
            raise ValueError(
                f"unknown KV URL scheme {parts.scheme!r} in {redact_url(url)!r}; "
                "use memory://, file:///path or postgresql://user@host:port/db"
            )


def _option(
    query: dict[str, list[str]], name: str, kind: type[_Number], default: _Number, url: str
) -> _Number:
    """The last value of option `name` as a `kind`, or `default` when it is absent."""
    if name not in query:
        return default
    raw = query[name][-1]
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{name} must be {what} in {url!r}, got {raw!r}") from None
