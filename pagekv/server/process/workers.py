"""`pagekv serve --workers N`: a supervisor and N worker processes on one host, sharing the
store and one listening socket.

The supervisor binds the public socket once and starts each worker as
`python -m pagekv.server.process.workers FD INDEX`, with the socket's descriptor inherited and the
command's settings (token included) on its stdin, never on its command line. Every worker
accepts on the public socket, opens the store itself and runs its own registry, so it owns the
actors it woke; calls for an actor another worker owns are forwarded to that worker at its
advertise URL, which is the host of the process's one and the port of a socket of the worker's
own (a call forwarded to the public port could land on any worker).

Invariants:
- SIGINT or SIGTERM of the supervisor stops every worker with SIGTERM (never SIGINT: after a
  Ctrl-C at a terminal the workers got a SIGINT of their own, and a second would make uvicorn
  skip the graceful stop) and waits for them; the supervisor then exits 0.
- A worker that exits by itself is restarted, after a backoff that doubles while it keeps
  dying young; one that exits with `FATAL` is not, and the supervisor stops the others and
  exits 1.
- A worker whose supervisor is gone stops by itself (`serve_process`).
- With `--reload` (one worker) a change to a `.py` file under the app's directory stops the
  worker gracefully and starts a new one, which imports the app afresh; a worker that cannot
  serve the changed app (`FATAL`) is started again at the next change, not given up on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

import anyio

from pagekv.server.cluster.advertise import ADVERTISE_ENV, default_url, worker_url
from pagekv.server.config import GRACEFUL_S, ConfigError
from pagekv.server.process.loader import AppFailedToLoad, AppNotFound
from pagekv.server.process.serve_process import (
    StartupError,
    configure_logging,
    listen,
    open_store,
    serve_process,
    settings,
)

FATAL = 78
"""A worker's exit status that says restarting it cannot help (sysexits' EX_CONFIG): its
settings cannot serve, or others share the store and its advertise URL does not reach it."""
RESTART_MIN_S = 0.5
RESTART_MAX_S = 10.0
STABLE_S = 10.0
"""A worker that ran this long before it died is restarted after `RESTART_MIN_S` again."""
STOP_TIMEOUT_S = GRACEFUL_S + 20
"""How long a worker may take to stop (drain, then put its actors to sleep) before it is
killed."""
_TICK_S = 0.1
RELOAD_POLL_S = 0.5
FIX = (
    f"pass --advertise-url (or set ${ADVERTISE_ENV}) with a host they can reach "
    "(with --workers, each worker is reached there at a port of its own)"
)
log = logging.getLogger("pagekv.server.workers")


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float = 0.0
    failures: int = 0
    """Deaths in a row, each within `STABLE_S` of its start: the next backoff doubles."""


def supervise(args: argparse.Namespace, public: socket.socket) -> int:
    """Run `args.workers` workers on `public` until SIGINT/SIGTERM (0) or until a worker exits
    with `FATAL` (1)."""
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    given = json.dumps({k: v for k, v in vars(args).items() if k != "run"}).encode()
    workers = [_Worker(index) for index in range(1, args.workers + 1)]
    fatal = False
    sources = _Sources(Path(args.app.partition(":")[0]).resolve().parent) if args.reload else None
    try:
        while not stopping and not fatal:
            now = time.monotonic()
            changed = sources.changed() if sources is not None else None
            if changed is not None:
                log.warning("%s changed: restarting the server", changed)
                _stop([w.process for w in workers if w.process is not None])
                for worker in workers:
                    worker.process, worker.restart_at, worker.failures = None, now, 0
            for worker in workers:
                if worker.process is None:
                    if now >= worker.restart_at:
                        _start(worker, public, given)
                    continue
                code = worker.process.poll()
                if code is None:
                    continue
                if code == FATAL and sources is not None:
                    log.error("the app cannot be served: waiting for a change to restart it")
                    worker.process, worker.restart_at = None, float("inf")
                    continue
                if code == FATAL:
                    log.error("worker %d cannot serve: stopping the others", worker.index)
                    fatal = True
                    break
                if now - worker.started >= STABLE_S:
                    worker.failures = 0
                delay = min(RESTART_MIN_S * 2**worker.failures, RESTART_MAX_S)
                worker.failures += 1
                worker.restart_at = now + delay
                log.error(
                    "worker %d (pid %d) %s; restarting it in %.1f s",
                    worker.index,
                    worker.process.pid,
                    _ended(code),
                    delay,
                )
                worker.process = None
            time.sleep(_TICK_S)
    finally:
        public.close()  # no worker starts again: the workers' copies alone keep it listening
        _stop([w.process for w in workers if w.process is not None])
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if fatal else 0


class _Sources:
    """The `.py` files under `root` (hidden and `__pycache__` directories aside), by their
    modification time: what `--reload` watches, polled every `RELOAD_POLL_S` (no watcher
    dependency for a development aid)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen = self._scan()
        self.next_scan = time.monotonic() + RELOAD_POLL_S

    def _files(self) -> Iterator[Path]:
        for path in self.root.rglob("*.py"):
            inside = path.relative_to(self.root).parts[:-1]
            if not any(p.startswith(".") or p == "__pycache__" for p in inside):
                yield path

    def _scan(self) -> dict[Path, int]:
        found = {}
        for path in self._files():
            with contextlib.suppress(OSError):  # removed between the listing and the stat
                found[path] = path.stat().st_mtime_ns
        return found

    def changed(self) -> Path | None:
        """A file added, removed or modified since the last scan, if any."""
        if time.monotonic() < self.next_scan:
            return None
        self.next_scan = time.monotonic() + RELOAD_POLL_S
        now = self._scan()
        if now == self.seen:
            return None
        different = {p for p in now.keys() | self.seen.keys() if now.get(p) != self.seen.get(p)}
        self.seen = now
        return min(different)


