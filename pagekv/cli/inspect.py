"""`pagekv inspect --kv URL [NAME/KEY]`: actors straight from the store, read-only.

Reads the registry's index and read-only snapshots (`pagekv.actor.inspect_reads`): no takeover and
no write to any actor or to the registry's index, so it is safe beside running servers, which keep
serving undisturbed."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pagekv.actor import ActorNotFound
from pagekv.actor import inspect_reads as view
from pagekv.cli.args import add_store_argument, positive_int
from pagekv.kv import open_kv
from pagekv.protocol import JSON, encode
from pagekv.vfs import Database


def _actor_report(database: Database, rows: int) -> dict[str, Any]:
    connection = database.connection
    tables = []
    for table in view.list_tables(connection):
        page = view.read_rows(connection, table.name, limit=rows, offset=0)
        tables.append(
            {
                "name": table.name,
                "internal": table.internal,
                "rows": table.rows,
                "columns": table.columns,
                "first_rows": page.rows,
            }
        )
    return {
        "state": view.read_state(connection),
        "tables": tables,
        "queue": view.read_queue(connection, limit=rows).rows,
        "schedules": view.read_schedules(connection).rows,
        "workflow": view.read_workflow(connection),
    }


def _json(value: Any) -> str:
    return encode(value, JSON).decode()


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _print_report(record: view.ActorRecord, report: dict[str, Any]) -> None:
    print(
        f"actor {record.actor_id}: name {record.name!r}, key {record.key!r}, "
        f"created {_when(record.created)}"
    )
    print(f"state: {_json(report['state'])}")
    print("tables:")
    for table in report["tables"]:
        kind = " (internal)" if table["internal"] else ""
        print(
            f"  {table['name']}{kind}: {table['rows']} rows; columns {', '.join(table['columns'])}"
        )
        if not table["internal"]:
            for row in table["first_rows"]:
                print(f"    {_json(row)}")
    print(f"queue: {len(report['queue'])} message(s) shown")
    for message_id, name, body, created in report["queue"]:
        print(f"  #{message_id} {name} {_json(body)} at {_when(created)}")
    print(f"schedules: {len(report['schedules'])}")
    for event_id, due, action, args, every, _created in report["schedules"]:
        repeat = f" every {every:g} s" if every else ""
        print(f"  {event_id}: {action}{_json(args)} due {_when(due)}{repeat}")
    workflow = report["workflow"]
    if workflow is None:
        print("workflow: none")
        return
    print(f"workflow: {workflow['state']}, output {_json(workflow['output'])}")
    if workflow["error"]:
        print(f"  error: {_json(workflow['error'])}")
    for entry in workflow["entries"]:
        error = f" error {entry['error']}" if entry["error"] else ""
        print(
            f"  {entry['location']}: {entry['kind']} {entry['status']} "
            f"after {entry['attempts']} attempt(s){error}"
        )


def _inspect(args: argparse.Namespace) -> int:
    try:
        store = open_kv(args.kv, create=False)
    except FileNotFoundError as e:
        print(f"pagekv inspect: {e}", file=sys.stderr)
        return 1
    try:
        index = view.open_index(store)
        if args.actor is None:
            records = view.list_actors(index, limit=args.limit) if index is not None else []
            if args.json:
                print(_json([{**vars(r), "actor_id": r.actor_id} for r in records]))
            for r in records if not args.json else []:
                print(f"{r.actor_id}\tcreated {_when(r.created)}")
            if not records and not args.json:
                print(f"no actors in {args.kv}")
            return 0
        name, sep, key = args.actor.partition("/")
        if not sep:
            print("pagekv inspect: name the actor as NAME/KEY", file=sys.stderr)
            return 2
        try:
            if index is None:
                raise ActorNotFound(f"no actor {name!r} with key {key!r} (no registry here)")
            record = view.find_actor(index, name, key)
        except ActorNotFound as e:
            print(f"pagekv inspect: {e}", file=sys.stderr)
            return 1
        report = view.read_snapshot(store, record, lambda db: _actor_report(db, args.rows))
    finally:
        store.close()
    if args.json:
        print(_json({**vars(record), "actor_id": record.actor_id, **report}))
    else:
        _print_report(record, report)
    return 0


def add_inspect_command(commands: Any, summary: str) -> None:
    inspect_cmd = commands.add_parser(
        "inspect",
        help=summary,
        description=(
            "Without ACTOR, list the actors of the store; with ACTOR (NAME/KEY), print its "
            "state, tables, queue, schedules and workflow history. Read-only: no takeover, "
            "never writes, safe beside a running server."
        ),
    )
    inspect_cmd.add_argument("actor", nargs="?", help="NAME/KEY of one actor")
    add_store_argument(inspect_cmd)
    inspect_cmd.add_argument(
        "--rows", type=positive_int, default=10, help="rows shown per table (default 10)"
    )
    inspect_cmd.add_argument(
        "--limit", type=positive_int, default=1000, help="actors listed (default 1000)"
    )
    inspect_cmd.add_argument("--json", action="store_true", help="print one JSON document")
    inspect_cmd.set_defaults(run=_inspect)
