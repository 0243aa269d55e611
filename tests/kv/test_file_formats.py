"""The `file:` store refuses what it cannot read, and never writes over it.

Every file carries a format version: a newer one is refused naming the file, the version found and
the versions this build reads; a damaged one is refused, or for the log read only as far as it
checks out; an older one (the fixture of format 3, schema version 3) is read and upgraded, and the
upgrade waits until no older process has the store open. `kv.shm` carries the store's identity
and the log header names the `kv.shm` in use, so processes that map a deleted or replaced one move
to the new one instead of writing over each other. A process stopped while it holds the flusher
lock is flushed around. Real processes where the item involves them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import apsw
import pytest
from crc32c import crc32c

from pagekv.kv import FileStore, FormatTooNew, KvUnavailable, StoreDamaged
from pagekv.kv.file.lock_holders import flock_holders

FIXTURES = Path(__file__).with_name("fixtures")
WAIT = 60.0
SLOT = 512


def _filled(directory: Path, entries: int = 100, log_bytes: int = 32 * 2**20) -> dict[bytes, bytes]:
    """A store whose live log epoch holds `entries` acknowledged writes; what `a` reads as."""
    written = {b"k%03d" % i: b"v%03d" % i for i in range(entries)}
    with FileStore(directory, log_bytes=log_bytes) as store:
        ns = store.namespace("a")
        for key, value in written.items():
            ns.put({key: value})
    return written


def _slots(directory: Path) -> bytes:
    return (directory / "kv.log").read_bytes()[: 2 * SLOT]


def _newest_slot(directory: Path) -> int:
    raw = _slots(directory)
    hseqs = [struct.unpack_from("<Q", raw, at + 8)[0] for at in (0, SLOT)]
    return 0 if hseqs[0] > hseqs[1] else 1


def _restamp(directory: Path, slot: int, magic: bytes, hseq: int | None = None) -> None:
    """Give header `slot` another magic (and `hseq`), with a CRC that checks out over the
    format-3 layout; with `hseq`, the newest slot's header is copied into `slot` first."""
    raw = bytearray(_slots(directory))
    source = _newest_slot(directory) if hseq is not None else slot
    header = raw[source * SLOT : source * SLOT + 69]
    header[:8] = magic
    if hseq is not None:
        header[8:16] = struct.pack("<Q", hseq)
    header[65:69] = struct.pack("<I", crc32c(bytes(header[:65])))
    with open(directory / "kv.log", "r+b") as f:
        f.seek(slot * SLOT)
        f.write(header)


@pytest.mark.parametrize("which", ["newest", "other"])
def test_a_newer_log_format_is_refused_and_the_log_left_as_it_was(
    tmp_path: Path, which: str
) -> None:
    written = _filled(tmp_path)
    newest = _newest_slot(tmp_path)
    _restamp(tmp_path, newest if which == "newest" else 1 - newest, b"pkvlog4\0")
    before = (tmp_path / "kv.log").read_bytes()
    with pytest.raises(FormatTooNew) as refused:
        FileStore(tmp_path)
    message = str(refused.value)
    assert str(tmp_path / "kv.log") in message and "\n" not in message
    assert "log format 4" in message and "reads log formats 1-3" in message
    assert (refused.value.kind, refused.value.found, refused.value.newest) == ("log", "4", 3)
    assert (tmp_path / "kv.log").read_bytes() == before, "nothing written over the log"
    _restamp(tmp_path, newest if which == "newest" else 1 - newest, b"pkvlog3\0")
    with FileStore(tmp_path) as store:
        assert dict(store.namespace("a").list()) == written


def test_a_newer_log_format_written_under_an_open_store_stops_it(tmp_path: Path) -> None:
    """A newer pagekv that upgraded the log under a running one: the running one refuses it
    at its next operation instead of taking the log for absent and starting over."""
    written = _filled(tmp_path)
    store = FileStore(tmp_path)
    ns = store.namespace("a")
    assert ns.get([b"k000"]) == [b"v000"]
    newest = _newest_slot(tmp_path)
    _restamp(tmp_path, 1 - newest, b"pkvlog4\0", hseq=10**6)  # newer than the newest
    before = (tmp_path / "kv.log").read_bytes()
    with pytest.raises(FormatTooNew):
        ns.put({b"new": b"x"})
    with pytest.raises(FormatTooNew):
        ns.get([b"k000"])
    store.close()
    assert (tmp_path / "kv.log").read_bytes() == before
    _restamp(tmp_path, 1 - newest, b"pkvlog3\0")  # the bytes of a valid, newer header again
    with FileStore(tmp_path) as reopened:
        assert dict(reopened.namespace("a").list()) == written


