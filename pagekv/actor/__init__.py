"""The actor runtime: stateful actors with a KV-backed SQLite database each."""

import importlib

from pagekv.actor.context import ActorContext
from pagekv.actor.definition import ActorDefinition, actor
from pagekv.actor.errors import (
    ActionNotFound,
    ActorError,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    CallCycle,
    InvalidArguments,
    InvalidDefinition,
    NotOwner,
    OwnedElsewhere,
    ReservedName,
    UnknownActor,
    UserError,
)
from pagekv.actor.local_client import ActorHandle, Client
from pagekv.actor.registry import Registry, actor_id

__all__ = [
    "ActionNotFound",
    "ActorContext",
    "ActorDefinition",
    "ActorError",
    "ActorExists",
    "ActorHandle",
    "ActorNotFound",
    "ActorStopped",
    "ActorTakenOver",
    "CallCycle",
    "Client",
    "InvalidArguments",
    "InvalidDefinition",
    "NotOwner",
    "OwnedElsewhere",
    "Registry",
    "ReservedName",
    "UnknownActor",
    "UserError",
    "actor",
    "actor_id",
]


_MOVED = {
    "CopyMismatch": "pagekv.transfer",
    "CopyProgress": "pagekv.transfer",
    "CopyRefused": "pagekv.transfer",
    "CopyResult": "pagekv.transfer",
    "Exported": "pagekv.transfer",
    "FileShared": "pagekv.transfer",
    "ImportRefused": "pagekv.transfer",
    "ImportStopped": "pagekv.transfer",
    "Imported": "pagekv.transfer",
    "ManifestFileShared": "pagekv.transfer",
    "SchemaTooNew": "pagekv.transfer",
    "copy_store": "pagekv.transfer",
    "export_actor": "pagekv.transfer",
    "export_all": "pagekv.transfer",
    "import_actor": "pagekv.transfer",
    "import_all": "pagekv.transfer",
}
"""Names of the transfer tools, which lived here before `pagekv.transfer` held them: code
written then keeps working. Looked up by name (importlib), so that the runtime does not import
its tools."""


def __getattr__(name: str) -> object:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
