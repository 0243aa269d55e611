"""`pagekv serve --workers N` as real processes on loopback: one port served by workers that
each own the actors they woke, a graceful stop by SIGTERM, a killed worker restarted, and the
fast failure of an advertise URL that does not reach its process while another shares the
store."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterable
from pathlib import Path

import anyio
import pytest
from server_helpers import TOKEN
from test_cli import APP, ServeProcess, pagekv, served_process

from pagekv.client import HttpClient

pytestmark = pytest.mark.anyio
KEYS = [f"k{n}" for n in range(24)]


async def owners(url: str, keys: Iterable[str]) -> dict[str, int]:
    """The pid of the process serving each key's actor, asked at once, each on a client (and
    so a connection) of its own, so that every worker accepts some of them. The client retries
    the answers that say the call did not run (an owner that just died is unreachable)."""
    found: dict[str, int] = {}

    async def ask(key: str) -> None:
        async with HttpClient(url, token=TOKEN) as client:
            found[key] = await client.get_or_create("ledger", key).pid()

    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(ask, key)
    return found


async def all_listening(server: ServeProcess, workers: int) -> str:
    """The public URL once every worker listens (each says so)."""
    url = await server.started()
    with anyio.fail_after(30):
        while sum("Uvicorn running on" in line for line in server.log) < workers:
            await anyio.sleep(0.05)
    return url


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_workers_share_one_port_each_owning_actors_and_stop_on_sigterm(
    tmp_path: Path,
) -> None:
    async with served_process("--kv", f"file:{tmp_path}/store", "--workers", "2") as server:
        url = await all_listening(server, 2)
        first: dict[str, int] = {}
        with anyio.fail_after(20):
            while len(set(first.values())) < 2:  # whichever worker is first to accept wins
                first |= await owners(url, [f"k{len(first) + n}" for n in range(8)])
        again = await owners(url, first)
        code = await server.stop()
    log = "".join(server.log)
    pids = set(first.values())
    assert len(pids) == 2 and server.proc.pid not in pids, first
    assert again == first, "a call reaches the worker that owns its actor, wherever it lands"
    assert code == 0, log
    assert log.count("Application shutdown complete") == 2, log  # each put its actors to sleep
    assert not any(alive(pid) for pid in pids)
    assert "(token required), 2 workers" in log.splitlines()[0], "the banner"


async def test_a_killed_worker_is_restarted_and_the_port_keeps_answering(tmp_path: Path) -> None:
    args = ("--kv", f"file:{tmp_path}/store", "--workers", "2", "--lease", "1")
    async with served_process(*args) as server:
        url = await all_listening(server, 2)
        before = await owners(url, KEYS)
        victim = min(before.values())
        os.kill(victim, signal.SIGKILL)
        # The victim's actors are served again once its lease ran out, by the other worker.
        after = await owners(url, KEYS)
        assert victim not in after.values()
        await all_listening(server, 3)  # the victim's successor
        with anyio.fail_after(20):
            fresh = 0
            while len(set(after.values())) < 2:
                fresh += 1
                after = await owners(url, [f"{key}-{fresh}" for key in KEYS[:8]])
        assert victim not in after.values()
        assert await server.stop() == 0
    assert f"(pid {victim}) was killed by SIGKILL; restarting it in 0.5 s" in "".join(server.log)


async def test_an_advertise_url_that_misses_its_process_fails_fast_beside_another(
    tmp_path: Path,
) -> None:
    """A second process on the store whose advertise URL reaches nobody (a closed port), or
    whose workers' URLs miss them (a loopback address they do not listen on), stops with one
    line saying what to pass; alone on its store, the same process only warns."""
    store = f"file:{tmp_path}/store"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = {"PAGEKV_TOKEN": TOKEN}
    alone = ServeProcess("--kv", f"file:{tmp_path}/alone", "--advertise-url", nowhere)
    try:
        await alone.started()
        with anyio.fail_after(10):
            while not any("does not reach this process" in line for line in alone.log):
                await anyio.sleep(0.05)
        assert alone.proc.poll() is None, "alone on its store, it serves on"
    finally:
        alone.proc.kill()
        alone.proc.wait()
    async with served_process("--kv", store):
        second, workers = await anyio.to_thread.run_sync(
            lambda: (
                pagekv(
                    "serve", APP, "--port", "0", "--kv", store, "--advertise-url", nowhere, env=env
                ),
                pagekv(
                    "serve",
                    APP,
                    "--port",
                    "0",
                    "--kv",
                    store,
                    "--workers",
                    "2",
                    "--advertise-url",
                    "http://127.0.0.2",
                    env=env,
                ),
            )
        )
    assert second.returncode == 1, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"pagekv serve: the advertise URL {nowhere} does not reach this "), line
    assert "1 other process sharing the store" in line and "pass --advertise-url" in line, line
    assert "Application shutdown complete" in second.stderr, "it stopped gracefully"
    assert workers.returncode == 1, workers.stderr
    assert re.search(
        r"pagekv serve: worker \d: the advertise URL http://127\.0\.0\.2:", workers.stderr
    )
    assert "cannot serve: stopping the others" in workers.stderr
