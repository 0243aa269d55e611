"""`pagekv serve` and `pagekv inspect` as real processes: failing closed, serving with a token
from the environment, inspection beside a running server, a clean SIGTERM, and two servers
sharing one PostgreSQL store without losing a write."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from server_helpers import TOKEN

from pagekv.client import HttpClient
from pagekv.server.process.serve_process import listen

pytestmark = pytest.mark.anyio

APP = str(Path(__file__).with_name("server_defs.py"))
RUNNING = re.compile(
    r"(?:Uvicorn running on|read-only inspector of \S+ at) (http://127\.0\.0\.1:\d+)"
)


def pagekv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagekv", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


class ServeProcess:
    """`pagekv serve APP` (or `command`, e.g. `ui`) on a free port; `url` once it listens,
    `log` for everything it printed."""

    def __init__(
        self,
        *args: str,
        token: str | None = TOKEN,
        app: str = APP,
        command: tuple[str, ...] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PAGEKV_TOKEN"}
        if token is not None:
            env["PAGEKV_TOKEN"] = token
        run = ("serve", app) if command is None else command
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pagekv", *run, "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: list[str] = []
        self.url: str | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            match = RUNNING.search(line)
            if match:
                self.url = match.group(1)
                self._listening.set()
        self._listening.set()

    async def started(self) -> str:
        with anyio.fail_after(30):
            await anyio.to_thread.run_sync(self._listening.wait)
        assert self.url is not None, "".join(self.log)
        return self.url

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            return await anyio.to_thread.run_sync(self.proc.wait)


@asynccontextmanager
async def served_process(*args: str) -> AsyncIterator[ServeProcess]:
    server = ServeProcess(*args)
    try:
        await server.started()
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def test_serve_refuses_to_start_without_a_token() -> None:
    env = {"PAGEKV_TOKEN": ""}
    result = subprocess.run(
        [sys.executable, "-m", "pagekv", "serve", APP, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PAGEKV_TOKEN"},
    )
    assert result.returncode == 2
    assert "--unauthenticated" in result.stderr and "PAGEKV_TOKEN" in result.stderr
    both = pagekv("serve", APP, "--token", "t", "--unauthenticated")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    contradiction = pagekv("serve", APP, "--unauthenticated", env={"PAGEKV_TOKEN": "t"})
    assert contradiction.returncode == 2 and "contradict" in contradiction.stderr
    empty = pagekv("serve", APP, env=env)
    assert empty.returncode == 2
    missing = pagekv("serve", "no/such/app.py", "--unauthenticated")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    wrong = pagekv("serve", f"{APP}:ledger", "--unauthenticated")
    assert wrong.returncode == 2 and "must be a pagekv.actor.Registry" in wrong.stderr


async def test_serve_inspect_beside_it_and_stop_cleanly(tmp_path: Path) -> None:
    store = f"file:{tmp_path}/store"
    async with served_process("--kv", store) as server:
        url = await server.started()
        async with HttpClient(url, token=TOKEN) as client:
            handle = client.get_or_create("ledger", "room/1")
            for n in (1, 2, 3):
                await handle.add(n)

            listing = await anyio.to_thread.run_sync(lambda: pagekv("inspect", "--kv", store))
            shown = await anyio.to_thread.run_sync(
                lambda: pagekv("inspect", "--kv", store, "ledger/room/1")
            )
            as_json = await anyio.to_thread.run_sync(
                lambda: pagekv("inspect", "--kv", store, "ledger/room/1", "--json")
            )
            missing = await anyio.to_thread.run_sync(
                lambda: pagekv("inspect", "--kv", store, "ledger/nope")
            )
            # The server's instance was not taken over: this write needs no new wake.
            assert (await handle.add(4))["rows"] == [1, 2, 3, 4]
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers) as http:
                metrics = (await http.get("/metrics")).text
        assert "pagekv_wakes_total 1.0\n" in metrics
        assert "pagekv_takeovers_total 0.0\n" in metrics
        code = await server.stop()
    assert code in (0, -signal.SIGTERM), "".join(server.log)
    assert "Application shutdown complete" in "".join(server.log)

    assert listing.returncode == 0 and "ledger/room%2F1" in listing.stdout
    assert shown.returncode == 0, shown.stderr
    assert '"count":3' in shown.stdout and "entries: 3 rows" in shown.stdout
    report = json.loads(as_json.stdout)
    assert report["state"]["count"] == 3 and report["key"] == "room/1"
    entries = next(t for t in report["tables"] if t["name"] == "entries")
    assert entries["first_rows"] == [[1, 1], [2, 2], [3, 3]]
    assert report["workflow"] is None
    assert missing.returncode == 1 and "no actor 'ledger' with key 'nope'" in missing.stderr

    after = json.loads(pagekv("inspect", "--kv", store, "ledger/room/1", "--json").stdout)
    assert after["state"]["count"] == 4
    assert after["state"]["sleeps"] == 1  # SIGTERM put the actor to sleep (on_sleep ran)


async def test_two_servers_on_one_postgres_store_serve_one_actor_on_its_owner(
    postgres_server,
) -> None:
    """Requests alternate between two `serve` processes: the one that does not own the actor
    forwards each call to the one that does, so no call fails, the actor wakes once, nobody
    takes it over, and every acknowledged write is there exactly once, in order. They need a
    cluster secret to forward with: a second server without one stops at once, naming it."""
    store = postgres_server.store_url("server-two-processes")
    async with served_process("--kv", store) as alone:
        unproven = ServeProcess("--kv", store)
        assert await anyio.to_thread.run_sync(lambda: unproven.proc.wait(30)) == 1
        with anyio.fail_after(10):
            while "give each the same --cluster-secret" not in "".join(unproven.log):
                await anyio.sleep(0.05)
        assert await alone.stop() in (0, -signal.SIGTERM)
    shared = ("--kv", store, "--cluster-secret", "a-secret-both-servers-share")
    async with served_process(*shared) as one, served_process(*shared) as two:
        urls = [await one.started(), await two.started()]
        clients = [HttpClient(url, token=TOKEN) for url in urls]
        acknowledged: list[int] = []
        for n in range(1, 21):
            view = await clients[n % 2].get_or_create("ledger", "shared").add(n)
            acknowledged.append(n)
            assert view["rows"] == acknowledged
        final = await clients[0].get_or_create("ledger", "shared").add(21)
        for client in clients:
            await client.aclose()
        counts: dict[str, int] = {}
        headers = {"authorization": f"Bearer {TOKEN}"}
        for url in urls:
            async with httpx.AsyncClient(base_url=url, headers=headers) as http:
                metrics = (await http.get("/metrics")).text
            for name in ("takeovers", "wakes", "forwarded"):
                found = re.search(rf"^pagekv_{name}_total (\d+)\.0$", metrics, re.MULTILINE)
                assert found, metrics
                counts[name] = counts.get(name, 0) + int(found[1])
    assert final["rows"] == [*acknowledged, 21] and final["count"] == 21
    # two wakes it (n = 1), so one forwards every even n and the final call
    assert counts == {"takeovers": 0, "wakes": 1, "forwarded": 11}, counts


def test_serve_on_an_unreachable_store_is_one_line_without_its_password() -> None:
    """It was a traceback from the app's startup, with the URL's password in the banner."""
    url = "postgresql://ada:s3cret-pw@127.0.0.1:1/db?connect_timeout=1&pool_timeout=1"
    result = pagekv("serve", APP, "--unauthenticated", "--port", "0", "--kv", url)
    assert result.returncode == 1, result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no pool retries
    last = result.stderr.strip().splitlines()[-1]
    assert "unreachable" in last and last.startswith(
        "pagekv serve: cannot open the store postgresql://ada:***@127.0.0.1:1/"
    )


def test_serve_refuses_bad_placement_settings_in_one_line(tmp_path: Path) -> None:
    """A bad --advertise-url (or $PAGEKV_ADVERTISE_URL), --workers or --lease is a usage error
    before anything runs, and a taken port one line, never a traceback."""
    store = f"file:{tmp_path}/store"
    cases = [
        ("ftp://h", "must start with http:// or https://", {}),
        ("http://h:8000/", "no path", {}),
        ("http://h?x=1", "no path, query or fragment", {}),
        ("http://ada:s3cret-pw@h", "must not hold a user or password", {}),
        ("http://h:0", "port must be 1..65535", {}),
        ("http://", "needs a host", {"PAGEKV_ADVERTISE_URL": "http://"}),
    ]
    for url, problem, env in cases:
        given = [] if env else ["--advertise-url", url]
        result = pagekv("serve", APP, "--unauthenticated", "--kv", store, *given, env=env)
        assert result.returncode == 2, (url, result.stderr)
        assert result.stderr.count("\n") == 1 and problem in result.stderr, result.stderr
        assert result.stderr.startswith("pagekv serve: advertise URL ")
        assert "s3cret-pw" not in result.stderr
    for flag, value in [("--workers", "0"), ("--workers", "two"), ("--lease", "0")]:
        result = pagekv("serve", APP, "--unauthenticated", flag, value)
        assert result.returncode == 2 and f"argument {flag}" in result.stderr, result.stderr
    memory = pagekv("serve", APP, "--unauthenticated", "--kv", "memory://", "--workers", "2")
    assert memory.returncode == 2 and memory.stderr.count("\n") == 1, memory.stderr
    assert "--workers needs a store the processes share" in memory.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for workers in ("1", "2"):
            result = pagekv(
                "serve",
                APP,
                "--unauthenticated",
                "--kv",
                store,
                "--port",
                port,
                "--workers",
                workers,
            )
            assert result.returncode == 1, result.stderr
            assert result.stderr == (
                f"pagekv serve: cannot listen on http://127.0.0.1:{port}: Address already in use\n"
            )


def test_a_busy_port_is_refused_before_any_file_is_made(tmp_path: Path) -> None:
    """On the default store (`./.pagekv`): the port is bound before the store is opened, so a
    taken one leaves the directory it ran in as it was (it left an empty store behind)."""
    serve = [sys.executable, "-m", "pagekv", "serve", APP, "--unauthenticated"]
    env = {k: v for k, v in os.environ.items() if k != "PAGEKV_KV"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for workers in ("1", "2"):
            result = subprocess.run(
                [*serve, "--port", port, "--workers", workers],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
                env=env,
            )
            assert result.returncode == 1, result.stderr
            assert result.stderr == (
                f"pagekv serve: cannot listen on http://127.0.0.1:{port}: Address already in use\n"
            )
            assert list(tmp_path.iterdir()) == []


async def test_serve_takes_its_defaults_from_the_environment_and_logs_with_times(
    tmp_path: Path,
) -> None:
    """`PAGEKV_KV` and `PAGEKV_PORT` set the store and port; pagekv's and uvicorn's records
    come out with time, level and logger, and a failed action is logged (it was not at all)."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "PAGEKV_TOKEN"},
        "PAGEKV_KV": f"file:{tmp_path}/env-store",
        "PAGEKV_PORT": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagekv", "serve", APP, "--unauthenticated", "--access-log"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    try:
        with anyio.fail_after(30):
            while not any(RUNNING.search(line) for line in lines):
                lines.append(await anyio.to_thread.run_sync(proc.stderr.readline))
        url = next(m.group(1) for line in lines if (m := RUNNING.search(line)))
        async with httpx.AsyncClient(base_url=url) as http:
            ok = await http.post("/actors/ledger/actions/add?key=k", json={"args": [1]})
            bad = await http.post("/actors/ledger/actions/fail?key=k", json={"args": ["no"]})
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = await anyio.to_thread.run_sync(proc.communicate)
    log = "".join(lines) + rest
    assert ok.status_code == 200 and bad.status_code >= 400, (ok.text, bad.text)
    assert (tmp_path / "env-store").is_dir(), "the store of $PAGEKV_KV"
    assert f"on file:{tmp_path}/env-store, {url} " in log, "the banner, with the port bound"
    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: ")
    traceback = re.compile(r"^(Traceback \(most recent call last\):|  |ValueError: no$)")
    assert all(
        stamped.match(line) or traceback.match(line)
        for line in log.splitlines()[1:]
        if line.strip()
    ), log
    assert '"POST /actors/ledger/actions/add?key=k HTTP/1.1" 200' in log, "the access log"
    assert re.search(r"(WARNING|INFO|ERROR) pagekv\.server: .*fail", log), log


