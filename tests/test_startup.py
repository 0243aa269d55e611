"""The `pagekv` command line: a command imports only what it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_command_imports_only_its_own_modules() -> None:
    """`pagekv demo` and `pagekv --help` run without importing the server, bench or fuzz modules
    (together ~0.3 s of start-up), nor rich; the help still lists every command with its
    summary, and `pagekv bench --help` builds bench's whole parser."""
    script = (
        "import sys\n"
        "from pagekv.cli import build_parser, main\n"
        "def loaded():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['pagekv', 'server'], ['pagekv', 'bench'], ['pagekv', 'fuzz'], ['pagekv', 'cli']) "
        "and m not in ('pagekv.cli', 'pagekv.cli.main', 'pagekv.cli.args'))\n"
        "assert main(['demo', '--kv', 'memory://', '--rows', '2']) == 0\n"
        "assert not loaded(), loaded()\n"
        "help = build_parser().format_help()\n"
        "assert not loaded(), loaded()\n"
        "assert 'rich' not in sys.modules  # progress and tables only: ~30 ms to import\n"
        "assert all(c in help for c in ('demo', 'serve', 'inspect', 'bench', 'fuzz')), help\n"
        "assert 'crash, fault and takeover' in help, help\n"
        "bench = build_parser('bench').parse_args(['bench', '--workload', 'commit-1'])\n"
        "assert bench.workload == ['commit-1'], bench\n"
        "assert 'pagekv.cli.benchmark' in loaded(), loaded()\n"
        "assert 'pagekv.bench.workloads' in loaded(), loaded()\n"
        "assert not any(m.startswith(('pagekv.server', 'pagekv.fuzz')) for m in loaded())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 one-row commits" in done.stdout


def test_inspect_does_without_the_http_stack(tmp_path: Path) -> None:
    """`pagekv inspect` reads the store beside a running server; it needs the wire format, not
    the ASGI app (starlette and uvicorn)."""
    script = (
        "import sys\n"
        "from pagekv.cli import main\n"
        f"assert main(['inspect', '--kv', 'file://{tmp_path}']) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
