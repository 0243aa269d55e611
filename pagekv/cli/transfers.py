"""`pagekv export`, `pagekv import` and `pagekv copy`: data in and out of a store.

- `export --kv URL NAME/KEY -o FILE` (or `--all -o DIR`): actors as plain SQLite files, from
  read-only snapshots (`pagekv.transfer.exporter`); safe beside running servers.
- `import --kv URL NAME/KEY FILE [--replace]`: an actor from a SQLite file
  (`pagekv.transfer.importer`).
- `copy --from URL --to URL [--allow-live]`: every actor and the registry's index into another
  store, resumable and verified (`pagekv.transfer.store_copy`).

Exit status: 0 done; 1 refused or failed (the message says why; nothing half-done is visible);
2 a usage error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pagekv.actor import ActorError
from pagekv.cli.args import add_store_argument, kv_url, positive_int
from pagekv.cli.progress import StatusLine
from pagekv.kv import KvError, open_kv, redact_url
from pagekv.transfer.exporter import Exported, export_actor, export_all
from pagekv.transfer.importer import (
    Imported,
    ImportStopped,
    import_all,
    import_prepared,
    prepare_import,
    read_manifest,
)
from pagekv.transfer.store_copy import THREADS, CopyProgress, check_source, copy_store
from pagekv.vfs import SnapshotExpired, StorageCorrupt

_FAILURES = (ActorError, KvError, SnapshotExpired, StorageCorrupt, OSError, ValueError)
"""What a command reports in one line and exits 1 for: refusals, store and file errors (a
store that cannot be opened or reached too)."""


def _actor(value: str) -> tuple[str, str]:
    name, sep, key = value.partition("/")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"name the actor as NAME/KEY, got {value!r}")
    return name, key


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected JSON, got {value!r}: {e}") from None


def _fail(command: str, error: BaseException) -> int:
    """One line: the error, and the notes that say where it happened (which namespace)."""
    where = "".join(f" ({note})" for note in getattr(error, "__notes__", ()))
    print(f"pagekv {command}: {error}{where}", file=sys.stderr)
    return 1


def _exported_line(e: Exported) -> str:
    kv = f", {e.kv_entries} ctx.kv entries" if e.kv_entries else ""
    return f"exported {e.actor.actor_id}: {e.pages} pages, {e.bytes:,} bytes{kv} -> {e.path}"


def _export(args: argparse.Namespace) -> int:
    if (args.actor is None) == (not args.all):
        print("pagekv export: name one actor (NAME/KEY) or pass --all", file=sys.stderr)
        return 2
    try:
        store = open_kv(args.kv, create=False)
    except _FAILURES as e:
        return _fail("export", e)
    try:
        if args.all:
            exported = export_all(store, args.output)
        else:
            name, key = args.actor
            exported = [export_actor(store, name, key, args.output)]
    except _FAILURES as e:
        return _fail("export", e)
    finally:
        store.close()
    if args.json:
        print(json.dumps([{**asdict(e), "path": str(e.path)} for e in exported]))
    else:
        for one in exported:
            print(_exported_line(one))
        if args.all:
            print(f"{len(exported)} actor(s) exported to {args.output}")
    return 0


def _import(args: argparse.Namespace) -> int:
    """The file is checked and converted before the store is opened: a refused file leaves no
    store made where none was."""
    if args.all is not None:
        return _import_all(args)
    if args.actor is None or args.file is None:
        print(
            "pagekv import: name the actor (NAME/KEY) and its FILE, or pass --all DIR",
            file=sys.stderr,
        )
        return 2
    try:
        with prepare_import(args.file, *args.actor, state=args.state) as prepared:
            store = open_kv(args.kv)
            try:
                imported = import_prepared(store, prepared, replace=args.replace)
            finally:
                store.close()
    except _FAILURES as e:
        return _fail("import", e)
    if args.json:
        print(json.dumps(asdict(imported)))
        return 0
    _print_imported(imported)
    return 0


def _import_all(args: argparse.Namespace) -> int:
    """`--all DIR`: the manifest is read before the store is opened (a directory that is no
    export makes no store)."""
    if args.actor is not None or args.file is not None or args.state is not None:
        print("pagekv import: --all DIR takes no NAME/KEY, FILE or --state", file=sys.stderr)
        return 2
    imported: list[Imported] = []
    try:
        read_manifest(args.all)
        store = open_kv(args.kv)
        try:
            imported = import_all(store, args.all, replace=args.replace)
        finally:
            store.close()
    except ImportStopped as e:
        imported = e.imported
        for done in imported if not args.json else []:
            _print_imported(done)
        return _fail("import", e)
    except _FAILURES as e:
        return _fail("import", e)
    if args.json:
        print(json.dumps([asdict(i) for i in imported]))
        return 0
    for done in imported:
        _print_imported(done)
    print(f"{len(imported)} actor(s) imported from {args.all}")
    return 0


def _print_imported(imported: Imported) -> None:
    how = "replaced" if imported.replaced else "created"
    kv = f", {imported.kv_entries} ctx.kv entries" if imported.kv_entries else ""
    print(f"imported {imported.actor.actor_id} ({how}): {imported.pages} pages{kv}")
    for change in imported.converted:
        print(f"  converted: {change}")


def _copy_progress(line: StatusLine) -> Callable[[CopyProgress], None]:
    """A copy's progress on `line`: every report on a terminal, the last of each phase kept;
    in a log, a line every few seconds and the last of each phase."""

    def report(p: CopyProgress) -> None:
        rate = p.bytes / 2**20 / p.elapsed if p.elapsed > 0 else 0.0
        skipped = f", {p.skipped} already copied" if p.skipped else ""
        written = f", {p.bytes / 2**20:.1f} MiB ({rate:.1f} MiB/s)" if p.phase == "copy" else ""
        text = (
            f"pagekv copy: {p.phase} {p.done}/{p.total} namespaces{skipped}{written}, "
            f"{p.elapsed:.0f} s"
        )
        last = p.done == p.total
        line.show(text, now=last)
        if last:
            line.end()

    return report


def _copy(args: argparse.Namespace) -> int:
    try:
        source = open_kv(args.source, create=False)
    except _FAILURES as e:
        return _fail("copy", e)
    try:
        check_source(source, allow_live=args.allow_live)
        destination = open_kv(args.destination)
    except _FAILURES as e:
        source.close()
        return _fail("copy", e)
    line = StatusLine(enabled=not args.no_progress)
    try:
        result = copy_store(
            source,
            destination,
            allow_live=args.allow_live,
            threads=args.threads,
            progress=_copy_progress(line),
        )
    except _FAILURES as e:
        return _fail("copy", e)
    except KeyboardInterrupt:
        print("pagekv copy: interrupted; run it again to go on", file=sys.stderr)
        return 130
    finally:
        line.end()  # a copy stopped midway: the cursor rich hid is shown again
        destination.close()
        source.close()
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"copied {redact_url(args.source)} -> {redact_url(args.destination)}: "
            f"{result.copied} namespace(s), {result.bytes / 2**20:.1f} MiB in "
            f"{result.seconds:.1f} s; {result.skipped} copied by an earlier run; "
            f"{result.verified} verified"
        )
        for name in result.snapshots:
            print(f"  {name}: kept changing; copied from one consistent read")
        for name in result.changed:
            print(f"  {name}: changed at the source after its copy")
        for name in result.removed:
            print(f"  {name}: not in the source; emptied at the destination")
    if result.changed and not args.allow_live:
        print(
            f"pagekv copy: {len(result.changed)} namespace(s) changed at the source during the "
            "copy (was a server started on it?); stop it and copy again",
            file=sys.stderr,
        )
        return 1
    return 0


def add_export_command(commands: Any, summary: str) -> None:
    parser = commands.add_parser(
        "export",
        help=summary,
        description=(
            "Write an actor's database (or, with --all, every actor's) as a plain SQLite file, "
            "from a read-only snapshot: no takeover, safe beside running servers."
        ),
    )
    parser.add_argument("actor", nargs="?", type=_actor, help="NAME/KEY of the actor")
    add_store_argument(parser)
    parser.add_argument("--all", action="store_true", help="export every actor into -o DIR")
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the file (a directory with --all)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=_export)


def add_import_command(commands: Any, summary: str) -> None:
    parser = commands.add_parser(
        "import",
        help=summary,
        description=(
            "Create an actor from a SQLite file (an export, or any SQLite database). Refused if "
            "the actor exists, unless --replace, which takes it over and swaps its database in "
            "one step. A failed import leaves no actor behind. --all DIR imports every actor "
            "an export --all wrote there."
        ),
    )
    parser.add_argument("actor", nargs="?", type=_actor, help="NAME/KEY of the actor to create")
    parser.add_argument("file", nargs="?", type=Path, help="the SQLite file")
    parser.add_argument(
        "--all",
        type=Path,
        metavar="DIR",
        help="import every actor an `export --all -o DIR` wrote (its actors.json)",
    )
    add_store_argument(parser)
    parser.add_argument(
        "--replace", action="store_true", help="replace the actor's database if it exists"
    )
    parser.add_argument(
        "--state",
        type=_json_value,
        default=None,
        help="state (JSON) of an actor made from a file with no pagekv tables (default null)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=_import)


def add_copy_command(commands: Any, summary: str) -> None:
    parser = commands.add_parser(
        "copy",
        help=summary,
        description=(
            "Copy every actor and the registry's index from one store into another, empty one "
            "(e.g. file: to postgresql://). Resumable: run it again after an interruption. "
            "Verified at the end by checksums of each actor's content. A source being served "
            "is refused unless --allow-live."
        ),
    )
    parser.add_argument("--from", dest="source", type=kv_url, required=True, help="source URL")
    parser.add_argument(
        "--to", dest="destination", type=kv_url, required=True, help="destination URL"
    )
    parser.add_argument(
        "--allow-live",
        action="store_true",
        help="copy a source that is being served: snapshots, and a report of what changed",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=THREADS,
        help=f"namespaces copied at once (default {THREADS})",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=_copy)
