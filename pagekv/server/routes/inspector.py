"""The inspector API: which actors exist, and what each one holds.

    GET  /inspect                                          what answers: serve or a store view
    GET  /inspect/actors[?name=N&key_prefix=P&after=ACTOR_ID&limit=L&usage=1&owners=1]
                                                           usage: KV bytes; owners: lease holder
    GET  /inspect/actors/{name}?key=K                      record, live status, owner, storage,
                                                           KV usage
    GET  /inspect/actors/{name}/state?key=K
    GET  /inspect/actors/{name}/tables?key=K
    GET  /inspect/actors/{name}/tables/{table}?key=K[&limit=L&offset=O]
    POST /inspect/actors/{name}/query?key=K                {"sql", "params", "max_rows"}
    GET  /inspect/actors/{name}/queue?key=K[&limit=L]
    GET  /inspect/actors/{name}/schedules?key=K
    GET  /inspect/actors/{name}/workflow?key=K
    GET  /inspect/actors/{name}/metrics?key=K
    POST /inspect/actors/{name}/workflow/cancel?key=K      {} (serve only, at the owner)
    POST /inspect/actors/{name}/workflow/replay?key=K      {"from": LOCATION or null}

Data is read from a read-only snapshot of the actor's database (see `pagekv.actor.inspect_reads`):
committed data only, never a takeover, never a write, whether the actor is awake here, awake in
another process or asleep. A snapshot is opened per request on a worker thread, so a slow read
never blocks the event loop or the actor. Runtime facts (awake, in-flight calls, wake timings)
come from the live instance: the per-actor reads of an actor another server owns are forwarded
to that server (`cluster/forward.py`). Under `pagekv ui` (a `StoreView`, no registry) every read is
answered from the store, the owner comes from the lease entries, and the two workflow changes,
the only writes here, are refused: they run on the actor's owner, through its instance.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagekv.actor import ActorNotFound, inspect_reads
from pagekv.actor.directory.leases import Forwarded, lease_owner
from pagekv.kv import ActorKv
from pagekv.protocol import ErrorCode
from pagekv.server.app_state import StoreView, runtime, store_view
from pagekv.server.cluster.forward import forwarded
from pagekv.server.http_errors import HttpError, classify
from pagekv.server.request_io import (
    answer,
    decode_body,
    int_param,
    query_params,
    read_body,
    read_fields,
    read_raw_body,
)
from pagekv.server.routes.gateway import failures
from pagekv.vfs import Database

T = TypeVar("T")
MAX_PAGE = 1000
_QUERY_FIELDS = frozenset({"sql", "params", "max_rows"})
_REPLAY_FIELDS = frozenset({"from"})


def _address(request: Request, **extra: bool) -> tuple[StoreView, str, str, dict[str, str]]:
    """(store view, name, key, query parameters): `?key=` plus `extra` (name -> required)."""
    params = query_params(request, {"key": True, **extra})
    return store_view(request), request.path_params["name"], params["key"], params


def _index(rt: StoreView) -> ActorKv:
    """The registry's index; a store no registry ever ran on has no actors to find."""
    index = rt.index()
    if index is None:
        raise ActorNotFound("no registry ever ran on this store: it has no actors")
    return index


def _owner(index: ActorKv, actor_id: str, asked: str | None) -> dict[str, Any] | None:
    """Who holds the actor's lease now (None: asleep, unless a server holding its sockets keeps
    it, `pagekv.actor.realtime.socket_leases`; or its owner's lease ran out); `here` says whether
    it is the registry the client asked (`asked`, see `_asked`)."""
    owner = lease_owner(index, actor_id, time.time())
    if owner is None:
        return None
    return {
        "registry": owner.registry,
        "address": owner.address,
        "until": owner.until,
        "here": owner.registry == asked,
    }


def _asked(request: Request, rt: StoreView) -> str | None:
    """The registry the client sent `request` to: this one, or the one that forwarded it here
    (the per-actor reads are answered by the actor's owner, `_at_owner`). A store view has no
    registry, so no server forwards to it and its header means nothing."""
    via = forwarded(request) if rt.registry_id is not None else None
    return rt.registry_id if via is None else via.sender


