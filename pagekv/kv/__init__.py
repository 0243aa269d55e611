"""The actor KV store: contract, limits, errors, backends and wrappers.

The `check_*` helpers, `quota_delta` and `entry_size` are the contract's validation, exported for
backends of your own: call them before you apply a request and yours refuses exactly what ours do.
"""

from pagekv.kv.api import ACTOR_KV_METHODS, ActorKv, FlushCounts, KvStore
from pagekv.kv.errors import (
    BatchTooLarge,
    FenceMismatch,
    FormatTooNew,
    InvalidArgument,
    InvalidKey,
    KeyTooLarge,
    KvError,
    KvIndeterminate,
    KvUnavailable,
    LimitError,
    NameTooLarge,
    StorageQuotaExceeded,
    StoreDamaged,
    StoreRefused,
    TooManyEntries,
    ValueTooLarge,
)
from pagekv.kv.fence import check_fence
from pagekv.kv.file import FileStore
from pagekv.kv.limits import (
    Entries,
    KvLimits,
    WriteBatch,
    check_bound,
    check_fence_arg,
    check_key,
    check_keys,
    check_limit,
    check_list,
    check_name,
    check_quota,
    check_reverse,
    check_write,
    entry_size,
    prefix_end,
    quota_delta,
)
from pagekv.kv.memory import MemoryStore
from pagekv.kv.namespace import KvNamespace
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
    "Entries",
    "Fault",
    "FaultKind",
    "FaultyKv",
    "FaultyStore",
    "FenceMismatch",
    "FileStore",
    "FiredFault",
    "FlushCounts",
    "FormatTooNew",
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
    "StoreDamaged",
    "StoreRefused",
    "TooManyEntries",
    "ValueTooLarge",
    "WriteBatch",
    "check_bound",
    "check_fence",
    "check_fence_arg",
    "check_key",
    "check_keys",
    "check_kv_url",
    "check_limit",
    "check_list",
    "check_name",
    "check_quota",
    "check_reverse",
    "check_write",
    "entry_size",
    "open_kv",
    "prefix_end",
    "quota_delta",
    "redact_url",
]


def __getattr__(name: str) -> object:
    """`PostgresStore` and `PostgresNamespace` on first use: psycopg takes ~0.1 s to import, and
    most processes (the CLI, `memory://` and `file://` users) never need it."""
    if name in ("PostgresNamespace", "PostgresStore"):
        from pagekv.kv import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
