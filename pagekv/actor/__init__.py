"""The actor runtime: stateful actors with a KV-backed SQLite database each."""

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
    NotOwner,
    OwnedElsewhere,
    ReservedName,
    UnknownActor,
    UserError,
)
from pagekv.actor.exporter import Exported, FileShared, export_actor, export_all
from pagekv.actor.importer import (
    Imported,
    ImportRefused,
    ImportStopped,
    ManifestFileShared,
    SchemaTooNew,
    import_actor,
    import_all,
)
from pagekv.actor.registry import ActorHandle, Client, Registry, actor_id
from pagekv.actor.store_copy import (
    CopyMismatch,
    CopyProgress,
    CopyRefused,
    CopyResult,
    copy_store,
)

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
    "CopyMismatch",
    "CopyProgress",
    "CopyRefused",
    "CopyResult",
    "Exported",
    "FileShared",
    "ImportRefused",
    "ImportStopped",
    "Imported",
    "InvalidArguments",
    "ManifestFileShared",
    "NotOwner",
    "OwnedElsewhere",
    "Registry",
    "ReservedName",
    "SchemaTooNew",
    "UnknownActor",
    "UserError",
    "actor",
    "actor_id",
    "copy_store",
    "export_actor",
    "export_all",
    "import_actor",
    "import_all",
]
