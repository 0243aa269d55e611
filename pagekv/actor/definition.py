"""Defining actors in plain Python: `actor(name, state=...)` plus decorators for hooks, actions."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import re
import reprlib
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

import msgspec

from pagekv.actor.errors import ActionNotFound, InvalidArguments, InvalidDefinition

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[..., Awaitable[Any]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")

_HOOK_PARAMETERS = {
    "on_migrate": "ctx",
    "create_state": "ctx, input",
    "on_create": "ctx, input",
    "create_vars": "ctx",
    "on_wake": "ctx",
    "on_sleep": "ctx",
    "on_destroy": "ctx",
    "on_before_connect": "ctx, params",
    "on_connect": "ctx, conn",
    "on_disconnect": "ctx, conn",
    "on_request": "ctx, request",
    "run": "ctx",
    "workflow": "wf",
}
"""What the runtime passes each hook, positionally: a hook is refused as it is declared unless
it takes these."""


@dataclass
class ActorDefinition:
    """What an actor is: its name, default state, options, hooks and actions.

    `state` may be a value (deep-copied for every new actor, so instances never share it) or a
    zero-argument callable; `create_state(ctx, input)` overrides both.
    """

    name: str
    state: Any = None
    sleep_timeout: float = 30.0
    stop_grace: float = 15.0
    """How long a stop (sleep, destroy, the registry's end) spends on user code: calls in flight
    and the stop hook share it; what still runs then is cancelled (`Stopper.run`)."""
    actions: dict[str, Hook] = field(default_factory=dict)
    hooks: dict[str, Hook] = field(default_factory=dict)
    workflow_fn: Hook | None = None
    """The durable workflow that is this actor's run handler (see `pagekv.actor.workflow`)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"actor name {self.name!r} must be 1-64 letters, digits, '_', '.', '-' "
                "and start with a letter or '_'"
            )
        if self.sleep_timeout <= 0:
            raise ValueError(f"sleep_timeout must be > 0, got {self.sleep_timeout}")
        if self.stop_grace < 0:
            raise ValueError(f"stop_grace must be >= 0, got {self.stop_grace}")

    def initial_state(self) -> Any:
        return self.state() if callable(self.state) else copy.deepcopy(self.state)

    def resolve(
        self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Hook, tuple[Any, ...], dict[str, Any]]:
        """The action to call and the arguments to call it with (after `ctx`): `args` and
        `kwargs` converted into the annotations of its parameters (see `action`).
        `ActionNotFound` if there is none, `InvalidArguments` if they do not bind to its
        signature or a value does not fit its parameter's annotation. Every caller (HTTP, a
        connection, the in-process client, a schedule) comes through here before it wakes or
        creates the actor, so a call that cannot run changes nothing, and an action gets the
        same values however it was called."""
        fn = self.actions.get(action)
        if fn is None:
            raise ActionNotFound(f"actor {self.name!r} has no action {action!r}")
        signature = _signature(fn)
        try:
            bound = signature.bind(None, *args, **kwargs)
        except TypeError as e:
            params = list(signature.parameters.values())[1:]  # without ctx
            shown = signature.replace(
                parameters=[p.replace(annotation=p.empty) for p in params],
                return_annotation=signature.empty,
            )
            raise InvalidArguments(
                f"action {action!r} of actor {self.name!r} takes {shown}: {e}"
            ) from None
        conversions = _conversions(fn)
        if not conversions:
            return fn, args, kwargs
        arguments, converted = bound.arguments, False
        for name, value in arguments.items():
            conversion = conversions.get(name)
            if conversion is None:
                continue
            try:
                new = conversion.convert(name, value)
            except _Refused as e:
                raise InvalidArguments(f"action {action!r} of actor {self.name!r}: {e}") from None
            if new is not value:
                arguments[name], converted = new, True
        if not converted:  # every value was already of its type (ints, strings): as given
            return fn, args, kwargs
        return fn, bound.args[1:], bound.kwargs

    def action(self, fn: F) -> F:
        """Register `async def name(ctx, *args)` as an action callable by clients.

        The arguments of its annotated parameters after `ctx` are converted into their
        annotations by `msgspec.convert` on every call, before the actor is woken: a value that
        does not fit is an `InvalidArguments` (a 400 over HTTP), naming the action, the
        argument, the type and (shortly) the value. The conversion is strict: a `str` is no
        `int`, a `bool` no `int`, a `str` no `bytes`; an `int` is a `float` (made one). What
        JSON and CBOR cannot carry is converted from what they do: a dataclass (or a msgspec
        `Struct`) from an object, a `TypedDict` checked field by field, an enum from its value,
        a `datetime`, `date` or `time` from ISO 8601 text (or as CBOR gives it), a `tuple` or
        `set` from an array; `list[...]`, `dict[...]`, `Literal[...]`, `Optional` and unions
        of these take their parts apart, and `*args: T` and `**kwargs: T` convert each value.
        Not converted: `Any`, `object`, an unannotated parameter, a name that cannot be resolved
        when the action is defined, and what msgspec cannot convert into (a union of two
        dataclasses, a dataclass naming an undefined type)."""
        if fn.__name__ in self.actions:
            raise ValueError(f"actor {self.name!r} already has an action {fn.__name__!r}")
        _check_declared(fn, f"action {fn.__name__!r} of actor {self.name!r}", None)
        _conversions(fn)  # the annotations are read once, now
        self.actions[fn.__name__] = fn
        return fn

    def workflow(self, fn: F) -> F:
        """Register `async def name(wf)` as the actor's run handler, run as a durable workflow."""
        if "run" in self.hooks or self.workflow_fn is not None:
            raise ValueError(f"actor {self.name!r} already has a run handler")
        _check_declared(fn, self._hook_shown("workflow", fn), _HOOK_PARAMETERS["workflow"])
        self.workflow_fn = fn
        return fn

    def _hook(self, name: str, fn: F) -> F:
        if name == "run" and self.workflow_fn is not None:
            raise ValueError(f"actor {self.name!r} already has a workflow as run handler")
        _check_declared(fn, self._hook_shown(name, fn), _HOOK_PARAMETERS[name])
        self.hooks[name] = fn
        return fn

    def _hook_shown(self, hook: str, fn: Callable[..., Any]) -> str:
        return f"{hook} {getattr(fn, '__qualname__', repr(fn))!r} of actor {self.name!r}"

    def on_migrate(self, fn: F) -> F:
        """`async def (ctx)`: bring the schema up to date, in a transaction, at every wake."""
        return self._hook("on_migrate", fn)

    def create_state(self, fn: F) -> F:
        """`async def (ctx, input) -> state`: a new actor's first state (overrides `state`)."""
        return self._hook("create_state", fn)

    def on_create(self, fn: F) -> F:
        """`async def (ctx, input)`: once, when the actor is created."""
        return self._hook("on_create", fn)

    def create_vars(self, fn: F) -> F:
        """`async def (ctx) -> vars`: per-instance, non-durable values (`ctx.vars`)."""
        return self._hook("create_vars", fn)

    def on_wake(self, fn: F) -> F:
        """`async def (ctx)`: every time an instance starts."""
        return self._hook("on_wake", fn)

    def on_sleep(self, fn: F) -> F:
        """`async def (ctx)`: before an instance goes to sleep."""
        return self._hook("on_sleep", fn)

    def on_destroy(self, fn: F) -> F:
        """`async def (ctx)`: before the actor's data is dropped."""
        return self._hook("on_destroy", fn)

    def on_before_connect(self, fn: F) -> F:
        """`async def (ctx, params)`: may raise to refuse a connection (its message is the
        close reason); nothing of the connection exists yet."""
        return self._hook("on_before_connect", fn)

    def on_connect(self, fn: F) -> F:
        """`async def (ctx, conn)`: a connection was accepted (set `conn.state` here)."""
        return self._hook("on_connect", fn)

    def on_disconnect(self, fn: F) -> F:
        """`async def (ctx, conn)`: a connection closed; once per connection, wherever the
        actor runs then (see `pagekv.actor.realtime.hub`)."""
        return self._hook("on_disconnect", fn)

    def on_request(self, fn: F) -> F:
        """`async def (ctx, request) -> Response`: raw HTTP (Starlette's request and response)
        at `/actors/NAME/request/PATH?key=K`."""
        return self._hook("on_request", fn)

    def run(self, fn: F) -> F:
        """`async def (ctx)`: a long-running handler, never twice at once (see `workflow`)."""
        return self._hook("run", fn)


