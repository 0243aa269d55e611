"""`open_kv(url)`: the one way to name a store, shared by the library, the CLI and the server."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pagekv.kv.api import KvStore
from pagekv.kv.file import DEFAULT_LOG_BYTES, FileStore
from pagekv.kv.limits import KvLimits
from pagekv.kv.memory import MemoryStore

DEFAULT_URL = "file:./.pagekv"


def open_kv(url: str = DEFAULT_URL, *, limits: KvLimits | None = None) -> KvStore:
    """Open a store by URL.

    - `memory://[?latency_ms=N]`: in-process, for tests and benchmarks;
    - `file:///abs/dir` or `file:./rel/dir` `[?log_kib=N]`: the embedded durable store of one
      machine; its log is folded into the base every `log_kib` KiB (default 32 MiB);
    - `postgresql://user@host:port/db[?schema=..&pool_max=..]` (or `postgres://`): a PostgreSQL
      server shared by many hosts; see `PostgresStore` for the options.
    """
    parts = urlsplit(url)
    match parts.scheme:
        case "memory":
            query = parse_qs(parts.query)
            unknown = set(query) - {"latency_ms"}
            if unknown:
                raise ValueError(
                    f"unknown option(s) {sorted(unknown)} in {url!r}; known: latency_ms"
                )
            latency = float(query.get("latency_ms", ["0"])[-1])
            if latency < 0:
                raise ValueError(f"latency_ms must be >= 0 in {url!r}")
            return MemoryStore(limits=limits, latency_ms=latency)
        case "file":
            path = (
                parts.netloc + parts.path if parts.netloc not in ("", "localhost") else parts.path
            )
            if not path:
                raise ValueError(f"file URL {url!r} names no directory")
            query = parse_qs(parts.query)
            unknown = set(query) - {"log_kib"}
            if unknown:
                raise ValueError(f"unknown option(s) {sorted(unknown)} in {url!r}; known: log_kib")
            log_kib = int(query.get("log_kib", [str(DEFAULT_LOG_BYTES // 1024)])[-1])
            return FileStore(Path(path), limits=limits, log_bytes=log_kib * 1024)
        case "postgresql" | "postgres":
            # Imported here so that psycopg loads only for stores that use it.
            from pagekv.kv.postgres import PostgresStore

            return PostgresStore(url, limits=limits)
        case _:
            raise ValueError(
                f"unknown KV URL scheme {parts.scheme!r} in {url!r}; "
                "use memory://, file:///path or postgresql://user@host:port/db"
            )
