"""The actor KV store: contract, limits, errors, backends and wrappers."""

from pagekv.kv.api import ACTOR_KV_METHODS, ActorKv, FlushCounts, KvStore
from pagekv.kv.errors import (
    BatchTooLarge,
    FenceMismatch,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvUnavailable,
    LimitError,
    NameTooLarge,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
)
from pagekv.kv.file import FileStore
from pagekv.kv.limits import KvLimits
from pagekv.kv.memory import MemoryStore
from pagekv.kv.namespace import KvNamespace, prefix_end
from pagekv.kv.redact import redact_url
from pagekv.kv.url import DEFAULT_URL, check_kv_url, open_kv
from pagekv.kv.wrappers import (
    OPS,
    READ_OPS,
    WRITE_OPS,
    CountingKv,
    Fault,
    FaultKind,
    FaultyKv,
    FaultyStore,
    FiredFault,
    InjectedIndeterminate,
    InjectedUnavailable,
    KvStats,
)

__all__ = [
    "ACTOR_KV_METHODS",
    "DEFAULT_URL",
    "OPS",
    "READ_OPS",
    "WRITE_OPS",
    "ActorKv",
    "BatchTooLarge",
    "CountingKv",
    "Fault",
    "FaultKind",
    "FaultyKv",
    "FaultyStore",
    "FenceMismatch",
    "FileStore",
    "FiredFault",
    "FlushCounts",
    "InjectedIndeterminate",
    "InjectedUnavailable",
    "InvalidArgument",
    "InvalidKey",
    "KeyTooLarge",
    "KvError",
    "KvIndeterminate",
    "KvLimits",
    "KvNamespace",
    "KvStats",
    "KvStore",
    "KvUnavailable",
    "LimitError",
    "MemoryStore",
    "NameTooLarge",
    "PostgresNamespace",
    "PostgresStore",
    "StorageQuotaExceeded",
    "TooManyEntries",
    "ValueTooLarge",
    "check_kv_url",
    "open_kv",
    "prefix_end",
    "redact_url",
]


def __getattr__(name: str) -> object:
    """`PostgresStore` and `PostgresNamespace` on first use: psycopg takes ~0.1 s to import, and
    most processes (the CLI, `memory://` and `file://` users) never need it."""
    if name in ("PostgresNamespace", "PostgresStore"):
        from pagekv.kv import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