def _check_declared(fn: Callable[..., Any], shown: str, parameters: str | None) -> None:
    """Refuse, with `InvalidDefinition`, a function the runtime could not call: one that is not
    a coroutine function, or does not take `parameters` (a hook's, as `_HOOK_PARAMETERS` names
    them) or, for an action (`parameters` None), `ctx` as its first positional parameter."""
    where = f"{shown} ({_location(fn)})"
    if inspect.isasyncgenfunction(inspect.unwrap(fn)):
        raise InvalidDefinition(f"{where} is an async generator ('yield'): it must return")
    if not any(
        inspect.iscoroutinefunction(f)
        for f in (fn, inspect.unwrap(fn), inspect.getattr_static(type(fn), "__call__", None))
    ):
        raise InvalidDefinition(f"{where} must be an 'async def', not a plain 'def'")
    try:
        signature = _signature(fn)
    except (TypeError, ValueError) as e:
        raise InvalidDefinition(f"{where}: its signature cannot be read ({e})") from e
    takes = signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )
    if parameters is None:
        params = list(signature.parameters.values())
        positional = (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        )
        if not params or params[0].kind not in positional:
            raise InvalidDefinition(
                f"{where} must take ctx as its first parameter: it takes {takes}"
            )
        return
    try:
        signature.bind(*(None for _ in parameters.split(", ")))
    except TypeError:
        raise InvalidDefinition(
            f"{where} is called with ({parameters}), but takes {takes}"
        ) from None


