"""`pagekv check-backend` as its users run it: a real process, a factory module in their
directory, exit 0/1/2, the summary lines, the replay file and its refusals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FACTORIES = textwrap.dedent(
    """\
    import threading
    from pathlib import Path

    from pagekv.kv import MemoryStore, open_kv

    def good(limits=None):
        return MemoryStore(limits=limits).namespace("x")

    def store(location, limits=None):
        return open_kv(location.as_uri(), limits=limits)

    def fails_first(limits=None):
        raise ValueError("no database at localhost:5432")

    def reopen_fails(location, limits=None):
        '''Opens a fresh location, refuses one it opened before (in any process).'''
        if (location / "opened").exists():
            raise TypeError("reopening is not supported")
        (location / "opened").touch()
        return open_kv(location.as_uri(), limits=limits)

    def leaks_a_thread(limits=None):
        threading.Thread(target=threading.Event().wait).start()  # not a daemon, never ends
        return MemoryStore(limits=limits).namespace("x")

    class Wrapped:
        def __init__(self, limits=None):
            self.inner = MemoryStore(limits=limits).namespace("x")
            self.limits = self.inner.limits

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class Exits(Wrapped):
        def list(self, **kwargs):
            raise SystemExit(7)

    class Interrupts(Wrapped):
        def list(self, **kwargs):
            raise KeyboardInterrupt

    class Hangs(Wrapped):
        def list(self, **kwargs):
            threading.Event().wait()

    class Spied(Wrapped):
        def evil(self):
            Path(__file__).with_name("evil-called").touch()  # the check runs elsewhere

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

    SHARED = MemoryStore()

    def shared_namespace(limits=None):
        return SHARED.namespace("x")

    def fixed_place(limits=None):
        return open_kv(Path(__file__).with_name("fixed-store").as_uri(), limits=limits)

    def needs_an_argument(size):
        return MemoryStore().namespace("x")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "mykv.py").write_text(FACTORIES)
    (tmp_path / "needs_redis.py").write_text('raise RuntimeError("set REDIS_URL")\n')
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
        ("mykv:fails_first", "failed its first call, mykv:fails_first(): ValueError: no database"),
        ("needs_redis:make", "importing it raised RuntimeError: set REDIS_URL"),
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


