"""docs/guide.md, run as its reader would, so that it cannot rot.

The blocks run in order in one fresh temporary directory, each in a fresh process. A Python
block that starts with `# NAME.py` is saved as that file, then run (`python NAME.py`, or pytest
for a `test_*.py`); any other Python block runs with `python -c`. Shell blocks run line by line
in bash (backslash continuations joined), with the venv's `bin` first on `PATH`: `export` lines
carry their variables to the later lines and blocks, `pagekv serve` starts a server in the
background (on a free port: every `6420`, `6421` and `6422` is replaced) that runs until the end.
A block fails the test if it exits non-zero; a Python block's `# -> X` comments must be its
output, line by line, and a shell line `# -> X` the output of the command before it (`...`
matches anything). The PostgreSQL section's shell blocks run in a test of their own, against the
session's PostgreSQL server (`postgres_server`: skipped without one), its URL for the guide's.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
DEPLOY = "\n## 6. Deploying on PostgreSQL\n"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE = re.compile(r"\A# (\w+\.py)\n")
PRINTS = re.compile(r"# -> (.*)$", re.MULTILINE)
PORTS = ("6420", "6421", "6422")
PG_URL = re.compile(r"postgresql://[^'\"\s]+")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    deploy: bool
    """In the PostgreSQL section."""


def _blocks() -> list[Block]:
    text = GUIDE.read_text()
    assert DEPLOY in text, f"the guide has no section {DEPLOY.strip()!r}"
    deploy_at = text.index(DEPLOY)
    return [Block(m.group(1), m.group(2), m.start() > deploy_at) for m in BLOCK.finditer(text)]


def _commands(script: str) -> list[tuple[str, str | None]]:
    """A shell block's commands, each with the output its next line `# -> ...` shows."""
    commands: list[tuple[str, str | None]] = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.startswith("# -> "):
            assert commands, f"{line!r} follows no command"
            commands[-1] = (commands[-1][0], line.removeprefix("# -> "))
        elif line.strip() and not line.lstrip().startswith("#"):
            commands.append((line.strip(), None))
    return commands


def _matches(expected: str, output: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, output, re.DOTALL) is not None


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Reader:
    """The guide's reader, in directory `cwd`."""

    def __init__(self, cwd: Path, *, pg_url: str | None = None) -> None:
        self.cwd = cwd
        self.ports = {port: _free_port() for port in PORTS}
        self.pg_url = pg_url
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEKV_")}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        self.servers: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.ran: Counter[str] = Counter()

    def _localised(self, code: str) -> str:
        for port, free in self.ports.items():
            code = code.replace(port, free)
        if self.pg_url is not None:
            code = PG_URL.sub(self.pg_url, code)
        return code

    def _run(self, argv: list[str], what: str) -> str:
        result = subprocess.run(
            argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, (
            f"this failed (exit {result.returncode}):\n{what}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
        return result.stdout

    def save(self, code: str) -> str | None:
        """Save a file block; its name (None for a block that is no file)."""
        found = FILE.match(code)
        if found is None:
            return None
        (self.cwd / found.group(1)).write_text(self._localised(code))
        return found.group(1)

    def python(self, code: str) -> None:
        name = self.save(code)
        if name is None:
            out = self._run([sys.executable, "-c", self._localised(code)], code)
            assert out.splitlines() == PRINTS.findall(code), f"the output of\n{code}\nwas\n{out}"
        elif name.startswith("test_"):
            self._run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], name)
        else:
            self._run([sys.executable, name], name)
        self.ran["python"] += 1

    def sh(self, code: str, *, only_exports: bool = False) -> None:
        for command, expected in _commands(self._localised(code)):
            if command.startswith("export "):
                out = self._run(["bash", "-c", f"{command}\nenv -0"], command)
                self.env = dict(v.split("=", 1) for v in out.split("\0") if "=" in v)
            elif only_exports:
                continue
            elif command.startswith("pagekv serve "):
                self._serve(command.removesuffix("&").strip())
                self.ran["serve"] += 1
            else:
                out = self._run(["bash", "-c", command], command).strip()
                assert expected is None or _matches(expected, out), (
                    f"{command}\nprinted\n{out}\nnot\n{expected}"
                )
            self.ran["sh"] += 1

    def _serve(self, command: str) -> None:
        port = re.search(r"--port (\d+)", command)
        env = {**self.env, "PAGEKV_PORT": port.group(1) if port else self.ports["6420"]}
        log = self.cwd / f"serve-{len(self.servers)}.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.servers.append((server, log))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{command} exited:\n{log.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{env['PAGEKV_PORT']}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail(f"{command} did not come up:\n{log.read_text()}")

    def stop(self) -> None:
        """Ctrl-C every server, as the guide says to; each must stop cleanly."""
        servers, self.servers = self.servers, []
        for server, _ in servers:
            server.send_signal(signal.SIGINT)
        for server, log in servers:
            try:
                code = server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
                raise
            assert code in (0, 130, -signal.SIGINT), f"serve exited {code}:\n{log.read_text()}"


@pytest.mark.slow
def test_the_guide_runs_top_to_bottom_in_a_fresh_directory(tmp_path: Path) -> None:
    reader = Reader(tmp_path)
    try:
        for block in _blocks():
            if block.lang == "python":
                reader.python(block.code)
            elif block.lang == "sh" and not block.deploy:
                reader.sh(block.code)
            else:
                assert block.lang == "sh", f"a block in {block.lang!r}: how is it run?"
    finally:
        reader.stop()
    assert reader.ran["python"] >= 8 and reader.ran["serve"] == 1, reader.ran


@pytest.mark.slow
def test_the_deployment_runs_on_postgresql(tmp_path: Path, postgres_server) -> None:
    reader = Reader(tmp_path, pg_url=postgres_server.store_url("guide-deploy"))
    try:
        for block in _blocks():
            if block.lang == "python":
                reader.save(block.code)
            elif block.lang == "sh" and block.deploy:
                reader.sh(block.code)
            elif block.lang == "sh":  # the shell the reader deploys from: its variables
                reader.sh(block.code, only_exports=True)
    finally:
        reader.stop()
    assert reader.ran["serve"] == 2 and reader.ran["sh"] >= 6, reader.ran