def _location(fn: Callable[..., Any]) -> str:
    """`file:line` of where `fn` is defined (its first decorator's line), as a traceback says."""
    target = inspect.unwrap(fn)
    code = getattr(target, "__code__", None) or getattr(
        inspect.getattr_static(type(target), "__call__", None), "__code__", None
    )
    if code is None:
        return "defined where Python does not say"
    return f"{code.co_filename}:{code.co_firstlineno}"


@functools.cache
def _signature(fn: Hook) -> inspect.Signature:
    """`inspect.signature` of an action, once: it costs more than the binding it serves."""
    return inspect.signature(fn)


_NATIVE = (bytes, bytearray, memoryview)
"""Types `msgspec.convert` takes as they are (it passes them to `builtin_types`): without it, a
`str` given for `bytes` would be decoded as base64, and a JSON caller's text would become bytes."""


@dataclass(frozen=True)
class _Conversion:
    """How the values of one annotated parameter become its annotation's type."""

    annotation: Any
    expected: str
    """The annotation as shown in an error (`list[int]`, `int | None`)."""
    kind: inspect._ParameterKind

    def convert(self, name: str, value: Any) -> Any:
        """The bound `value` of parameter `name` converted (each value of `*args` or
        `**kwargs`); `_Refused` saying what does not fit."""
        if self.kind is inspect.Parameter.VAR_POSITIONAL:
            return tuple(self._one(f"{name}[{i}]", v) for i, v in enumerate(value))
        if self.kind is inspect.Parameter.VAR_KEYWORD:
            return {key: self._one(key, v) for key, v in value.items()}
        return self._one(name, value)

    def _one(self, shown: str, value: Any) -> Any:
        if type(value) is self.annotation:  # an int for `int`, an Item for `Item`: as msgspec
            return value  # would give it back, without its 0.4 µs a call (most arguments)
        try:
            return msgspec.convert(value, self.annotation, builtin_types=_NATIVE)
        except msgspec.ValidationError as e:
            raise _Refused(_refusal(shown, self.expected, self.annotation, value, e)) from None


class _Refused(Exception):
    """A value that does not fit its parameter: the message says which, where, and what it is."""