def test_a_factory_failing_a_reopen_is_a_violation_not_a_usage_error(project: Path) -> None:
    """Its first call worked: a later failure is the backend's, in each part that reopens.
    (Both parts find it at once; the 10 s only keep a slow contract pass from using up the time
    the restart part needs to run at all.)"""
    done = _check(
        "mykv:reopen_fails", "--parts", "contract,restart", "--seconds", "10", cwd=project
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "restart: the store reopens after a restart" in done.stderr
    reports = done.stderr.split("\n\n")
    for part in ("contract", "restart"):
        assert any(
            r.strip().startswith(f"{part}: ")
            and "raised TypeError: reopening is not supported" in r
            for r in reports
        ), done.stderr
    assert "Traceback" not in done.stderr


def test_a_backend_raising_system_exit_is_reported_not_obeyed(project: Path) -> None:
    done = _check("mykv:Exits", "--parts", "contract", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "raised BackendExit: raised SystemExit(7)" in done.stderr


def test_a_keyboard_interrupt_stops_the_check(project: Path) -> None:
    done = _check("mykv:Interrupts", "--parts", "contract", cwd=project)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.strip().endswith("pagekv check-backend: interrupted")
    assert "ok:" not in done.stdout


def test_an_interrupt_stops_a_check_waiting_for_a_call(project: Path) -> None:
    """The call runs on a thread of its own; the user's Ctrl-C still reaches the check."""
    command = [sys.executable, "-m", "pagekv", "check-backend", "mykv:Hangs", "--parts", "contract"]
    with subprocess.Popen(
        command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("pagekv check-backend: mykv:Hangs")
        time.sleep(0.3)  # into the clauses, most likely waiting for the hung list()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().endswith("pagekv check-backend: interrupted"), err


def test_a_call_that_never_returns_is_a_violation_and_the_process_ends(project: Path) -> None:
    done = _check("mykv:Hangs", "--parts", "contract,fuzz", "--call-timeout", "0.5", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "contract: every call returns" in done.stderr
    assert "did not return within 0.5 s" in done.stderr and "kv.list(" in done.stderr
    fuzz = next(line for line in done.stdout.splitlines() if line.startswith("fuzz"))
    assert "not checked" in fuzz and "not run" in fuzz


def test_a_thread_the_backend_leaves_running_does_not_keep_the_process_alive(
    project: Path,
) -> None:
    done = _check("mykv:leaks_a_thread", "--parts", "contract", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("ok: mykv:leaks_a_thread conforms")


def test_a_check_of_nothing_is_no_verdict(project: Path) -> None:
    done = _check("mykv:good", "--parts", "restart", cwd=project)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ok:" not in done.stdout
    assert "nothing checked: no part could check mykv:good" in done.stderr


@pytest.mark.parametrize("parts", ["", ",", " , "])
def test_no_parts_is_a_usage_error_naming_them(project: Path, parts: str) -> None:
    done = _check("mykv:good", "--parts", parts, cwd=project)
    assert done.returncode == 2
    names = "--parts names no part; name one or more of contract, concurrent, restart, fuzz"
    assert names in done.stderr


@pytest.mark.parametrize(
    ("out", "says"),
    [("nowhere/replay.json", "there is no directory nowhere"), (".", "is a directory")],
)
def test_an_out_that_cannot_be_written_is_refused_before_the_check(
    project: Path, out: str, says: str
) -> None:
    done = _check("mykv:good", "--out", out, cwd=project)
    assert done.returncode == 2
    assert f"--out {out}" in done.stderr and says in done.stderr
    assert done.stdout == ""


def test_a_compiled_store_class_is_given_its_limits(project: Path) -> None:
    """`MemoryStore` is compiled by mypyc: its signature reads `(limits=None, ..., /)`."""
    done = _check("pagekv.kv:MemoryStore", "--parts", "contract", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "limits= argument" not in done.stdout


def _replay_file(project: Path, factory: str, violations: object) -> str:
    data = {"factory": factory, "violations": violations}
    (project / "replay.json").write_text(json.dumps(data))
    return "replay.json"


def _entry(part: str, details: object) -> list[dict[str, object]]:
    return [{"part": part, "clause": "x", "details": details}]


@pytest.mark.parametrize(
    ("factory", "violations", "says"),
    [
        ("mykv:good", 5, "a replay file is an object with a factory"),
        ("mykv:good", [{"part": "contract", "clause": "x"}], "violation 0 must have a part"),
        ("mykv:good", _entry("contract", {}), "no clause None"),
        ("mykv:store", _entry("concurrent", {"program": {"threads": "zz"}}), "1 to 16 threads"),
        ("mykv:store", _entry("restart", {"scenario": {"kind": "boom"}}), "kind is clean or kill"),
        ("mykv:good", _entry("fuzz", {"steps": [{"type": "nope"}]}), "step is malformed"),
        ("mykv:good", _entry("fuzz", {"steps": [], "db_options": {"vfs": 1}}), "db_options"),
    ],
    ids=["violations", "entry", "clause", "program", "scenario", "fuzz-step", "db-options"],
)
def test_a_malformed_replay_file_is_a_usage_error(
    project: Path, factory: str, violations: object, says: str
) -> None:
    done = _check(factory, "--replay", _replay_file(project, factory, violations), cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stderr


def test_a_replay_file_cannot_call_other_methods_of_the_backend(project: Path) -> None:
    evil = {"method": "evil", "args": [], "kwargs": {"dict": []}}
    program = {"handles": "shared", "threads": [[{"op": evil, "fenced": False}]]}
    replay = _replay_file(project, "mykv:Spied", _entry("concurrent", {"program": program}))
    done = _check("mykv:Spied", "--replay", replay, cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'evil' is not an ActorKv method" in done.stderr
    assert not (project / "evil-called").exists()


REFUSED = (
    "opens a persistent store at a fixed place: a key put through one call's store is in the "
    "next one's, where each call must return a fresh, empty store; take `location` and open "
    'the store in that directory, e.g. open_kv(f"file://{location}")\n'
)


@pytest.mark.parametrize("spec", ["pagekv.kv:open_kv", "mykv:fixed_place", "mykv:shared_namespace"])
def test_a_factory_whose_calls_share_one_store_is_refused_in_one_line(
    project: Path, spec: str
) -> None:
    """`open_kv` opens `./.pagekv` at every call: each clause would see the others' keys (28
    "violations" of pagekv's own store) and the check would fill it. It is refused before any
    part runs, and writes nothing where the command runs, nor leaves a key in a fixed store."""
    before = {p.name for p in project.iterdir()}
    done = _check(spec, cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (done.stdout, done.stderr) == ("", f"pagekv check-backend: factory {spec} {REFUSED}")
    after = {p.name for p in project.iterdir()} - {"__pycache__"}
    assert after == before | ({"fixed-store"} if spec == "mykv:fixed_place" else set())
    if spec == "mykv:fixed_place":
        from pagekv.kv import open_kv

        store = open_kv((project / "fixed-store").as_uri(), create=False)
        try:
            assert store.namespace("pagekv-check").list() == []
        finally:
            store.close()
