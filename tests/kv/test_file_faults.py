"""OS-level faults of the `file://` store, in real child processes.

The children are this file run as a script (`python test_file_faults.py ROLE ...`), each printing
one JSON document of what it saw; the parent checks it and then reopens the store.

- Short writes: a child lowers `RLIMIT_FSIZE` (with `SIGXFSZ` ignored) so that only part of the
  next write to `kv.log` fits, as on a full disk or a hit quota, then writes. The write must fail
  (never be acknowledged), name the log and the errno, and the reopened store must hold every
  acknowledged batch and not the failed one. Each case also proves that the short write happened:
  the log's record, extension or header write is the one refused.
- A stopped lock holder: a child stops itself (SIGSTOP) inside a write section, holding the
  exclusive `flock` on `kv.log`. Every other process's open, read and write must give up after
  the store's `lock_timeout` with `KvUnavailable` naming the directory and the holder's pid, and
  work again once the holder is continued.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pagekv.kv import FileStore, KvUnavailable, check_kv_url, open_kv

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_child(*args: str) -> dict[str, Any]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _outcome(call: Any) -> dict[str, str]:
    try:
        call()
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": ""}


def _limit_file_size(size: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


def _lift_file_size_limit() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


# --- the children -------------------------------------------------------------------------------


def _child_short_record(directory: str, room: int, direct: bool) -> dict[str, Any]:
    """Acknowledge three batches, then leave `room` bytes for the next record and write it."""
    store = FileStore(directory)
    if not direct and store.log._direct is not None:
        os.close(store.log._direct)
        store.log._direct = None
    ns = store.namespace("a")
    for i in range(3):
        ns.write(put={b"k%d" % i: bytes([i]) * 100})
    offset = store.epoch.offset
    _limit_file_size(offset + room)
    failed = _outcome(lambda: ns.write(put={b"lost": b"x" * 5000}))
    after = _outcome(lambda: ns.get([b"k0"]))
    return {
        "direct": store.log._direct is not None,
        "size": os.path.getsize(Path(directory) / "kv.log"),
        "offset": offset,
        "write": failed,
        "after": after,
    }


def _child_short_extension(directory: str) -> dict[str, Any]:
    """Fill the preallocated log, then leave 1,000 bytes for the zeros of its next extension."""
    store = FileStore(directory)
    ns = store.namespace("a")
    log = Path(directory) / "kv.log"
    acked = 0
    while acked == 0 or store.epoch.offset + 8192 <= os.path.getsize(log):
        ns.write(put={b"k%05d" % acked: b"v" * 8000})
        acked += 1
    size = os.path.getsize(log)
    _limit_file_size(size + 1000)
    failed = _outcome(lambda: ns.write(put={b"lost": b"x" * 8000}))
    grown = os.path.getsize(log)
    _lift_file_size_limit()
    later = _outcome(lambda: ns.write(put={b"later": b"y" * 100}))
    return {"acked": acked, "size": size, "grown": grown, "write": failed, "later": later}


def _child_short_header(directory: str) -> dict[str, Any]:
    """Fold the log by hand and stop before the next epoch's header, as a folder that died there
    would; then leave room for 8 bytes of that header (slot 1, at byte 512) and write."""
    store = FileStore(directory)
    ns = store.namespace("a")
    for i in range(3):
        ns.write(put={b"k%d" % i: b"v" * 600})
    with store.sections.exclusive:
        store.appender.fold()
    assert store.epoch.header is not None and store.epoch.header.sealed
    assert (store.epoch.header.hseq + 1) % 2 == 1, "the next header goes to slot 0"
    _limit_file_size(512 + 8)
    failed = _outcome(lambda: ns.write(put={b"lost": b"v" * 600}))
    after = _outcome(lambda: ns.get([b"k0"]))
    return {"write": failed, "after": after}


def _child_stopped_holder(directory: str) -> None:
    """Write once, then stop inside the next write's section, holding the exclusive lock."""
    store = FileStore(directory)
    ns = store.namespace("a")
    ns.put({b"before": b"1"})
    with store.sections.exclusive:
        print(json.dumps({"pid": os.getpid()}), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    ns.put({b"after-continue": b"1"})
    print(json.dumps({"done": True}), flush=True)


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("room", [600, 1024])
@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "pwrite"])
def test_a_short_record_write_is_never_acknowledged(
    tmp_path: Path, room: int, direct: bool
) -> None:
    seen = _run_child("short-record", str(tmp_path), str(room), str(int(direct)))
    if direct and not seen["direct"] and room == 1024:
        pytest.skip(f"{tmp_path} does not support O_DIRECT")
    assert seen["size"] > seen["offset"] + room, "the record's blocks were not preallocated"
    assert seen["write"]["error"] == "KvIndeterminate", seen
    assert "EFBIG (File too large)" in seen["write"]["message"]
    assert str(tmp_path / "kv.log") in seen["write"]["message"]
    assert seen["after"]["error"] == "KvUnavailable" and "reopen" in seen["after"]["message"]
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    assert dict(ns.list()) == {b"k%d" % i: bytes([i]) * 100 for i in range(3)}
    assert ns.used_bytes() == 3 * 102
    ns.put({b"next": b"n"})  # lands where the torn record was
    store.close()
    assert dict(FileStore(tmp_path).namespace("a").list())[b"next"] == b"n"


