"""`pagekv fuzz --kv-factory MODULE:CALLABLE`: a backend author's own store under the fuzzer, in
process and with real SIGKILLs (`--processes`); its failures replay only on the same factory.

Every test runs the command line as a user does, from the directory holding their module, with
`python -P` so that the module is found only because the command looks there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BACKENDS = '''
"""Backends under test: correct ones, one that loses writes, and some that are not backends."""

import fcntl
import os
from pathlib import Path

from pagekv.kv import MemoryStore, open_kv
from pagekv.kv.wrappers import KvWrapper


def _called():
    with open(Path(__file__).parent / "calls", "a") as f:
        f.write(f"{os.getpid()}\\n")


def memory(limits=None):
    _called()
    return MemoryStore(limits=limits)


class Exclusive:
    """A persistent store over pagekv's file: store that, like many a backend, lets one process
    at a time open its location (a second open fails at once)."""

    def __init__(self, location, limits):
        self._lock = open(Path(location) / "exclusive.lock", "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._store = open_kv(Path(location).resolve().as_uri(), limits=limits)

    def namespace(self, name):
        return self._store.namespace(name)

    def close(self):
        self._store.close()
        self._lock.close()


def durable(location, limits=None):
    _called()
    return Exclusive(location, limits)


class _DropsEveryOtherWrite(KvWrapper):
    writes = 0

    def _call(self, op, fn, *args, **kwargs):
        if op == "write":
            self.writes += 1
            if self.writes % 2 == 0:
                return None
        return fn(*args, **kwargs)


def drops():
    return _DropsEveryOtherWrite(MemoryStore().namespace("a"))


def namespace(location):
    return MemoryStore().namespace("a")


def wrong():
    return 42


NOT_CALLABLE = 3
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A backend author's directory with their module `kvs`."""
    (tmp_path / "kvs.py").write_text(BACKENDS)
    return tmp_path


def _fuzz(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pagekv fuzz ARGS` from `cwd`, its temporary files in `cwd/tmp`."""
    (cwd / "tmp").mkdir(exist_ok=True)
    command = [sys.executable, "-P", "-m", "pagekv", "fuzz", *args]
    env = {**os.environ, "TMPDIR": str(cwd / "tmp")}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _count(out: str, what: str) -> int:
    return int(out.split(f"{what} ")[1].split(",")[0])


def _calls(project: Path) -> list[str]:
    return (project / "calls").read_text().split()


def test_a_memory_store_factory_passes(project: Path) -> None:
    done = _fuzz(project, "--kv-factory", "kvs:memory", "--seconds", "2", "--seed", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "factory kvs:memory" in done.stdout
    runs = int(done.stdout.split("ok: ")[1].split()[0])
    assert runs >= 2 and len(_calls(project)) > runs, done.stdout  # a fresh store per run


def test_a_persistent_store_survives_real_crashes(project: Path) -> None:
    """Each child opens the store through the factory at one location, and the parent opens it
    only between children: the store lets one process in at a time. The location is a fresh
    temporary directory, removed after a run that passes."""
    args = ["--kv-factory", "kvs:durable", "--processes", "--writers", "2", "--seconds", "3"]
    done = _fuzz(project, *args, "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    crashes = _count(done.stdout, "crashes")
    assert crashes > 0, done.stdout
    assert _count(done.stdout, "verifications") >= 2 * crashes, done.stdout
    assert len(set(_calls(project))) > crashes, "the children did not open it through the factory"
    assert "Traceback" not in done.stderr, done.stderr
    assert not list((project / "tmp").iterdir())


def test_a_store_losing_writes_fails_and_replays_only_on_its_factory(project: Path) -> None:
    out = project / "failure.json"
    args = ["--kv-factory", "kvs:drops", "--seconds", "3", "--seed", "1", "--out", str(out)]
    done = _fuzz(project, *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"--replay {out} --kv-factory kvs:drops" in done.stderr
    saved = json.loads(out.read_text())
    assert saved["kv_factory"] == "kvs:drops" and "kv" not in saved, saved

    again = _fuzz(project, "--replay", str(out), "--kv-factory", "kvs:drops")
    assert again.returncode == 1 and "FAILED" in again.stderr, again.stdout + again.stderr
    for other in ([], ["--kv-factory", "kvs:memory"]):
        refused = _fuzz(project, "--replay", str(out), *other)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "made with --kv-factory kvs:drops" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def test_a_replay_made_on_a_url_refuses_a_factory(project: Path) -> None:
    url_made = Path(__file__).parent / "replays" / "quota-vacuum-free-leaf.json"
    shutil.copy(url_made, project / "url.json")
    refused = _fuzz(project, "--replay", "url.json", "--kv-factory", "kvs:memory")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "made on store memory://, not with a factory" in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nocolon"], "must be MODULE:CALLABLE"),
        (["nosuch:make"], "cannot import 'nosuch'"),
        (["kvs:missing"], "has no 'missing'"),
        (["kvs:NOT_CALLABLE"], "not a callable"),
        (["kvs:wrong"], "returned int 42, neither a namespace"),
        (["kvs:namespace", "--processes"], "kvs:namespace returns a namespace"),
        (["kvs:memory", "--processes"], "kvs:memory takes none"),
        (
            ["kvs:durable", "--processes", "--faults", "disk"],
            "--faults disk acts on a file: store's own files",
        ),
        (["kvs:memory", "--kv", "file:./x"], "not allowed with argument --kv"),
    ],
    ids=[
        "no-colon",
        "no-module",
        "no-attribute",
        "not-callable",
        "not-a-backend",
        "processes-namespace",
        "processes-no-location",
        "processes-disk",
        "with-kv",
    ],
)
def test_a_bad_factory_is_a_usage_error(project: Path, args: list[str], says: str) -> None:
    done = _fuzz(project, "--seconds", "1", "--kv-factory", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_real_crashes_without_a_store_leave_nothing_where_they_run(tmp_path: Path) -> None:
    """`fuzz --processes` with no `--kv` runs on a `file:` store in a fresh temporary directory,
    removed after a run that passes: nothing lands in the directory it ran from."""
    done = _fuzz(tmp_path, "--processes", "--writers", "1", "--seconds", "3", "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a file: store in a fresh temporary directory" in done.stdout
    assert _count(done.stdout, "crashes") > 0, done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"]
    assert not list((tmp_path / "tmp").iterdir())


def test_a_failure_file_goes_to_the_temporary_directory(project: Path) -> None:
    done = _fuzz(project, "--kv-factory", "kvs:drops", "--seconds", "3", "--seed", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    saved = project / "tmp" / "pagekv-fuzz-1.json"
    assert f"--replay {saved} --kv-factory kvs:drops" in done.stderr
    assert json.loads(saved.read_text())["kv_factory"] == "kvs:drops"
    assert sorted(p.name for p in project.iterdir()) == ["kvs.py", "tmp"]
