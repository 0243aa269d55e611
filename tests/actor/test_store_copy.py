"""`copy_store` (and `pagekv copy`): every actor and the registry's index into another store,
file: to a real PostgreSQL and back, verified; resumed after a SIGKILL; a served source
refused, or copied live with the changed actors reported; a corrupted copy caught."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from transfer_defs import fill, order

from pagekv.actor import Registry
from pagekv.actor.directory.records import REGISTRY_NAMESPACE, list_actors
from pagekv.actor.user_kv import USER_PREFIX
from pagekv.kv import KvStore, MemoryStore, open_kv
from pagekv.transfer import CopyMismatch, CopyProgress, CopyRefused, copy_store
from pagekv.transfer.checksum import namespace_checksum
from pagekv.transfer.store_copy import COPY_MARKER, COPY_PREFIX
from pagekv.vfs import open_database

ROOT = Path(__file__).resolve().parents[2]


def _populate(store: KvStore, keys: list[str], *, wakes: int = 1) -> None:
    """`order` actors (each woken `wakes` times, so its generation is that high), one due to
    run a schedule a second from now, and a namespace written without the registry."""

    async def run() -> None:
        for wake in range(wakes):
            async with Registry([order], kv=store).run() as client:
                for key in keys:
                    if wake == 0:
                        await fill(client, key, items=2)
                    else:
                        await client.get("order", key).add(f"wake-{wake}")
        async with Registry([order], kv=store).run() as client:
            await client.get("order", keys[0]).remind(1.0)

    anyio.run(run)
    with open_database(store.namespace("notes/raw")) as db:
        db.execute("CREATE TABLE notes(v)")
        db.execute("INSERT INTO notes VALUES ('written without a registry')")


def _listing(store: KvStore) -> list[tuple[str, str, float]]:
    index = store.namespace(REGISTRY_NAMESPACE)
    return [(r.name, r.key, r.created) for r in list_actors(index, limit=1000)]


def _checksums(store: KvStore) -> dict[str, str]:
    names = [n for n in store.actor_ids() if n != REGISTRY_NAMESPACE]  # type: ignore[attr-defined]
    return {n: namespace_checksum(store.namespace(n)) for n in names}


def _no_copy_entries(store: KvStore) -> None:
    index = store.namespace(REGISTRY_NAMESPACE)
    assert index.get([COPY_MARKER]) == [None] and index.list(prefix=COPY_PREFIX) == []


def test_file_to_postgres_and_back_verified(tmp_path: Path, postgres_server: Any) -> None:
    keys = [f"o-{i}" for i in range(6)]
    with open_kv((tmp_path / "src").resolve().as_uri()) as source:
        _populate(source, keys, wakes=3)
        assert source.namespace("order/o-1").generation() >= 3, "values to restamp"
        expected, listing = _checksums(source), _listing(source)
        with open_kv(postgres_server.store_url(str(tmp_path / "pg"))) as pg:
            seen: list[CopyProgress] = []
            result = copy_store(source, pg, progress=seen.append)
            assert (result.copied, result.skipped, result.verified) == (7, 0, 7)
            assert result.changed == [] and result.snapshots == []
            assert [p.done for p in seen if p.phase == "copy"] == list(range(1, 8))
            assert _checksums(pg) == expected and _listing(pg) == listing
            _no_copy_entries(pg)
            with open_kv((tmp_path / "back").resolve().as_uri()) as back:
                again = copy_store(pg, back)
                assert (again.copied, again.verified) == (7, 7)
                assert _checksums(back) == expected and _listing(back) == listing

                async def serve() -> dict[str, Any]:
                    async with Registry([order], kv=back).run() as client:
                        handle = client.get("order", "o-0")
                        with anyio.fail_after(10):
                            while client.registry.metrics().get("wakes", 0) == 0:
                                await anyio.sleep(0.05)  # the schedule's wake, no call
                        with anyio.fail_after(10):
                            while "reminder" not in (view := await handle.view())["items"]:
                                await anyio.sleep(0.05)
                        return view

                view = anyio.run(serve)
    assert view["items"] == ["item-0", "item-1", "wake-1", "wake-2", "reminder"]


def _await_copied(
    child: subprocess.Popen[Any], directory: Path, target_url: str, at_least: int, before: str
) -> int:
    """Wait until the running copy `child` has copied `at_least` namespaces (its progress
    entries in the destination); how many it had then."""
    deadline = time.monotonic() + 60
    while True:
        assert child.poll() is None, f"the copy ended before {before}"
        assert time.monotonic() < deadline, "the copy copied nothing in 60 s"
        if directory.exists():
            with open_kv(target_url) as target:
                done = len(target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX))
            if done >= at_least:
                return done
        time.sleep(0.01)


def test_a_sigkilled_copy_resumes_where_it_stopped(tmp_path: Path) -> None:
    keys = [f"k-{i:02}" for i in range(40)]
    source_url = (tmp_path / "src").resolve().as_uri()
    target_url = (tmp_path / "dst").resolve().as_uri()
    with open_kv(source_url) as source:
        _populate(source, keys)
        expected = _checksums(source)
    slow = f"{target_url}?flush_delay_ms=5"  # every durable write 5 ms: time to kill it
    command = [sys.executable, "-m", "pagekv", "copy", "--from", source_url, "--to", slow]
    child = subprocess.Popen([*command, "--threads", "1"], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        _await_copied(child, tmp_path / "dst", target_url, 5, "the kill")
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with open_kv(target_url) as target:
        copied_before = len(target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX))
    assert 5 <= copied_before < len(keys) + 1, "the kill landed mid-copy"
    resumed = subprocess.run([*command[:-1], target_url], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{copied_before} copied by an earlier run; 41 verified" in resumed.stdout
    assert "pagekv copy: verify 41/41 namespaces" in resumed.stderr
    with open_kv(target_url) as target:
        assert _checksums(target) == expected
        assert [k for _, k, _ in _listing(target)] == keys
        _no_copy_entries(target)


def test_ctrl_c_stops_a_copy_promptly_and_it_resumes(tmp_path: Path) -> None:
    """A SIGINT mid-copy ends it once the namespaces under way are copied: 130, the message, no
    traceback. (It went on to copy the whole phase first: leaving the thread pool waited for
    every namespace submitted, an hour of Ctrl-C ignored on a large store.)"""
    keys = [f"k-{i:02}" for i in range(40)]
    source_url = (tmp_path / "src").resolve().as_uri()
    target_url = (tmp_path / "dst").resolve().as_uri()
    with open_kv(source_url) as source:
        _populate(source, keys)
    slow = f"{target_url}?flush_delay_ms=5"
    command = [sys.executable, "-m", "pagekv", "copy", "--from", source_url, "--to", slow]
    with subprocess.Popen(
        [*command, "--threads", "2"], cwd=ROOT, stderr=subprocess.PIPE, text=True
    ) as child:
        copied_at_signal = _await_copied(child, tmp_path / "dst", target_url, 5, "the interrupt")
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert err.strip().endswith("pagekv copy: interrupted; run it again to go on"), err
    assert "Traceback" not in err
    with open_kv(target_url) as target:
        copied = len(target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX))
    assert copied <= copied_at_signal + 2 + 2, "only those under way (2 threads) were finished"
    resumed = subprocess.run([*command[:-1], target_url], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{copied} copied by an earlier run; 41 verified" in resumed.stdout


@pytest.mark.anyio
async def test_a_served_source_is_refused_and_a_live_copy_reports_what_changed() -> None:
    source, target = MemoryStore(), MemoryStore()
    async with Registry([order], kv=source).run() as client:
        for key in ("busy", "calm-1", "calm-2"):
            await fill(client, key, items=1)
        with pytest.raises(CopyRefused, match="being served by 1 registry"):
            copy_store(source, target)
        assert target.actor_ids() == [], "refused before the destination was touched"
        wrote = threading.Event()
        copied = threading.Event()
        stop = False

        async def busy() -> None:
            while not stop:
                await client.get("order", "busy").add("more")
                wrote.set()
                await anyio.sleep(0)

        def progress(p: CopyProgress) -> None:
            if p.phase == "copy" and p.done == p.total:  # a commit after every copy
                wrote.clear()
                copied.set()
                assert wrote.wait(10)

        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            result = await anyio.to_thread.run_sync(
                lambda: copy_store(source, target, allow_live=True, progress=progress)
            )
            stop = True
    assert copied.is_set() and result.changed == ["order/busy"]
    assert result.verified == 3

    async def view() -> dict[str, Any]:
        async with Registry([order], kv=target).run() as served:
            return await served.get("order", "busy").view()

    state = await view()
    assert state["state"]["lines"] == len(state["items"]), "one committed state"
    assert len(target.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX)) == 3


def test_a_destination_that_is_not_empty_is_refused() -> None:
    source, target = MemoryStore(), MemoryStore()
    _populate(source, ["a"])
    _populate(target, ["b"])
    before = target.namespace(REGISTRY_NAMESPACE).list()
    with pytest.raises(CopyRefused, match="not empty"):
        copy_store(source, target)
    assert target.namespace(REGISTRY_NAMESPACE).list() == before


class _Corrupting:
    """A store whose namespace `victim` flips a byte of every `ctx.kv` value written to it
    (fault injection: a destination that loses data silently)."""

    def __init__(self, inner: MemoryStore, victim: str) -> None:
        self.inner, self.victim, self.fired = inner, victim, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def namespace(self, name: str) -> Any:
        kv = self.inner.namespace(name)
        return _CorruptingKv(kv, self) if name == self.victim else kv


class _CorruptingKv:
    def __init__(self, inner: Any, store: _Corrupting) -> None:
        self.inner, self.store = inner, store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, *, put: Any = (), delete: Any = (), fence: Any = None) -> None:
        changed = {}
        for key, value in dict(put).items():
            if key.startswith(USER_PREFIX):
                value = bytes([value[0] ^ 1]) + value[1:]
                self.store.fired += 1
            changed[key] = value
        self.inner.write(put=changed, delete=delete, fence=fence)


def test_verification_catches_a_corrupted_copy_and_the_next_run_copies_it_again() -> None:
    source, inner = MemoryStore(), MemoryStore()
    _populate(source, ["a", "b"])
    corrupting = _Corrupting(inner, "order/b")
    with pytest.raises(CopyMismatch) as caught:
        copy_store(source, corrupting)  # type: ignore[arg-type]
    assert corrupting.fired > 0 and caught.value.namespaces == ["order/b"]
    progress = inner.namespace(REGISTRY_NAMESPACE).list(prefix=COPY_PREFIX)
    assert sorted(key for key, _ in progress) == [b"copy/notes/raw", b"copy/order/a"]
    again = copy_store(source, inner)
    assert (again.copied, again.skipped, again.verified) == (1, 2, 3)
    assert _checksums(inner) == _checksums(source)


def _kill_when(child: subprocess.Popen[bytes], target_url: str, ready: Any) -> None:
    """SIGKILL the copy `child` once `ready(target)` holds on its destination (polled)."""
    try:
        deadline = time.monotonic() + 60
        while True:
            assert child.poll() is None, "the copy ended before the kill"
            assert time.monotonic() < deadline, "the copy did not get there in 60 s"
            if Path(target_url.removeprefix("file://")).exists():
                with open_kv(target_url) as target:
                    if ready(target):
                        break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_copy_after_another_sources_interrupted_copy_emptied_a_namespace_succeeds(
    tmp_path: Path,
) -> None:
    """A copy from A is SIGKILLed after it copied `order/k-00`; a copy from B (whose
    `order/k-00` differs) is SIGKILLed after it emptied that namespace and while it writes B's
    entries there. The copy from A run next skipped `order/k-00` by A's progress entry, still
    there, and failed its check (`CopyMismatch`, exit 1; the run after succeeded): it must
    copy it again and succeed at once."""
    keys = [f"k-{i:02}" for i in range(30)]
    first, second = tmp_path / "a", tmp_path / "b"
    target_url = (tmp_path / "dst").resolve().as_uri()
    with open_kv(first.resolve().as_uri()) as a:
        _populate(a, keys)
        expected = _checksums(a)
        first_bytes = a.namespace("order/k-00").used_bytes()
    with open_kv(second.resolve().as_uri()) as b:
        _populate(b, keys)
        big = b.namespace("order/k-00")
        for start in range(0, 20_000, 128):  # ~4 MiB in 157 batches: time to kill it mid-way
            big.put([(USER_PREFIX + b"%06d" % n, b"v" * 200) for n in range(start, start + 128)])

    def copy(source: Path, *, slow: bool) -> list[str]:
        to = f"{target_url}?flush_delay_ms=5" if slow else target_url
        source_url = source.resolve().as_uri()
        return [
            sys.executable,
            "-m",
            "pagekv",
            "copy",
            "--from",
            source_url,
            "--to",
            to,
            "--threads",
            "1",
        ]

    progress = COPY_PREFIX + b"order/k-00"

    def copied_first(target: KvStore) -> bool:
        return target.namespace(REGISTRY_NAMESPACE).get([progress])[0] is not None

    def writing_second(target: KvStore) -> bool:
        return target.namespace("order/k-00").used_bytes() > first_bytes + 2**20

    _kill_when(subprocess.Popen(copy(first, slow=True), cwd=ROOT), target_url, copied_first)
    _kill_when(subprocess.Popen(copy(second, slow=True), cwd=ROOT), target_url, writing_second)
    with open_kv(target_url) as target:
        assert target.namespace(REGISTRY_NAMESPACE).get([progress]) == [None], "forgotten first"
    again = subprocess.run(copy(first, slow=False), cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    with open_kv(target_url) as target:
        assert _checksums(target) == expected
        _no_copy_entries(target)