def test_both_header_slots_damaged_is_refused_not_started_over(tmp_path: Path) -> None:
    _filled(tmp_path)
    with open(tmp_path / "kv.log", "r+b") as f:
        for slot in (0, 1):
            f.seek(slot * SLOT + 20)
            f.write(b"\xde\xad")
    before = (tmp_path / "kv.log").read_bytes()
    with pytest.raises(StoreDamaged, match="both header slots are damaged"):
        FileStore(tmp_path)
    assert (tmp_path / "kv.log").read_bytes() == before


def test_a_newer_header_damaged_after_its_records_is_refused(tmp_path: Path) -> None:
    """The newest header starts an epoch that has records; damage it (not a torn write: that
    can only happen before the epoch's first record) and the other slot names a folded epoch.
    Falling back to it would drop the new epoch's records, so the store refuses."""
    with FileStore(tmp_path, log_bytes=16 * 1024) as store:
        ns = store.namespace("a")
        assert store.epoch.header is not None
        first = store.epoch.header.epoch
        for i in range(200):
            ns.put({b"k%03d" % i: b"x" * 200})
            if store.epoch.header.epoch > first and store.log_used > 4096 + 1024:
                break
        else:
            raise AssertionError("the log never folded")
    with open(tmp_path / "kv.log", "r+b") as f:
        f.seek(_newest_slot(tmp_path) * SLOT + 30)  # inside the salt
        f.write(b"\x01\x02")
    with pytest.raises(StoreDamaged, match="is damaged, and the records after the headers"):
        FileStore(tmp_path, log_bytes=16 * 1024)


def test_a_log_of_another_store_is_refused(tmp_path: Path) -> None:
    _filled(tmp_path / "one", 5)
    _filled(tmp_path / "two", 7)
    shutil.copy(tmp_path / "one" / "kv.log", tmp_path / "two" / "kv.log")
    with pytest.raises(StoreDamaged, match="belongs to another store"):
        FileStore(tmp_path / "two")


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    FileStore(tmp_path).close()
    db = apsw.Connection(str(tmp_path / "kv.sqlite3"))
    db.execute("PRAGMA user_version = 5")
    db.close()
    with pytest.raises(FormatTooNew, match=r"kv.sqlite3: schema format 5; .* formats 1-4"):
        FileStore(tmp_path)


def test_a_newer_shm_format_is_refused(tmp_path: Path) -> None:
    written = _filled(tmp_path, 3)
    with open(tmp_path / "kv.shm", "r+b") as f:
        f.write(b"pkvshm2\0")
    with pytest.raises(FormatTooNew, match=r"kv.shm: kv.shm format 2; this pagekv reads kv.shm"):
        FileStore(tmp_path)
    with open(tmp_path / "kv.shm", "r+b") as f:
        f.write(bytes(8))  # as if new: rebuilt
    with FileStore(tmp_path) as store:
        assert dict(store.namespace("a").list()) == written


@pytest.mark.parametrize("kind", ["garbage", "another-store", "empty", "missing"])
def test_a_foreign_or_overwritten_shm_is_rebuilt(tmp_path: Path, kind: str) -> None:
    written = _filled(tmp_path / "kv", 20)
    shm = tmp_path / "kv" / "kv.shm"
    if kind == "garbage":
        shm.write_bytes(os.urandom(4096))
    elif kind == "another-store":
        _filled(tmp_path / "other", 1)
        shutil.copy(tmp_path / "other" / "kv.shm", shm)
    elif kind == "empty":
        shm.write_bytes(b"")
    else:
        shm.unlink()
    with FileStore(tmp_path / "kv") as store:
        ns = store.namespace("a")
        assert dict(ns.list()) == written
        ns.put({b"after": b"rebuilt"})
    assert shm.read_bytes()[:8] == b"pkvshm1\0"
    with FileStore(tmp_path / "kv") as store:
        assert store.namespace("a").get([b"after"]) == [b"rebuilt"]


