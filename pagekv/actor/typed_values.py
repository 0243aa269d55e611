"""Values of the types an action's arguments are converted into (#45), on their way out: a
dataclass, a plain enum or a msgspec `Struct` returned by an action (or sent as an event, or
given as an argument to a remote actor) is sent as what an action annotated with it is given
(`ActorDefinition.action`): an object of its fields, the enum's value. Neither JSON nor CBOR
knows them; both encoders call `as_builtins` for them. `cbor_dumps` is how every answer and frame
is encoded as CBOR (`pagekv.protocol.encode`, and the size a connection's frame is counted at),
so a result sends alike over HTTP and over a connection."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

import cbor2
import msgspec


def is_structured(value: Any) -> bool:
    """A dataclass instance, a plain enum (an `IntEnum` or `StrEnum` is an int or a string to both
    encoders already) or a msgspec `Struct`."""
    return isinstance(value, enum.Enum | msgspec.Struct) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def as_builtins(value: Any) -> Any:
    """An `is_structured` value as the encoders take it: an enum as its value, a dataclass or
    `Struct` as an object of its fields. One level only: the encoders come back here for what
    the fields hold, and encode a datetime or bytes in a field as they do anywhere else.
    (Not `msgspec.to_builtins`: it leaves out a dataclass field that `msgspec.convert` left at
    its default, which it does not store on the instance.) A dataclass field that holds no
    value (`field(init=False)` never set) is left out, as msgspec's encoders leave it out: it
    has nothing to send, and reading it would raise `AttributeError`, which no caller of an
    encoder expects (an action's writes would stand behind a 500)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.asdict(value)
    fields = ((f.name, getattr(value, f.name, _UNSET)) for f in dataclasses.fields(value))
    return {name: field for name, field in fields if field is not _UNSET}


_UNSET: Any = object()


def cbor_default(encoder: cbor2.CBOREncoder, value: Any) -> None:
    """cbor2's hook for a type it does not know: a structured value as `as_builtins` has it."""
    if not is_structured(value):
        raise cbor2.CBOREncodeError(f"cannot encode type {type(value)}")  # as cbor2 says
    encoder.encode(as_builtins(value))


def cbor_dumps(value: Any) -> bytes:
    """`value` as CBOR, a structured value in it as `as_builtins` has it; `cbor2.CBOREncodeError`
    (or a `TypeError`, `ValueError`) for what CBOR cannot hold."""
    try:
        return cbor2.dumps(value, default=cbor_default)
    except cbor2.CBOREncodeError:  # a naive datetime or a time somewhere, perhaps: as text
        return cbor2.dumps(_untagged_times_as_text(value), default=cbor_default)


def _untagged_times_as_text(value: Any) -> Any:
    """`value` with every naive datetime and `time` as its ISO 8601 text, as JSON has them: no
    CBOR tag holds them (tag 0 needs a time zone), and assuming one (UTC, the local zone) would
    send a time that was not meant."""
    if isinstance(value, datetime.datetime) and value.tzinfo is None:
        return value.isoformat()
    if isinstance(value, datetime.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _untagged_times_as_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_untagged_times_as_text(v) for v in value]
    if isinstance(value, set | frozenset):
        return type(value)(_untagged_times_as_text(v) for v in value)
    if is_structured(value):  # its fields too
        return _untagged_times_as_text(as_builtins(value))
    return value