@functools.cache
def _conversions(fn: Hook) -> dict[str, _Conversion]:
    """The conversions of an action's annotated parameters (after `ctx`), by name, made once."""
    params = list(_signature(fn).parameters.values())
    if not params or params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return {}  # ctx arrives in *args: nothing tells the arguments apart from it
    hints = _type_hints(fn)
    conversions: dict[str, _Conversion] = {}
    for param in params[1:]:
        annotation = hints.get(param.name, Any)
        if annotation is Any or annotation is object:
            continue
        try:  # msgspec refuses what it cannot convert into (a union of two dataclasses, say)
            msgspec.inspect.type_info(annotation)
        except Exception:  # or a dataclass naming a type that is not defined: not converted
            continue
        conversions[param.name] = _Conversion(annotation, _shown_type(annotation), param.kind)
    return conversions


class _Annotations:
    """One annotation with its function's globals, for `typing.get_type_hints` alone."""

    def __init__(self, name: str, annotation: Any, globalns: dict[str, Any]) -> None:
        self.__annotations__ = {name: annotation}
        self.__globals__ = globalns


def _type_hints(fn: Hook) -> dict[str, Any]:
    """The resolved annotations of `fn`; when one cannot be resolved (a string naming what is
    not defined, or not yet), each of the others on its own, without that one."""
    try:
        return typing.get_type_hints(fn, include_extras=True)  # `Annotated[int, Meta(ge=0)]`'s
    except Exception:  # constraints are checked: without the extras they would be dropped
        pass
    try:
        annotations = dict(getattr(fn, "__annotations__", None) or {})
    except Exception:
        return {}
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    hints: dict[str, Any] = {}
    for name, annotation in annotations.items():
        try:
            hints.update(
                typing.get_type_hints(_Annotations(name, annotation, globalns), include_extras=True)
            )
        except Exception:
            continue
    return hints


_ERROR = re.compile(r"(?s)(?P<detail>.*?)(?: - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`)?")
"""A `msgspec.ValidationError`'s text: what is wrong, then where (`$[2].sku`, `$[...]` for the
value of a key it does not name, `key` in `$` for a dict's key)."""
_STEP = re.compile(r"\[(?P<index>\d+)\]|(?P<value>\[\.\.\.\])|\.(?P<field>[^.\[]+)")
_UNKNOWN = object()
"""The annotation of a part of a value that cannot be told from its parent's."""


def _refusal(shown: str, expected: str, annotation: Any, value: Any, error: Exception) -> str:
    """The error for `value` of argument `shown`: where in it msgspec stopped, and what it found
    there, as a short rendering (never the whole of a large value)."""
    parsed = _ERROR.fullmatch(str(error))
    detail, path = (parsed["detail"], parsed["path"] or "") if parsed else (str(error), "")
    found = _locate(annotation, value, path)
    if found is None:
        return f"argument {shown!r} must be {expected}, but at {shown}{path[:100]}: {detail[:100]}"
    place, part, part_annotation = found
    given = _given(part)
    if parsed is not None and parsed["key"] and isinstance(part, dict):
        keys = _part(part_annotation, "key")
        key = next((k for k in part if not _fits(k, keys)), _UNKNOWN)
        if key is not _UNKNOWN:
            given = f"a dict with the key {_given(key)}"
    # msgspec's own words only when they say more than the type and value shown already
    said = "" if detail.startswith(("Expected `", "Invalid enum value")) else f" ({detail[:100]})"
    if not place:
        return f"argument {shown!r} must be {expected}, got {given}{said}"
    return f"argument {shown!r} must be {expected}, but {shown}{place} is {given}{said}"


def _locate(annotation: Any, value: Any, path: str) -> tuple[str, Any, Any] | None:
    """Follow msgspec's `path` into `value`: the place as shown (`[2]['sku']`), the part of
    the value there and its annotation; None if the path does not lead into the value."""
    place = ""
    for step in _STEP.finditer(path):
        if step["index"] is not None:
            index = int(step["index"])
            if not isinstance(value, list | tuple) or index >= len(value):
                return None
            annotation, value = _part(annotation, "item", index), value[index]
            place += f"[{index}]"
        else:
            if not isinstance(value, dict):
                return None
            if step["value"] is not None:  # msgspec does not say which key: the first misfit
                annotation = _part(annotation, "value")
                key = next((k for k, v in value.items() if not _fits(v, annotation)), _UNKNOWN)
            else:
                key = step["field"]
                annotation = _part(annotation, "field", key)
            if key is _UNKNOWN or key not in value:
                return None
            value = value[key]
            place += f"[{_short(key)}]"
        if len(place) > 100:
            return None
    return place, value, annotation