def test_a_shm_overwritten_under_open_stores_is_rebuilt_and_they_go_on(tmp_path: Path) -> None:
    one, two = FileStore(tmp_path), FileStore(tmp_path)
    a, b = one.namespace("a"), two.namespace("b")
    a.put({b"k": b"1"})
    (tmp_path / "kv.shm").write_bytes(os.urandom(4096))
    b.put({b"k": b"2"})
    a.put({b"k2": b"3"})
    assert two.namespace("a").get([b"k2"]) == [b"3"] and one.namespace("b").get([b"k"]) == [b"2"]
    one.close()
    two.close()
    with FileStore(tmp_path) as store:
        assert dict(store.namespace("a").list()) == {b"k": b"1", b"k2": b"3"}


# -- the previous format ------------------------------------------------------------------------


def _format_3_store(directory: Path) -> dict[str, dict[str, object]]:
    """`fixtures/file_store_v3.tar.gz` (made by `make_file_store_v3.py` with the pagekv of that
    format) unpacked into `directory`; what its namespaces read as."""
    directory.mkdir()
    with tarfile.open(FIXTURES / "file_store_v3.tar.gz") as tar:
        tar.extractall(directory, filter="data")
    expected: dict[str, dict[str, object]] = json.loads((directory / "expected.json").read_text())
    (directory / "expected.json").unlink()
    return expected


def _reads_as(store: FileStore, expected: dict[str, dict[str, object]]) -> None:
    assert store.actor_ids() == sorted(expected)
    for name, want in expected.items():
        ns = store.namespace(name)
        got = {k.hex(): v.hex() for k, v in ns.list()}
        assert (ns.generation(), ns.used_bytes(), got) == (
            want["generation"],
            want["used"],
            want["entries"],
        ), name


def _user_version(directory: Path) -> int:
    version: int = apsw.Connection(str(directory / "kv.sqlite3")).execute("PRAGMA user_version").get
    return version