def test_python_dash_m_pagekv_is_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pagekv", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.startswith("pagekv "), result


def test_inspect_takes_its_store_from_the_environment_as_serve_does(tmp_path: Path) -> None:
    store = f"file:{tmp_path}/env-store"
    pagekv("demo", "--kv", store, "--rows", "1")
    listed = pagekv("inspect", env={"PAGEKV_KV": store})
    assert listed.returncode == 0, listed.stderr
    missing = pagekv("inspect", env={"PAGEKV_KV": f"file:{tmp_path}/none"})
    assert missing.returncode != 0 and "none" in missing.stderr, missing.stderr


def test_serve_listens_with_tcp_nodelay() -> None:
    """Its connections inherit it; without it each answer's body waited for the client's
    delayed ACK (40 ms, one client got 21 calls/s instead of over a thousand)."""
    sock = listen("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client = socket.create_connection(sock.getsockname())
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        accepted.close()
        client.close()
    finally:
        sock.close()


async def test_ui_reads_the_store_beside_a_serving_process(tmp_path: Path) -> None:
    """`pagekv ui` as a process of its own on the store a `pagekv serve` runs: it shows the
    server's actors, with the server as their owner, and the server never loses one of them
    (no takeover, no second wake); a change is refused; SIGTERM stops it cleanly."""
    store = f"file:{tmp_path}/store"
    async with served_process("--kv", store) as server:
        url = await server.started()
        async with HttpClient(url, token=TOKEN) as client:
            handle = client.get_or_create("ledger", "room/1")
            await handle.add(1)
        view = ServeProcess("--kv", store, command=("ui",))
        try:
            ui_url = await view.started()
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=ui_url, headers=headers) as http:
                about = (await http.get("/inspect")).json()
                listed = (await http.get("/inspect/actors", params={"owners": "1"})).json()
                state = await http.get("/inspect/actors/ledger/state", params={"key": "room/1"})
                page = await http.get("/", headers={"authorization": ""})
                refused = await http.post(
                    "/inspect/actors/ledger/workflow/cancel", params={"key": "room/1"}
                )
                unauthorized = await http.get("/inspect/actors", headers={"authorization": ""})
            code = await view.stop()
        finally:
            if view.proc.poll() is None:
                view.proc.kill()
        async with HttpClient(url, token=TOKEN) as client:
            assert (await client.get("ledger", "room/1").add(2))["rows"] == [1, 2]
        async with httpx.AsyncClient(base_url=url, headers=headers) as http:
            metrics = (await http.get("/metrics")).text
    assert code in (0, -signal.SIGTERM), "".join(view.log)
    assert about == {"mode": "store", "read_only": True, "registry": None, "store": store}
    [actor] = listed["actors"]
    assert actor["key"] == "room/1" and actor["owner"]["address"] == url
    assert state.json()["state"]["count"] == 1
    assert page.status_code == 200 and "pagekv inspector" in page.text
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "read_only")
    assert unauthorized.status_code == 401
    assert "pagekv_wakes_total 1.0\n" in metrics and "pagekv_takeovers_total 0.0\n" in metrics