def _fits(value: Any, annotation: Any) -> bool:
    """Whether `value` converts into `annotation`; so is one that cannot be checked (a part
    whose annotation is `_UNKNOWN`, or one msgspec refuses, as a bare type variable)."""
    if annotation is _UNKNOWN:
        return True
    try:
        msgspec.convert(value, annotation, builtin_types=_NATIVE)
    except msgspec.ValidationError:
        return False
    except Exception:
        return True
    return True


def _part(annotation: Any, step: Literal["item", "value", "key", "field"], at: Any = None) -> Any:
    """The annotation of a part of a value of `annotation`: its item `at` (a list's, a
    tuple's), a dict's value or key, a dataclass's or `TypedDict`'s field `at`. Of a union, the
    member that has such parts (msgspec allows at most one array-like and one dict-like
    member); `_UNKNOWN` when it cannot be told."""
    if annotation is _UNKNOWN or annotation is Any:
        return annotation
    origin, args = typing.get_origin(annotation) or annotation, typing.get_args(annotation)
    if origin is typing.Annotated:
        return _part(args[0], step, at)
    if origin is Union or origin is types.UnionType:
        parts = [p for p in (_part(a, step, at) for a in args) if p is not _UNKNOWN]
        return parts[0] if len(parts) == 1 else _UNKNOWN
    if not isinstance(origin, type):
        return _UNKNOWN
    if step == "item" and issubclass(origin, list | tuple | set | frozenset):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return args[at] if at < len(args) else _UNKNOWN
        return args[0] if args else Any
    if step in ("value", "key") and issubclass(origin, dict):
        return args[step == "value"] if len(args) == 2 else Any
    if step == "field" and (dataclasses.is_dataclass(origin) or typing.is_typeddict(origin)):
        try:
            return typing.get_type_hints(origin).get(at, _UNKNOWN)
        except Exception:
            return _UNKNOWN
    return _UNKNOWN


def _shown_type(annotation: Any) -> str:
    """An annotation as its source says it: `list[Item] | None`, not with Item's module."""
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    shown = repr(annotation)
    for part in _classes(annotation):
        shown = shown.replace(f"{part.__module__}.{part.__qualname__}", part.__name__)
    return shown.replace("typing.", "").replace("NoneType", "None")


def _classes(annotation: Any) -> typing.Iterator[type]:
    """The classes an annotation is made of (`Item` and `int` of `dict[int, Item]`)."""
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and not typing.get_args(arg):
            yield arg
        else:
            yield from _classes(arg)


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 4


def _given(value: Any) -> str:
    """A value in an error: its type and a short rendering, never the whole of a large one."""
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any) -> str:
    try:
        if isinstance(value, int) and value.bit_length() > 128:
            return f"<{value.bit_length()} bits>"
        if isinstance(value, bytes | bytearray) and len(value) > 40:
            return f"{bytes(value[:40])!r}... <{len(value)} bytes>"
        return _REPR.repr(value)
    except Exception:  # a repr that fails (of a huge int inside a list, say)
        return "<...>"


def actor(
    name: str, *, state: Any = None, sleep_timeout: float = 30.0, stop_grace: float = 15.0
) -> ActorDefinition:
    """Define an actor; add actions with `@definition.action` and hooks with
    `@definition.on_wake` (and `on_migrate`, `create_state`, `on_create`, `create_vars`,
    `on_sleep`, `on_destroy`, `run`, `on_before_connect`, `on_connect`, `on_disconnect`,
    `on_request`)."""
    return ActorDefinition(name, state=state, sleep_timeout=sleep_timeout, stop_grace=stop_grace)