def test_a_store_of_the_previous_format_is_read_and_upgraded(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    expected = _format_3_store(directory)
    assert _user_version(directory) == 3 and _slots(directory).count(b"pkvlog2\0") >= 1
    with FileStore(directory, log_bytes=64 * 1024) as store:
        _reads_as(store, expected)
        assert store.epoch.header is not None and store.epoch.header.format == 2  # read as it is
        store.namespace("b").put({b"after": b"the upgrade"}, fence=2)
        assert store.epoch.header.format == 3, "the old epoch was folded before the write"
    assert _user_version(directory) == 4, "older builds refuse the store from now on"
    assert _slots(directory)[:8] == b"pkvlog3\0" or _slots(directory)[SLOT : SLOT + 8] == (
        b"pkvlog3\0"
    )
    assert (directory / "kv.shm").read_bytes()[:8] == b"pkvshm1\0"
    expected["b"]["entries"][b"after".hex()] = b"the upgrade".hex()  # type: ignore[index]
    expected["b"]["used"] += len(b"after") + len(b"the upgrade")  # type: ignore[operator]
    with FileStore(directory) as store:
        _reads_as(store, expected)


def test_an_upgrade_waits_until_no_other_process_has_the_store_open(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    expected = _format_3_store(directory)
    hold = "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(directory / "kv.log")])
    try:
        deadline = time.monotonic() + WAIT
        while not any(
            os.path.realpath(f"/proc/{holder.pid}/fd/{fd}") == str(directory / "kv.log")
            for fd in os.listdir(f"/proc/{holder.pid}/fd")
        ):
            assert time.monotonic() < deadline, "the holder never opened the log"
            time.sleep(0.01)
        says = rf"while other processes have it open: pid {holder.pid} \(python"
        with pytest.raises(KvUnavailable, match=says):
            FileStore(directory)
        assert _user_version(directory) == 3, "nothing was changed"
    finally:
        holder.kill()
        holder.wait()
    with FileStore(directory) as store:
        _reads_as(store, expected)
    assert _user_version(directory) == 4


# -- kv.shm deleted or replaced under running processes ----------------------------------------

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pagekv.kv import FileStore
    store = FileStore(sys.argv[1])
    ns = store.namespace(sys.argv[2])
    go, first = sys.argv[3], sys.argv[2] == "a"
    for i in range(int(sys.argv[4])):
        ns.put({b"k%05d" % i: b"v" * 50})
        print(i, flush=True)
        if first and i == 20:  # the parent deletes or replaces kv.shm, then starts b
            while not os.path.exists(go):
                time.sleep(0.001)
        elif not first and i == 0:
            open(go, "w").close()  # b has the store open: a goes on beside it
        time.sleep(0.0005)  # both write for a while, interleaved
    store.close()
    """
)


@pytest.mark.parametrize("how", ["deleted", "replaced-by-a-copy"])
def test_processes_on_both_sides_of_a_deleted_shm_lose_nothing(tmp_path: Path, how: str) -> None:
    """Writer A maps `kv.shm`; it is deleted (or a copy of it moved over it, which no content
    check can tell apart); writer B opens the store and maps the new one. Both go on writing:
    every acknowledged write of both must be there after a reopen."""
    directory, go = tmp_path / "kv", tmp_path / "go"
    FileStore(directory).close()
    count = 400

    def writer(name: str) -> subprocess.Popen[str]:
        args = [str(directory), name, str(go), str(count)]
        return subprocess.Popen(
            [sys.executable, "-c", _WRITER, *args], stdout=subprocess.PIPE, text=True
        )

    a = writer("a")
    assert a.stdout is not None
    for _ in range(21):
        a.stdout.readline()
    shm = directory / "kv.shm"
    if how == "deleted":
        shm.unlink()
    else:
        shutil.copy(shm, tmp_path / "copy")
        os.replace(tmp_path / "copy", shm)
    b = writer("b")
    out_b, _ = b.communicate(timeout=WAIT)
    out_a, _ = a.communicate(timeout=WAIT)
    assert a.returncode == 0 and b.returncode == 0
    acked_a = 21 + len(out_a.split())
    acked_b = len(out_b.split())
    assert acked_a == acked_b == count
    with FileStore(directory) as store:
        for name, acked in (("a", acked_a), ("b", acked_b)):
            keys = [k for k, _ in store.namespace(name).list()]
            assert keys == [b"k%05d" % i for i in range(acked)], f"{name} lost writes"


# -- a flusher stopped while it holds the flusher lock -----------------------------------------

_STOPPED_FLUSHER = textwrap.dedent(
    """
    import sys, threading
    from pagekv.kv import FileStore
    store = FileStore(sys.argv[1])
    def write(t):
        ns = store.namespace(f"victim-{t}")
        while True:
            ns.put({b"k": b"v" * 50})
    for t in range(4):  # several threads, so that it flushes for a group under the lock
        threading.Thread(target=write, args=(t,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
    """
)
_GROUP_WRITER = textwrap.dedent(
    """
    import sys, threading
    from pagekv.kv import FileStore
    store = FileStore(sys.argv[1], lock_timeout=600)
    before = store.flush_counts()
    def write(t):
        ns = store.namespace(f"writer-{t}")
        for i in range(50):
            ns.put({b"k%03d" % i: b"v"})
    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(store.flush_counts().flushes - before.flushes, flush=True)
    """
)


def _holds_flock(pid: int, path: Path) -> bool:
    return pid in flock_holders(path)


def test_writers_are_flushed_around_a_process_stopped_holding_the_flusher_lock(
    tmp_path: Path,
) -> None:
    """A writer process is SIGSTOPped at a moment it holds the host's flusher lock, and stays
    stopped. Another process's writers, which share flushes and would wait for it, flush around
    it: their 200 writes all complete while it is still stopped holding the lock (they wait at
    most `lock_timeout`, 600 s here, for the log's own lock, which it does not hold)."""
    FileStore(tmp_path).close()
    victim = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_FLUSHER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline() == "ready\n"
        shm, log = tmp_path / "kv.shm", tmp_path / "kv.log"
        deadline = time.monotonic() + WAIT
        while True:
            assert time.monotonic() < deadline, "never caught it holding the flusher lock"
            os.kill(victim.pid, signal.SIGSTOP)
            time.sleep(0.002)
            if _holds_flock(victim.pid, shm) and not _holds_flock(victim.pid, log):
                break  # the flusher's lock, not the log's: `lock_timeout` bounds waits for that
            os.kill(victim.pid, signal.SIGCONT)
            time.sleep(0.001)
        writer = subprocess.run(
            [sys.executable, "-c", _GROUP_WRITER, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert writer.returncode == 0, writer.stderr
        assert _holds_flock(victim.pid, shm), "the victim held the flusher lock throughout"
        with FileStore(tmp_path) as store:
            for t in range(4):
                assert len(store.namespace(f"writer-{t}").list()) == 50
    finally:
        victim.kill()
        victim.wait()