async def about(request: Request) -> Response:
    """What the page is talking to: a server (which can steer workflows and has `/metrics`)
    or `pagekv ui`'s read-only view of a store."""
    rt = store_view(request)
    query_params(request, {})
    return answer(
        request,
        {
            "mode": "store" if rt.read_only else "serve",
            "read_only": rt.read_only,
            "registry": rt.registry_id,
            "store": rt.store_label,
        },
    )


async def _in_inspector(rt: StoreView, fn: Callable[[], T]) -> T:
    """`fn()` on a worker thread, in one of the inspector's `inspect_concurrency` turns: the
    inspector never holds more threads than that, so actors' work never queues behind it. A
    request that gets no turn within `query_timeout_s` is a retryable 503."""
    with anyio.move_on_after(rt.config.query_timeout_s) as waited:
        await rt.inspector.acquire()
    if waited.cancelled_caught:
        raise HttpError(
            503,
            ErrorCode.INSPECTOR_BUSY,
            f"the inspector is busy ({rt.config.inspect_concurrency} reads at once, "
            "inspect_concurrency); retry",
        )
    try:
        return await anyio.to_thread.run_sync(fn)
    finally:
        rt.inspector.release()


async def _snapshot_read(
    rt: StoreView, name: str, key: str, fn: Callable[[Database], T]
) -> tuple[inspect_reads.ActorRecord, T]:
    """Find the actor in the registry's index and run `fn` on a snapshot of its database."""
    limit, temp = rt.config.inspect_max_bytes, rt.config.inspect_temp_bytes
    try:
        record = await _in_inspector(rt, lambda: inspect_reads.find_actor(_index(rt), name, key))
        value = await _in_inspector(
            rt,
            lambda: inspect_reads.read_snapshot(
                rt.store, record, fn, max_bytes=limit, temp_bytes=temp
            ),
        )
    except HttpError:
        raise
    except Exception as e:
        raise classify(e, in_action=False) from e
    return record, value


async def list_actors(request: Request) -> Response:
    rt = store_view(request)
    params = query_params(
        request,
        {
            "name": False,
            "key_prefix": False,
            "after": False,
            "limit": False,
            "usage": False,
            "owners": False,
        },
    )
    if params.get("key_prefix") and not params.get("name"):
        raise HttpError(
            400, ErrorCode.INVALID_PARAMETER, "key_prefix searches one actor type: give name too"
        )
    limit = int_param(params, "limit", default=100, low=1, high=MAX_PAGE)
    usage = int_param(params, "usage", default=0, low=0, high=1) == 1
    owners = int_param(params, "owners", default=0, low=0, high=1) == 1

    def read() -> tuple[list[inspect_reads.ActorRecord], list[dict[str, Any]]]:
        index = rt.index()
        if index is None:
            return [], []
        records = inspect_reads.list_actors(
            index,
            limit=limit + 1,
            name=params.get("name"),
            key_prefix=params.get("key_prefix", ""),
            after=params.get("after"),
        )
        extra: list[dict[str, Any]] = [{} for _ in records[:limit]]
        for fields, record in zip(extra, records, strict=False):
            if usage:
                fields["used_bytes"] = rt.store.namespace(record.actor_id).used_bytes()
            if owners:
                fields["owner"] = _owner(index, record.actor_id, rt.registry_id)
        return records, extra

    records, extra = await _in_inspector(rt, read)
    live = rt.live_ids()
    actors = [
        {**asdict(r), "actor_id": r.actor_id, "live": r.actor_id in live, **fields}
        for r, fields in zip(records, extra, strict=False)
    ]
    after = actors[-1]["actor_id"] if len(records) > limit else None
    return answer(request, {"actors": actors, "next_after": after})


def _kv_usage(rt: StoreView, actor_id: str) -> dict[str, int]:
    """The bytes the actor's namespace holds against its storage quota."""
    namespace = rt.store.namespace(actor_id)
    return {"used_bytes": namespace.used_bytes(), "quota_bytes": namespace.limits.max_storage_bytes}