def test_ui_fails_closed_like_serve(tmp_path: Path) -> None:
    none = subprocess.run(
        [sys.executable, "-m", "pagekv", "ui", "--kv", f"file:{tmp_path}/s", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PAGEKV_TOKEN"},
    )
    assert none.returncode == 2 and "--unauthenticated" in none.stderr
    typo = pagekv("ui", "--kv", f"file:{tmp_path}/typo", "--unauthenticated")
    assert typo.returncode == 1 and "no file store at" in typo.stderr
    assert not (tmp_path / "typo").exists()  # a read-only tool makes no store where it looks
    bad = pagekv("ui", "--kv", "postgresql://u:hunter2@127.0.0.1:1/db", "--unauthenticated")
    assert bad.returncode == 1 and "cannot open the store" in bad.stderr
    assert "hunter2" not in bad.stderr


USERS_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


def test_an_app_that_fails_to_load_shows_only_its_own_traceback(tmp_path: Path) -> None:
    """It was a traceback through pagekv's command line and loader, the user's frames at its
    end: now the user's frames only (their files, not pagekv's), then one line, exit 1."""
    (tmp_path / "helpers.py").write_text("def price():\n    return {}['missing']\n")
    apps = {
        "raises.py": (
            "from pagekv.actor import Registry\n"
            "\n"
            "def build():\n"
            "    return 1 / 0\n"
            "\n"
            "registry = build()\n",
            "ZeroDivisionError",
            [6, 4],
        ),
        "neighbour.py": (
            "import helpers\n\nPRICE = helpers.price()\n",
            "KeyError",
            [3],
        ),
        "plain_def.py": (
            "from pagekv.actor import Registry, actor\n"
            "\n"
            "shop = actor('shop')\n"
            "\n"
            "@shop.action\n"
            "def total(ctx):\n"
            "    return 0\n",
            "InvalidDefinition",
            [5],
        ),
        "syntax.py": ("x = 1\ndef f(:\n    pass\n", "SyntaxError", [2]),
    }
    for name, (source, error, lines) in apps.items():
        app = tmp_path / name
        app.write_text(source)
        result = subprocess.run(
            [sys.executable, "-m", "pagekv", "serve", str(app), "--unauthenticated"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert result.returncode == 1, (name, result.stderr)
        frames = [(m["file"], int(m["line"])) for m in USERS_FRAME.finditer(result.stderr)]
        assert not [f for f, _ in frames if "/pagekv/" in f or "importlib" in f], result.stderr
        assert [line for f, line in frames if f == str(app)] == lines, result.stderr
        if name == "neighbour.py":
            assert frames[-1] == (str(tmp_path / "helpers.py"), 2), result.stderr
        last = result.stderr.splitlines()[-1]
        assert last == f"pagekv serve: {app} failed to load with the {error} above", name
        assert f"{error}: " in result.stderr.splitlines()[-2], result.stderr
    plain = tmp_path / "plain_def.py"
    refused = f"action 'total' of actor 'shop' ({plain}:5) must be an 'async def'"
    result = subprocess.run(
        [sys.executable, "-m", "pagekv", "serve", str(plain), "--unauthenticated"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert refused in result.stderr, result.stderr


RELOADED_APP = """
from pagekv.actor import Registry, actor

counter = actor("counter", state={{"n": 0}})


@counter.action
async def bump(ctx) -> list[int]:
    ctx.state["n"] += 1
    return [{version}, ctx.state["n"]]


registry = Registry([counter])
"""


def _edit(path: Path, text: str) -> None:
    """`text` into `path`, its modification time moved on past any clock granularity."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


async def test_reload_serves_the_changed_app_on_the_same_store(tmp_path: Path) -> None:
    """`serve --reload`: an edit of the app restarts the server, which serves the new code on
    the same embedded store (the actor's state carries on); an edit that breaks the app keeps
    the supervisor waiting for the next one, not gone."""
    app = tmp_path / "app.py"
    _edit(app, RELOADED_APP.format(version=1))
    store = f"file:{tmp_path}/store"
    server = ServeProcess("--reload", "--unauthenticated", "--kv", store, token=None, app=str(app))
    try:
        url = await server.started()
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def bump() -> list[int] | None:
                try:
                    answer = await http.post("/actors/counter/actions/bump?key=k", json={})
                except httpx.TransportError:
                    return None  # between two workers
                return answer.json()["result"] if answer.status_code == 200 else None

            async def until_version(version: int) -> list[int]:
                with anyio.fail_after(60):
                    while (result := await bump()) is None or result[0] != version:
                        await anyio.sleep(0.1)
                return result

            assert await bump() == [1, 1]
            _edit(app, RELOADED_APP.format(version=2))
            second = await until_version(2)
            assert second[1] >= 2  # the same store: the count went on
            _edit(app, "this is not python\n")
            with anyio.fail_after(60):
                while not any("waiting for a change" in line for line in server.log):
                    await anyio.sleep(0.1)
            assert server.proc.poll() is None
            _edit(app, RELOADED_APP.format(version=3))
            third = await until_version(3)
            assert third[1] > second[1]
        assert await server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
