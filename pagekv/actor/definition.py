"""Defining actors in plain Python: `actor(name, state=...)` plus decorators for hooks, actions."""

from __future__ import annotations

import copy
import functools
import inspect
import re
import reprlib
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

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

    def resolve(self, action: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hook:
        """The action to call with `args` and `kwargs` (after `ctx`): `ActionNotFound` if there
        is none, `InvalidArguments` if they do not bind to its signature or a value does not
        fit its parameter's annotation (see `action`). Callers check this before they wake
        or create the actor, so a call that cannot run changes nothing."""
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
        checks = _argument_checks(fn)
        if checks:
            for name, value in bound.arguments.items():
                check = checks.get(name)
                if check is not None:
                    problem = check.problem(name, value)
                    if problem is not None:
                        raise InvalidArguments(
                            f"action {action!r} of actor {self.name!r}: {problem}"
                        )
        return fn

    def action(self, fn: F) -> F:
        """Register `async def name(ctx, *args)` as an action callable by clients.

        The annotations of its parameters after `ctx` are checked on every call, before the
        actor is woken: a value that does not fit is an `InvalidArguments` (a 400 over HTTP).
        Checked are `int` (not a `bool`), `float` (an `int` too), `str`, `bool`, `bytes`,
        `None`, `list` and `dict` (plain or parameterised: `list[int]`, `dict[str, int]`),
        `Literal[...]`, and unions of these (`int | None`, `Optional[str]`); `*args: T` and
        `**kwargs: T` check each value. `Any`, an unannotated parameter, and any other
        annotation (a dataclass, a `TypedDict`, a name that cannot be resolved when the
        action is defined) are not checked."""
        if fn.__name__ in self.actions:
            raise ValueError(f"actor {self.name!r} already has an action {fn.__name__!r}")
        _check_declared(fn, f"action {fn.__name__!r} of actor {self.name!r}", None)
        _argument_checks(fn)  # the annotations are read once, now
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


Mismatch = tuple[str, str]
"""Where in a value it does not fit its annotation (`""` for the value itself, else a path
like `[2]['a']`), and what was found there."""
Check = Callable[[Any], Mismatch | None]


@dataclass(frozen=True)
class _ArgumentCheck:
    expected: str
    """The annotation as shown in an error (`list[int]`, `int | None`)."""
    check: Check
    kind: inspect._ParameterKind

    def problem(self, name: str, value: Any) -> str | None:
        """What is wrong with the bound `value` of parameter `name`, or None if it fits."""
        if self.kind is inspect.Parameter.VAR_POSITIONAL:
            items: Any = ((f"{name}[{i}]", v) for i, v in enumerate(value))
        elif self.kind is inspect.Parameter.VAR_KEYWORD:
            items = value.items()
        else:
            items = ((name, value),)
        for shown, item in items:
            mismatch = self.check(item)
            if mismatch is not None:
                path, given = mismatch
                if not path:
                    return f"argument {shown!r} must be {self.expected}, got {given}"
                return f"argument {shown!r} must be {self.expected}, but {shown}{path} is {given}"
        return None


@functools.cache
def _argument_checks(fn: Hook) -> dict[str, _ArgumentCheck]:
    """The checks of an action's annotated parameters (after `ctx`), by name, made once."""
    params = list(_signature(fn).parameters.values())
    if not params or params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return {}  # ctx arrives in *args: nothing tells the arguments apart from it
    hints = _type_hints(fn)
    checks: dict[str, _ArgumentCheck] = {}
    for param in params[1:]:
        if param.name not in hints:
            continue
        annotation = hints[param.name]
        try:
            check = _compile(annotation)
        except Exception:  # an annotation too odd to take apart: not checked
            check = None
        if check is not None:
            checks[param.name] = _ArgumentCheck(_shown_type(annotation), check, param.kind)
    return checks


class _Annotations:
    """One annotation with its function's globals, for `typing.get_type_hints` alone."""

    def __init__(self, name: str, annotation: Any, globalns: dict[str, Any]) -> None:
        self.__annotations__ = {name: annotation}
        self.__globals__ = globalns


def _type_hints(fn: Hook) -> dict[str, Any]:
    """The resolved annotations of `fn`; when one cannot be resolved (a string naming what is
    not defined, or not yet), each of the others on its own, without that one."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    try:
        annotations = dict(getattr(fn, "__annotations__", None) or {})
    except Exception:
        return {}
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    hints: dict[str, Any] = {}
    for name, annotation in annotations.items():
        try:
            hints.update(typing.get_type_hints(_Annotations(name, annotation, globalns)))
        except Exception:
            continue
    return hints


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_SCALARS: dict[Any, Callable[[Any], bool]] = {
    int: _is_int,
    float: _is_float,
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    bytes: lambda v: isinstance(v, bytes),
    None: lambda v: v is None,
    type(None): lambda v: v is None,
}


def _compile(annotation: Any) -> Check | None:
    """A check of values against `annotation`, or None for one that is not checked: `Any`,
    and anything not listed in `ActorDefinition.action`, rather than a guess."""
    if annotation is Any or annotation is object:
        return None
    if annotation in _SCALARS:
        fits = _SCALARS[annotation]
        return lambda v: None if fits(v) else ("", _given(v))
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is list or origin is list:
        return _list_check(_compile(args[0]) if args else None)
    if annotation is dict or origin is dict:
        keys, values = (_compile(args[0]), _compile(args[1])) if len(args) == 2 else (None, None)
        return _dict_check(keys, values)
    if origin is Union or origin is types.UnionType:
        members = [_compile(a) for a in args]
        if any(m is None for m in members):
            return None  # a value may fit the member that is not checked
        return _union_check([m for m in members if m is not None])
    if origin is Literal:
        return _literal_check(args)
    return None


def _list_check(items: Check | None) -> Check:
    def check(value: Any) -> Mismatch | None:
        if not isinstance(value, list):
            return "", _given(value)
        if items is not None:
            for i, item in enumerate(value):
                mismatch = items(item)
                if mismatch is not None:
                    return f"[{i}]{mismatch[0]}", mismatch[1]
        return None

    return check


def _dict_check(keys: Check | None, values: Check | None) -> Check:
    def check(value: Any) -> Mismatch | None:
        if not isinstance(value, dict):
            return "", _given(value)
        for key, item in value.items():
            if keys is not None and keys(key) is not None:
                return "", f"a dict with the key {_given(key)}"
            mismatch = values(item) if values is not None else None
            if mismatch is not None:
                return f"[{_short(key)}]{mismatch[0]}", mismatch[1]
        return None

    return check


def _union_check(members: list[Check]) -> Check:
    def check(value: Any) -> Mismatch | None:
        if any(member(value) is None for member in members):
            return None
        return "", _given(value)

    return check


def _literal_check(allowed: tuple[Any, ...]) -> Check:
    def check(value: Any) -> Mismatch | None:
        # by type too: True == 1, but True is not Literal[1]
        if any(type(value) is type(a) and value == a for a in allowed):
            return None
        return "", _given(value)

    return check


def _shown_type(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "").replace("NoneType", "None")


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
