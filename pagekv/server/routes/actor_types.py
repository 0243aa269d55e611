"""What an actor type offers, for a developer at a terminal: `GET /actors/{name}` lists its
actions and their parameters, so a client can be written without opening the app's source.

    GET /actors/{name}   {"name", "actions": [{"name", "doc", "parameters", "returns"}]}

Each parameter (after `ctx`) has its `name`, its `kind` (`positional_only`,
`positional_or_keyword`, `var_positional`, `keyword_only`, `var_keyword`), its `annotation` and
its `default` as Python source text (`"int | None"`, `"'EUR'"`), or null when it has none: a
default of `None` is `"None"`, so null says the argument is required. Text rather than values,
because a default may be anything Python holds and an annotation is a type, neither of which
JSON or CBOR can carry. It reads the definitions only: no actor is woken and nothing is
forwarded (every server of a store serves the same app). An unknown type is a 404
`unknown_actor` naming the known ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagekv.actor import ActorDefinition
from pagekv.server.app_state import runtime
from pagekv.server.request_io import answer, query_params


def describe(definition: ActorDefinition) -> dict[str, Any]:
    return {
        "name": definition.name,
        "actions": [_action(name, fn) for name, fn in sorted(definition.actions.items())],
    }


def _action(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    signature = inspect.signature(fn)
    return {
        "name": name,
        "doc": inspect.getdoc(fn),
        "parameters": [_parameter(p) for p in list(signature.parameters.values())[1:]],
        "returns": _annotation(signature.return_annotation),
    }


def _parameter(parameter: inspect.Parameter) -> dict[str, Any]:
    default = parameter.default
    return {
        "name": parameter.name,
        "kind": parameter.kind.name.lower(),
        "annotation": _annotation(parameter.annotation),
        "default": None if default is inspect.Parameter.empty else repr(default),
    }


def _annotation(annotation: Any) -> str | None:
    """As written: a string annotation (`from __future__ import annotations`) is kept as is."""
    if annotation is inspect.Parameter.empty:
        return None
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


async def actor_type(request: Request) -> Response:
    query_params(request, {})
    definition = runtime(request).registry.definition(request.path_params["name"])
    return answer(request, describe(definition))


ROUTES = [Route("/actors/{name}", actor_type, methods=["GET"])]
