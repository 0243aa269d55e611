"""The README, run as a newcomer would: its code blocks in order, from a copy of the checkout's
`examples/` in a fresh directory, up to the benchmarking section (whose commands have tests of
their own), writing nothing but `.pagekv`. `./run serve` starts a real server in the background (on
a free port: every `6420` is replaced), a new one stops the previous one as the README says to,
`./test` is this suite, shell lines run in bash, Python blocks each in a fresh interpreter. A
snippet that rots fails."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    return BLOCK.findall(text[: text.index("\n## Benchmarking")])


def _lines(script: str) -> list[str]:
    """Shell commands, a backslash-continued line joined into one."""
    return [line for line in script.replace("\\\n", " ").splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Newcomer:
    def __init__(self, cwd: Path, port: int) -> None:
        self.cwd, self.port = cwd, port
        self.env = {k: v for k, v in os.environ.items() if k != "PAGEKV_TOKEN"}
        self.server: subprocess.Popen[str] | None = None
        self.outputs: list[str] = []

    def sh(self, line: str) -> None:
        if line.startswith("./test"):
            return
        if line.startswith("./run serve"):
            self.stop_server()
            command = line.replace("./run", f"exec {sys.executable} -m pagekv", 1)
            self.server = subprocess.Popen(
                ["bash", "-c", command], cwd=self.cwd, env=self.env, text=True
            )
            self._wait_healthy()
            return
        if line.startswith("export "):
            name = line.split()[1].partition("=")[0]
            value = self._run(["bash", "-c", f'{line}; printf %s "${name}"'])
            self.env[name] = value
            return
        self.outputs.append(self._run(["bash", "-c", line]))

    def python(self, code: str) -> None:
        self.outputs.append(self._run([sys.executable, "-c", code]))

    def _run(self, argv: list[str]) -> str:
        result = subprocess.run(
            argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{argv[-1]}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.server is not None and self.server.poll() is None, "serve exited"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail("the server did not come up")

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.send_signal(signal.SIGINT)  # Ctrl-C
            assert self.server.wait(timeout=30) in (0, 130, -signal.SIGINT)
            self.server = None


@pytest.mark.slow
def test_the_readme_runs_top_to_bottom_in_a_fresh_directory(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = _free_port()
    newcomer = _Newcomer(tmp_path, port)
    newcomer.env["PAGEKV_PORT"] = str(port)  # the default port of the first `serve`
    ran = []
    try:
        for lang, code in _blocks():
            code = code.replace("6420", str(port))
            if lang == "sh":
                for line in _lines(code):
                    newcomer.sh(line)
            elif lang == "python":
                newcomer.python(code)
            ran.append(lang)
    finally:
        newcomer.stop_server()
    out = newcomer.outputs
    # the snippets run from the checkout: all they write must go to the git-ignored .pagekv
    assert sorted(p.name for p in tmp_path.iterdir()) == [".pagekv", "examples"]
    assert ran.count("python") >= 4 and ran.count("sh") >= 3, ran
    assert '{"result":5}' in out[0], "the first curl"
    assert any("completed" in o and "'approved': True" in o for o in out), "the workflow ran"
    assert any("hi, ada" in o for o in out), "the client reached the chat server"


def test_the_check_backend_factory_to_start_from_passes(tmp_path: Path) -> None:
    """The factory the check-backend section shows, saved as the `mykv.py` it names, and checked
    as it says."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Writing a KV backend") :]
    factory = next(code for lang, code in BLOCK.findall(section) if lang == "python")
    assert len(factory.strip().splitlines()) <= 5, factory
    (tmp_path / "mykv.py").write_text(factory)
    done = subprocess.run(
        [sys.executable, "-m", "pagekv", "check-backend", "mykv:make_store", "--seconds", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("ok: mykv:make_store conforms"), done.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["mykv.py"]
