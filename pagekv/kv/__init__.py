"""The actor KV store: contract, limits, errors, backends and wrappers."""

from pagekv.kv.api import ActorKv, KvNamespace, KvStore, prefix_end
from pagekv.kv.errors import (
    BatchTooLarge,
    FenceMismatch,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvUnavailable,
    LimitError,
    StorageQuotaExceeded,
    TooManyEntries,
    ValueTooLarge,
)
from pagekv.kv.file import FileStore
from pagekv.kv.limits import KvLimits
from pagekv.kv.memory import MemoryStore
from pagekv.kv.postgres import PostgresNamespace, PostgresStore
from pagekv.kv.url import DEFAULT_URL, open_kv
from pagekv.kv.wrappers import (
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
    "DEFAULT_URL",
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
    "InjectedIndeterminate",
    "InjectedUnavailable",
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
    "PostgresNamespace",
    "PostgresStore",
    "StorageQuotaExceeded",
    "TooManyEntries",
    "ValueTooLarge",
    "open_kv",
    "prefix_end",
]
