"""The `pagekv` command line: one module per command (`serve`, `ui`, `inspect`, `transfers` for
export/import/copy, `benchmark`, `fuzzing`, `backend_check`), their shared argument types
(`args`), and `main`, which imports only the module of the command it runs."""

from pagekv.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
