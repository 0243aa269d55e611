"""`pagekv check-backend` as its users run it: a real process, a factory module in their
directory, exit 0/1/2, the summary lines, the replay file and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FACTORIES = textwrap.dedent(
    """\
    from pagekv.kv import MemoryStore

    def good(limits=None):
        return MemoryStore(limits=limits).namespace("x")

    class Truncating:
        '''Keeps at most 64 KiB of a value, below the 128 KiB it advertises.'''

        def __init__(self, limits=None):
            self.inner = MemoryStore(limits=limits).namespace("x")
            self.limits = self.inner.limits

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def write(self, *, put=(), delete=(), fence=None):
            put = {k: v[:65536] for k, v in dict(put).items()}
            self.inner.write(put=put, delete=delete, fence=fence)

        def put(self, entries, *, fence=None):
            self.write(put=entries, fence=fence)

    def number():
        return 3

    def needs_an_argument(size):
        return MemoryStore().namespace("x")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "mykv.py").write_text(FACTORIES)
    return tmp_path


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagekv", "check-backend", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_a_conforming_backend_exits_0_with_a_line_per_part(project: Path) -> None:
    done = _check("mykv:good", "--parts", "contract,fuzz", "--seconds", "1", cwd=project)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pagekv check-backend: mykv:good, seed ")
    parts = [line.split()[:2] for line in lines[1:-1] if not line.startswith(" ")]
    assert parts == [["contract", "passed"], ["fuzz", "passed"]]
    skipped = [line for line in lines if line.startswith("    not checked: ")]
    assert skipped and all("needs" in line for line in skipped)  # a namespace factory has no store
    assert lines[-1].startswith("ok: mykv:good conforms")
    assert not list(project.glob("pagekv-check-*.json"))


def test_a_violation_exits_1_names_the_clause_and_replays(project: Path) -> None:
    done = _check("mykv:Truncating", "--seconds", "2", "--seed", "5", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "value size boundary" in done.stderr or "max_value_bytes" in done.stderr
    assert "  call:     kv." in done.stderr
    replay = project / "pagekv-check-5.json"
    data = json.loads(replay.read_text())
    assert data["factory"] == "mykv:Truncating"
    assert data["violations"] and all(v["report"] for v in data["violations"])
    again = _check("mykv:Truncating", "--replay", str(replay), cwd=project)
    assert again.returncode == 1
    n = len(data["violations"])
    assert again.stdout.splitlines()[-1] == f"{n} of {n} violation(s) reproduced"


def test_a_replay_against_another_backend_refuses(project: Path) -> None:
    replay = project / "made.json"
    replay.write_text(json.dumps({"factory": "mykv:Truncating", "seed": 1, "violations": []}))
    done = _check("mykv:good", "--replay", str(replay), cwd=project)
    assert done.returncode == 2
    assert "was made with factory mykv:Truncating, not mykv:good" in done.stderr


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("mykv", "must be MODULE:CALLABLE"),
        ("nosuchmodule:make", "cannot import 'nosuchmodule'"),
        ("mykv:missing", "module 'mykv' has no 'missing'"),
        ("mykv:number", "returned int 3, neither a namespace"),
        ("mykv:needs_an_argument", "cannot be called with {}"),
    ],
)
def test_a_factory_that_cannot_be_used_exits_2(project: Path, spec: str, says: str) -> None:
    done = _check(spec, "--parts", "contract", cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stderr


def test_unknown_parts_and_a_malformed_replay_exit_2(project: Path) -> None:
    done = _check("mykv:good", "--parts", "contract,speed", cwd=project)
    assert done.returncode == 2
    assert "unknown --parts ['speed']" in done.stderr
    (project / "bad.json").write_text("[1]")
    done = _check("mykv:good", "--replay", "bad.json", cwd=project)
    assert done.returncode == 2
    assert "cannot replay bad.json" in done.stderr
