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
    InvalidArguments,
    NotOwner,
    OwnedElsewhere,
    ReservedName,
    UnknownActor,
    UserError,
)
from pagekv.actor.registry import ActorHandle, Client, Registry, actor_id

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
    "Client",
    "InvalidArguments",
    "NotOwner",
    "OwnedElsewhere",
    "Registry",
    "ReservedName",
    "UnknownActor",
    "UserError",
    "actor",
    "actor_id",
]