async def actor_summary(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    record, storage = await _snapshot_read(rt, name, key, lambda db: db.metrics())
    asked = _asked(request, rt)
    kv_usage, owner = await _in_inspector(
        rt,
        lambda: (_kv_usage(rt, record.actor_id), _owner(_index(rt), record.actor_id, asked)),
    )
    live = rt.live(record.actor_id)
    summary: dict[str, Any] = {
        **asdict(record),
        "actor_id": record.actor_id,
        "live": live is not None,
        "owner": owner,
        "storage": storage,
        "kv_usage": kv_usage,
    }
    if live is not None:
        summary["instance"] = {
            "phase": live.phase.value,
            "active_calls": live.calls.active,
            "next_due": live.lease.next_due,
            "wake_ms": live.starter.metrics,
        }
    return answer(request, summary)


async def actor_state(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    _, state = await _snapshot_read(
        rt, name, key, lambda db: inspect_reads.read_state(db.connection)
    )
    return answer(request, {"state": state})


async def actor_tables(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    _, tables = await _snapshot_read(
        rt, name, key, lambda db: inspect_reads.list_tables(db.connection)
    )
    return answer(request, {"tables": [asdict(t) for t in tables]})


async def table_rows(request: Request) -> Response:
    rt, name, key, params = _address(request, limit=False, offset=False)
    limit = int_param(params, "limit", default=100, low=1, high=MAX_PAGE)
    offset = int_param(params, "offset", default=0, low=0, high=2**62)
    table = request.path_params["table"]
    _, rows = await _snapshot_read(
        rt,
        name,
        key,
        lambda db: inspect_reads.read_rows(
            db.connection, table, limit=limit, offset=offset, max_bytes=rt.config.inspect_max_bytes
        ),
    )
    return answer(request, {"table": table, "offset": offset, **asdict(rows)})


async def run_query(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    body = read_fields(await read_body(request, rt.config), _QUERY_FIELDS)
    sql, bindings = body.get("sql"), body.get("params", [])
    if not isinstance(sql, str) or not sql.strip():
        raise HttpError(400, ErrorCode.INVALID_BODY, "sql must be a non-empty string")
    if not isinstance(bindings, list | dict):
        raise HttpError(400, ErrorCode.INVALID_BODY, "params must be an array or an object")
    max_rows = body.get("max_rows", MAX_PAGE)
    if not isinstance(max_rows, int) or not 1 <= max_rows <= MAX_PAGE:
        raise HttpError(400, ErrorCode.INVALID_BODY, f"max_rows must be 1 to {MAX_PAGE}")
    timeout = rt.config.query_timeout_s
    _, rows = await _snapshot_read(
        rt,
        name,
        key,
        lambda db: inspect_reads.query(
            db.connection,
            sql,
            bindings,
            max_rows=max_rows,
            timeout_s=timeout,
            max_bytes=rt.config.inspect_max_bytes,
        ),
    )
    return answer(request, asdict(rows))


async def actor_queue(request: Request) -> Response:
    rt, name, key, params = _address(request, limit=False)
    limit = int_param(params, "limit", default=100, low=1, high=MAX_PAGE)
    _, rows = await _snapshot_read(
        rt,
        name,
        key,
        lambda db: inspect_reads.read_queue(
            db.connection, limit=limit, max_bytes=rt.config.inspect_max_bytes
        ),
    )
    return answer(request, asdict(rows))


async def actor_schedules(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    limit = rt.config.inspect_max_bytes
    _, rows = await _snapshot_read(
        rt, name, key, lambda db: inspect_reads.read_schedules(db.connection, max_bytes=limit)
    )
    return answer(request, asdict(rows))


async def actor_workflow(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    record, workflow = await _snapshot_read(
        rt,
        name,
        key,
        lambda db: inspect_reads.read_workflow(
            db.connection, max_bytes=rt.config.inspect_max_bytes
        ),
    )
    if workflow is None:
        raise HttpError(404, ErrorCode.NO_WORKFLOW, f"actor {record.actor_id} has no workflow")
    return answer(request, {"workflow": workflow})


async def actor_metrics(request: Request) -> Response:
    rt, name, key, _ = _address(request)
    record, snapshot = await _snapshot_read(rt, name, key, lambda db: db.metrics())
    live = rt.live(record.actor_id)
    if live is None:
        return answer(request, {"live": False, "storage": snapshot})
    storage = await _in_inspector(rt, live.ctx.db.database.metrics)
    return answer(request, {"live": True, "storage": storage, "wake_ms": live.starter.metrics})


def _at_owner(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
    """`endpoint`, answered by the server owning the actor when another one does, so that
    the runtime facts (awake, in-flight calls, timings) are the owner's. Reads of the data
    would be the same anywhere; the query route, which has a body, is answered where it
    arrives."""

    async def routed(request: Request) -> Response:
        rt, name, key = (
            store_view(request),
            request.path_params["name"],
            request.query_params.get("key"),
        )

        async def serve(via: Forwarded | None) -> Response:
            if via is None and key is not None:
                await rt.locate(name, key)
            return await endpoint(request)

        return await rt.route(request, b"", serve)

    return routed


async def _change_workflow(request: Request, change: str, fields: frozenset[str]) -> Response:
    """Cancel or replay the actor's workflow, at its owner, through its instance (woken for
    it if it sleeps): the run handler is held off while the history changes, so the change and
    a step never interleave. Refused, with nothing changed, by `pagekv ui`, by an actor without
    a workflow, and while the workflow rolls back."""
    if store_view(request).read_only:
        raise HttpError(
            403,
            ErrorCode.READ_ONLY,
            "this inspector only reads the store (pagekv ui); cancel or replay a workflow "
            "through the server that runs the actor (pagekv serve)",
        )
    _, name, key, _ = _address(request)
    rt = runtime(request)
    raw = await read_raw_body(request, rt.config)
    body = read_fields(decode_body(request, raw, rt.config), fields)
    location = body.get("from")
    if location is not None and not isinstance(location, str):
        raise HttpError(400, ErrorCode.INVALID_BODY, "from must be an entry's location or null")

    async def serve(via: Forwarded | None) -> Response:
        with failures("workflow", change, name, key) as writes:
            if rt.registry.definition(name).workflow_fn is None:
                raise HttpError(404, ErrorCode.NO_WORKFLOW, f"actor {name!r} has no workflow")
            instance = await rt.registry.instance(name, key, create=False, via=via)
            assert instance.workflow is not None, "a workflow actor's instance has its runner"
            if change == "cancel":
                await instance.workflow.cancel()
            else:
                await instance.workflow.replay(location)
            status = await instance.workflow.status()
        return answer(request, {"state": status.state.value}, writes=writes)

    return await rt.route(request, raw, serve)


async def cancel_workflow(request: Request) -> Response:
    return await _change_workflow(request, "cancel", frozenset())


async def replay_workflow(request: Request) -> Response:
    return await _change_workflow(request, "replay", _REPLAY_FIELDS)


ROUTES = [
    Route("/inspect", about, methods=["GET"]),
    Route("/inspect/actors", list_actors, methods=["GET"]),
    Route("/inspect/actors/{name}", _at_owner(actor_summary), methods=["GET"]),
    Route("/inspect/actors/{name}/state", _at_owner(actor_state), methods=["GET"]),
    Route("/inspect/actors/{name}/tables", _at_owner(actor_tables), methods=["GET"]),
    Route("/inspect/actors/{name}/tables/{table:path}", _at_owner(table_rows), methods=["GET"]),
    Route("/inspect/actors/{name}/query", run_query, methods=["POST"]),
    Route("/inspect/actors/{name}/queue", _at_owner(actor_queue), methods=["GET"]),
    Route("/inspect/actors/{name}/schedules", _at_owner(actor_schedules), methods=["GET"]),
    Route("/inspect/actors/{name}/workflow", _at_owner(actor_workflow), methods=["GET"]),
    Route("/inspect/actors/{name}/workflow/cancel", cancel_workflow, methods=["POST"]),
    Route("/inspect/actors/{name}/workflow/replay", replay_workflow, methods=["POST"]),
    Route("/inspect/actors/{name}/metrics", _at_owner(actor_metrics), methods=["GET"]),
]
