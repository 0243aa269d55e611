"""`pagekv`: the parser of every subcommand, `pagekv demo`, and `main`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pagekv import __version__
from pagekv.cli.args import add_store_argument, positive_int
from pagekv.kv import CountingKv, open_kv
from pagekv.vfs import caused_by_interrupt, open_database


def _serve(commands: Any, summary: str) -> None:
    from pagekv.cli.serve import add_serve_command

    add_serve_command(commands, summary)


def _inspect(commands: Any, summary: str) -> None:
    from pagekv.cli.inspect import add_inspect_command

    add_inspect_command(commands, summary)


def _export(commands: Any, summary: str) -> None:
    from pagekv.cli.transfers import add_export_command

    add_export_command(commands, summary)


def _import(commands: Any, summary: str) -> None:
    from pagekv.cli.transfers import add_import_command

    add_import_command(commands, summary)


def _copy(commands: Any, summary: str) -> None:
    from pagekv.cli.transfers import add_copy_command

    add_copy_command(commands, summary)


def _ui(commands: Any, summary: str) -> None:
    from pagekv.cli.ui import add_ui_command

    add_ui_command(commands, summary)


def _bench(commands: Any, summary: str) -> None:
    from pagekv.cli.benchmark import add_bench_command

    add_bench_command(commands, summary)


def _fuzz(commands: Any, summary: str) -> None:
    from pagekv.cli.fuzzing import add_fuzz_command

    add_fuzz_command(commands, summary)


def _check_backend(commands: Any, summary: str) -> None:
    from pagekv.cli.backend_check import add_check_backend_command

    add_check_backend_command(commands, summary)


COMMANDS: dict[str, tuple[Callable[[Any, str], None], str]] = {
    "serve": (_serve, "serve a registry's actors over HTTP (gateway, inspector, /metrics)"),
    "inspect": (
        _inspect,
        "print actors' state, tables and workflow history from the store (read-only)",
    ),
    "export": (_export, "write actors' databases as plain SQLite files (read-only snapshots)"),
    "import": (_import, "create an actor from a SQLite file"),
    "copy": (
        _copy,
        "copy every actor and the registry's index into another store (e.g. file: to PostgreSQL)",
    ),
    "ui": (_ui, "the inspector's web page over the store, without a server (read-only)"),
    "bench": (_bench, "compare commit throughput and KV traffic with native SQLite"),
    "fuzz": (_fuzz, "crash, fault and takeover fuzzing against a native SQLite oracle"),
    "check-backend": (_check_backend, "check a KV backend of your own against pagekv's contract"),
}
"""Subcommand -> the function that adds its parser (importing its module), and its one-line
summary. A run imports only its own command's module, and `pagekv --help` none of them: the
server, bench and fuzz modules together took ~0.3 s to import."""


def _demo(args: argparse.Namespace) -> int:
    """Commit rows to an actor's database on the store, reopen it, and show the KV traffic."""
    store = open_kv(args.kv)
    try:
        kv = CountingKv(store.namespace(args.actor))
        with open_database(kv) as db:
            db.execute("CREATE TABLE IF NOT EXISTS notes(id INTEGER PRIMARY KEY, body BLOB)")
            kv.reset()
            started = time.perf_counter()
            for _ in range(args.rows):
                db.execute("INSERT INTO notes(body) VALUES (?)", (os.urandom(100),))
            elapsed = time.perf_counter() - started
            small = kv.reset()
            db.execute("INSERT INTO notes(body) VALUES (?)", (os.urandom(1 << 20),))
            large = kv.reset()
            count = db.execute("SELECT count(*) FROM notes").fetchall()[0][0]
        with open_database(kv, read_only=True) as snapshot:
            kv.reset()
            again = snapshot.execute("SELECT count(*) FROM notes").fetchall()[0][0]
            cold = kv.reset()
    finally:
        store.close()
    print(f"store {args.kv}, actor {args.actor!r}: {count} rows (reopened read-only: {again})")
    print(
        f"{args.rows} one-row commits in {elapsed * 1000:.1f} ms "
        f"({args.rows / elapsed:,.0f} commits/s), {small.writes} KV writes "
        f"({small.writes / args.rows:.2f} per commit)"
    )
    print(f"1 MiB blob insert: {large.writes} KV writes, {large.bytes_written:,} bytes")
    print(f"cold count(*) after reopen: {cold.reads} KV reads")
    return 0


class _VersionAction(argparse.Action):
    """`--version`: the version and whether the compiled modules are in use, e.g.
    `pagekv 0.1.0 (compiled: 19 modules)`; worked out only when asked (it reads the install's
    build record and looks up where those modules import from)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show the version and build (compiled or interpreted), and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from pagekv import build_description

        print(f"pagekv {__version__} ({build_description()})")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for running `command` (or `demo`): that subcommand complete, the others only
    named with their summaries, so that their modules are not imported. Without `command`, every
    subcommand is only named: enough for `pagekv --help` and for rejecting an unknown one."""
    parser = argparse.ArgumentParser(
        prog="pagekv",
        description="Stateful actors whose SQLite databases live in a key-value store.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="commit rows to a KV-backed database and report")
    add_store_argument(demo)
    demo.add_argument("--actor", default="demo", help="actor id (default demo)")
    demo.add_argument(
        "--rows", type=positive_int, default=200, help="one-row commits (default 200)"
    )
    demo.set_defaults(run=_demo)
    for name, (add, summary) in COMMANDS.items():
        if command == name:
            add(commands, summary)
        else:
            commands.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in (*COMMANDS, "demo") else None
    args = build_parser(command).parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        # `pagekv inspect --json | head`: the reader left; say nothing more, as `cat` does.
        # stdout is pointed at /dev/null so that flushing it at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (KeyboardInterrupt, Exception) as e:
        # Ctrl-C in a command that does not end itself on one (fuzz, bench, inspect): one line
        # and the shell's status for it, not a traceback (copy, serve and ui say more first)
        if not caused_by_interrupt(e):
            raise
        print(f"pagekv {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