def test_a_short_extension_of_the_log_writes_nothing_and_breaks_nothing(tmp_path: Path) -> None:
    seen = _run_child("short-extension", str(tmp_path))
    assert seen["grown"] == seen["size"] + 1000, "the extension was not cut short"
    assert seen["write"]["error"] == "KvUnavailable", seen
    assert "cannot grow" in seen["write"]["message"]
    assert "EFBIG" in seen["write"]["message"]
    assert seen["later"] == {"error": ""}, "the store stayed broken after a refused extension"
    ns = FileStore(tmp_path).namespace("a")
    keys = {k for k, _ in ns.list()}
    assert keys == {b"k%05d" % i for i in range(seen["acked"])} | {b"later"}


def test_a_short_header_write_fails_the_write_and_the_other_slot_survives(tmp_path: Path) -> None:
    seen = _run_child("short-header", str(tmp_path))
    assert seen["write"]["error"] == "KvUnavailable", seen
    assert "header write" in seen["write"]["message"] and "EFBIG" in seen["write"]["message"]
    assert seen["after"]["error"] == "KvUnavailable" and "reopen" in seen["after"]["message"]
    ns = FileStore(tmp_path).namespace("a")
    assert dict(ns.list()) == {b"k%d" % i: b"v" * 600 for i in range(3)}
    ns.put({b"next": b"n"})  # a new epoch starts over the torn header
    assert len(ns.list()) == 4


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never stopped")


def test_a_stopped_lock_holder_makes_others_fail_in_time_not_hang(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ready = FileStore(directory)  # opened before the holder stops: reads and writes must fail
    ns = ready.namespace("a")
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    holder = subprocess.Popen(
        [sys.executable, __file__, "stopped-holder", str(directory)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=REPO_ROOT,
    )
    try:
        assert holder.stdout is not None
        pid = json.loads(holder.stdout.readline())["pid"]
        _wait_stopped(pid)
        ready.lock_timeout = 0.5
        calls = {
            "open": lambda: open_kv(f"file:{directory}?lock_timeout=0.5"),
            "get": lambda: ns.get([b"before"]),
            "write": lambda: ns.put({b"lost": b"x"}),
            "takeover": ns.takeover,
        }
        for what, call in calls.items():
            started = time.monotonic()
            with pytest.raises(KvUnavailable) as refused:
                call()
            waited = time.monotonic() - started
            assert 0.5 <= waited < 10, f"{what} waited {waited:.2f} s"
            message = str(refused.value)
            assert str(directory) in message and f"pid {pid} (stopped)" in message, message
            assert "nothing was done" in message, message
        os.kill(pid, signal.SIGCONT)
        assert json.loads(holder.stdout.readline()) == {"done": True}
        assert holder.wait(timeout=30) == 0
    finally:
        holder.kill()
        holder.wait()
    assert dict(ns.list()) == {b"before": b"1", b"after-continue": b"1"}
    assert ns.generation() == 0, "a refused takeover was applied"
    ready.close()


def test_a_thread_holding_the_store_delays_another_only_up_to_the_timeout(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path, lock_timeout=0.3)
    ns = store.namespace("a")
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.sections.exclusive:
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        with pytest.raises(KvUnavailable, match="another thread of this process"):
            ns.put({b"k": b"v"})
        assert 0.3 <= time.monotonic() - started < 10
    finally:
        release.set()
        holder.join()
    ns.put({b"k": b"v"})
    assert ns.list() == [(b"k", b"v")]


@pytest.mark.parametrize("value", ["1e10", "1e300", "1e-9"])
def test_any_positive_lock_timeout_opens(tmp_path: Path, value: str) -> None:
    """SQLite's busy timeout is an int of milliseconds: a longer wait is capped, not an error."""
    store = open_kv(f"file:{tmp_path}?lock_timeout={value}")
    store.namespace("a").put({b"k": b"v"})
    store.close()


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf", "nan"])
def test_a_bad_lock_timeout_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        check_kv_url(f"file:{tmp_path}?lock_timeout={value}")
    assert not any(tmp_path.iterdir())


if __name__ == "__main__":
    role, *argv = sys.argv[1:]
    if role == "stopped-holder":
        _child_stopped_holder(argv[0])
        raise SystemExit(0)
    if role == "short-record":
        result = _child_short_record(argv[0], int(argv[1]), argv[2] == "1")
    elif role == "short-extension":
        result = _child_short_extension(argv[0])
    elif role == "short-header":
        result = _child_short_header(argv[0])
    else:
        raise SystemExit(f"unknown role {role!r}")
    print(json.dumps(result))