def _start(worker: _Worker, public: socket.socket, given: bytes) -> None:
    fd = public.fileno()
    process = subprocess.Popen(
        [sys.executable, "-m", "pagekv.server.process.workers", str(fd), str(worker.index)],
        stdin=subprocess.PIPE,
        pass_fds=(fd,),
    )
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # it died at once: the next tick sees it
        process.stdin.write(given)
    process.stdin.close()
    worker.process, worker.started = process, time.monotonic()
    log.info("worker %d started (pid %d)", worker.index, process.pid)


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each live worker, then wait for all; kill any still running past
    `STOP_TIMEOUT_S`."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in live:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error(
                "worker pid %d did not stop within %d s: killing it", process.pid, STOP_TIMEOUT_S
            )
            process.kill()
            process.wait()


def _ended(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _worker(fd: int, index: int) -> int:
    """One worker: the supervisor's settings from stdin, the public socket `fd`, and a socket
    of its own for the calls forwarded to it."""
    args = argparse.Namespace(**json.load(sys.stdin))
    public = socket.socket(fileno=fd)
    try:
        config, registry = settings(args)
    except (ConfigError, AppNotFound) as e:  # the app changed since the supervisor read it
        print(f"pagekv serve: worker {index}: {e}", file=sys.stderr, flush=True)
        return FATAL
    except AppFailedToLoad as e:  # likewise
        print(e.report(f"pagekv serve: worker {index}"), file=sys.stderr, flush=True)
        return FATAL
    configure_logging(args.log_level, args.log_format)
    try:
        store = open_store(args.kv)
    except StartupError as e:
        print(f"pagekv serve: worker {index}: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        private = listen(args.host, 0)
        given = config.advertise_url or default_url(args.host, public.getsockname()[1])
        config = replace(config, advertise_url=worker_url(given, private.getsockname()[1]))
        problem = anyio.run(
            lambda: serve_process(
                registry.definitions.values(),
                store,
                config,
                [public, private],
                args,
                fix=FIX,
                supervisor=os.getppid(),
            )
        )
    except StartupError as e:
        print(f"pagekv serve: worker {index}: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        store.close()
    if problem is not None:
        print(f"pagekv serve: worker {index}: {problem}", file=sys.stderr, flush=True)
        return FATAL
    return 0


if __name__ == "__main__":
    sys.exit(_worker(int(sys.argv[1]), int(sys.argv[2])))
