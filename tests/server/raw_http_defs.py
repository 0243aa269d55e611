"""A raw HTTP actor for the tests of raw HTTP through a server that does not own it
(`test_raw_forwarding.py`, served by `pagekv serve` processes and in-process).

`relay`'s `on_request` answers by path: `/headers` echoes the request's headers and body and
answers with headers of its own (two cookies, a redirect, a cache policy, repeated custom ones);
`/stream?mib=N` streams N MiB, `/blob` answers 1 MiB in one piece; `/events?every=S` is an
endless event stream, one event every S seconds, and `/open` counts the event streams still
being produced in this process; `/lookalike` counts its runs and answers with a 503 shaped like
the runtime's `not_owner` refusal (with the refusal's header too if `?claim=1`); `/runs` reads
that count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pagekv.actor import ActorContext, Registry, actor

relay = actor("relay", state={"runs": 0})
MIB = b"x" * (1 << 20)
open_streams = 0


@relay.on_request
async def _serve(ctx: ActorContext, request: Request) -> Response:
    path, query = request.url.path, request.query_params
    if path == "/headers":
        return await _echo(request)
    if path == "/stream":
        return StreamingResponse(_mebibytes(int(query["mib"])), media_type="application/x-bytes")
    if path == "/blob":
        return Response(MIB, media_type="application/x-bytes")
    if path == "/events":
        return StreamingResponse(_events(float(query["every"])), media_type="text/event-stream")
    if path == "/open":
        return JSONResponse({"open": open_streams})
    if path == "/lookalike":
        ctx.state["runs"] += 1
        error = {"code": "not_owner", "message": "not the owner", "written": False}
        claim = {"x-pagekv-refused": "not_owner"} if query.get("claim") else {}
        return JSONResponse({"error": error}, status_code=503, headers=claim)
    if path == "/runs":
        return JSONResponse({"runs": ctx.state["runs"]})
    return Response(status_code=404)


async def _echo(request: Request) -> Response:
    seen = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.headers.raw]
    body = (await request.body()).decode()
    response = JSONResponse({"headers": seen, "body": body}, status_code=201)
    response.set_cookie("session", "s1", httponly=True)
    response.set_cookie("theme", "dark", max_age=60)
    response.headers["location"] = "/actors/relay/request/created"
    response.headers["cache-control"] = "private, max-age=5"
    response.raw_headers += [(b"x-custom", b"one"), (b"x-custom", b"two"), (b"vary", b"Cookie")]
    return response


async def _mebibytes(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield MIB


async def _events(every: float) -> AsyncIterator[bytes]:
    global open_streams
    open_streams += 1
    try:
        n = 0
        while True:
            yield f"id: {n}\ndata: event {n}\n\n".encode()
            n += 1
            await anyio.sleep(every)
    finally:
        open_streams -= 1


registry = Registry([relay])
