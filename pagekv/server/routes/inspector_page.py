"""The inspector as a web page: `GET /` and its static assets under `/ui/`.

The page and its assets hold no data, so they load without a token (`auth.OPEN_PATHS` and
`auth.OPEN_PREFIXES`); everything they show comes from the inspector API and `/metrics`, which
the page fetches with the bearer token the user types once (kept in `sessionStorage`, sent only
as an `Authorization` header, never in a URL). The page first asks `/ui/auth.json` whether this
server needs a token at all, so an `--unauthenticated` one opens without a sign-in form (a
prompt there would accept any text, which says nothing true). `/favicon.ico`, which browsers
ask for on every load, answers 204: no 401 in their console, no icon to maintain. The assets
are hand-written files packaged with pagekv (`ui_assets/`, no build step, nothing fetched from a
network), read once at import.

Every answer carries a strict Content-Security-Policy: scripts only from this origin (no inline
script, no `eval`), no plugins, no framing, and Trusted Types required for the DOM's HTML sinks,
so an `innerHTML` assignment throws instead of parsing: actor data is only ever text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pagekv.protocol import ErrorCode
from pagekv.server.app_state import store_view
from pagekv.server.http_errors import HttpError

CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ASSET_PREFIX: Final = "/ui/"
AUTH_PATH: Final = ASSET_PREFIX + "auth.json"
_MEDIA_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}


@dataclass(frozen=True)
class _Asset:
    content: bytes
    media_type: str


def _load(folder: Path) -> dict[str, _Asset]:
    """Every asset by file name: a fixed set, so a request path is looked up, never joined
    to a file system path."""
    return {
        path.name: _Asset(path.read_bytes(), _MEDIA_TYPES[path.suffix])
        for path in sorted(folder.iterdir())
        if path.suffix in _MEDIA_TYPES
    }


_ASSETS: Final = _load(Path(__file__).with_name("ui_assets"))


def _serve(asset: _Asset) -> Response:
    return Response(asset.content, media_type=asset.media_type, headers=HEADERS)


async def page(request: Request) -> Response:
    return _serve(_ASSETS["index.html"])


async def asset(request: Request) -> Response:
    found = _ASSETS.get(request.path_params["file"])
    if found is None:
        raise HttpError(404, ErrorCode.NOT_FOUND, f"no asset {request.url.path}")
    return _serve(found)


async def auth_needed(request: Request) -> Response:
    """Whether the inspector API needs a token here: what the page reads before it asks for
    one. It reveals nothing a 401 from any other route would not."""
    required = store_view(request).config.token is not None
    return JSONResponse({"token_required": required}, headers=HEADERS)


async def favicon(request: Request) -> Response:
    return Response(status_code=204, headers=HEADERS)


ROUTES = [
    Route("/", page, methods=["GET"]),
    Route("/favicon.ico", favicon, methods=["GET"]),
    Route(AUTH_PATH, auth_needed, methods=["GET"]),
    Route(ASSET_PREFIX + "{file}", asset, methods=["GET"]),
]
