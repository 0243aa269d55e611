"""A reader of pagekv's documentation: runs a page's code blocks as its reader would, so that no
page can rot (tests/test_docs.py, tests/test_guide.py, tests/test_readme.py).

The blocks run in order in one fresh directory (holding a copy of `examples/`), each in a fresh
process. A Python block that starts with `# NAME.py` is saved as that file, then run (`python
NAME.py`, or pytest for a `test_*.py`); any other Python block runs with `python -c`. Shell blocks
run line by line in bash (backslash continuations joined), with the venv's `bin` first on `PATH`:
`./run ARGS` is `pagekv ARGS` (what `./run` runs once set up), `./test` is this suite (not run
again), `export` lines carry their variables to the later lines and blocks, and `pagekv serve`
starts a server in the background (on a free port: every `6420`, `6421` and `6422` is replaced)
that runs until the page ends or the next `serve` on the same port. A block fails the test if it
exits non-zero; a Python block's `# -> X` comments must be its output, line by line, and a shell
line `# -> X` the output of the command before it (`...` matches anything). `text` blocks are
output or synopses, not run.

Durations are the reader's only shortcut: `fuzz` and `check-backend` run 2 s, and `pagekv
bench` runs its `--quick` sizes once, so a page of hour-long examples runs in seconds on the same
code paths."""

from __future__ import annotations

import os
import re
import shutil
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

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE = re.compile(r"\A# ([\w/]+\.py)\n")
PRINTS = re.compile(r"# -> (.*)$", re.MULTILINE)
PORTS = ("6420", "6421", "6422")
PG_URL = re.compile(r"postgresql://[^'\"\s]+")
RUN = ("python", "sh")
"""The languages of blocks that run; `text` blocks are shown, not run."""
SHOWN = ("text",)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    at: int
    """Where in the page it starts (characters)."""


def blocks(text: str) -> list[Block]:
    found = [Block(m.group(1), m.group(2), m.start()) for m in BLOCK.finditer(text)]
    odd = [b.lang for b in found if b.lang not in RUN + SHOWN]
    assert not odd, f"blocks in {odd}: how are they run?"
    return found


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


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _shortened(command: str) -> str:
    command = re.sub(r"--seconds \d+", "--seconds 2", command)
    for timed in ("pagekv fuzz", "pagekv check-backend"):
        if command.startswith(timed) and "--seconds" not in command and "--replay" not in command:
            command = command.replace(timed, f"{timed} --seconds 2", 1)
    if command.startswith("pagekv bench"):
        command = re.sub(r"--repeat \d+", "", command)
        command = command.replace("pagekv bench", "pagekv bench --quick --repeat 1", 1)
    return command


class Reader:
    """A reader of the docs, in directory `cwd` (a fresh one, with `examples/` copied in)."""

    def __init__(self, cwd: Path, *, pg_url: str | None = None, logs: Path | None = None) -> None:
        self.cwd = cwd
        self.logs = cwd if logs is None else logs
        """Where the servers' output goes."""
        shutil.copytree(ROOT / "examples", cwd / "examples")
        self.ports = {port: free_port() for port in PORTS}
        self.pg_url = pg_url
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEKV_")}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        self.servers: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.ran: Counter[str] = Counter()
        self.outputs: list[str] = []

    def read(self, text: str) -> None:
        """Run every block of a page, in order."""
        for block in blocks(text):
            if block.lang == "python":
                self.python(block.code)
            elif block.lang == "sh":
                self.sh(block.code)

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
        self.outputs.append(result.stdout)
        return result.stdout

    def save(self, code: str) -> str | None:
        """Save a file block; its name (None for a block that is no file)."""
        found = FILE.match(code)
        if found is None:
            return None
        path = self.cwd / found.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self._localised(code))
        return found.group(1)

    def python(self, code: str) -> None:
        name = self.save(code)
        if name is None:
            out = self._run([sys.executable, "-c", self._localised(code)], code)
            expected = PRINTS.findall(code)
            lines = out.splitlines()
            assert len(lines) == len(expected) and all(
                _matches(e, o) for e, o in zip(expected, lines, strict=True)
            ), f"the output of\n{code}\nwas\n{out}"
        elif Path(name).name.startswith("test_"):
            self._run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], name)
        else:
            self._run([sys.executable, name], name)
        self.ran["python"] += 1

    def sh(self, code: str, *, only_exports: bool = False) -> None:
        for command, expected in _commands(self._localised(code)):
            command = _shortened(re.sub(r"^\./run\b", "pagekv", command))
            if command.startswith("export "):
                out = self._run(["bash", "-c", f"{command}\nenv -0"], command)
                self.env = dict(v.split("=", 1) for v in out.split("\0") if "=" in v)
            elif only_exports or command.startswith("./test"):
                continue
            elif command.startswith("pagekv serve ") or command.startswith("pagekv ui "):
                self._serve(command.removesuffix("&").strip())
                self.ran["serve"] += 1
            else:
                out = self._run(["bash", "-c", command], command).strip()
                assert expected is None or _matches(expected, out), (
                    f"{command}\nprinted\n{out}\nnot\n{expected}"
                )
            self.ran["sh"] += 1

    def _serve(self, command: str) -> None:
        given = re.search(r"--port (\d+)", command)
        default = self.ports["6421" if command.startswith("pagekv ui") else "6420"]
        port = given.group(1) if given else self.env.get("PAGEKV_PORT", default)
        if port in self.servers:
            self._stop(*self.servers.pop(port))
        env = {**self.env, "PAGEKV_PORT": port}
        log = self.logs / f"serve-{self.ran['serve']}.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.servers[port] = (server, log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{command} exited:\n{log.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail(f"{command} did not come up:\n{log.read_text()}")

    @staticmethod
    def _stop(server: subprocess.Popen[bytes], log: Path) -> None:
        server.send_signal(signal.SIGINT)  # Ctrl-C, as the docs say to
        try:
            code = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            raise
        assert code in (0, 130, -signal.SIGINT), f"serve exited {code}:\n{log.read_text()}"

    def stop(self) -> None:
        """Ctrl-C every server; each must stop cleanly."""
        servers, self.servers = list(self.servers.values()), {}
        for server, log in servers:
            self._stop(server, log)
