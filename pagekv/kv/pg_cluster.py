"""A throwaway PostgreSQL cluster: a temporary directory, loopback only, a random free port.

The test suite and the benchmarks start one per run so that the `postgresql://` backend is always
exercised against a real server; `python -m pagekv.kv.pg_cluster` starts one by hand and prints its
URL (`--standby`: a primary and a synchronous standby, and their two-host URL). `initdb` refuses to
run as root, so when this process is root the server's commands run as the `postgres` system user
(Debian's `postgresql` package creates it) through `runuser`.

`ReplicatedPair` is the high-availability set-up docs/deployment.md documents, on loopback: a
primary and a streaming standby made with `pg_basebackup -R`, commits waiting for the standby
(`synchronous_standby_names = '*'`), failover by killing the primary and `pg_ctl promote`, and the
old primary rebuilt as the new standby with `pg_rewind`. `TempCluster.freeze()` stops every
process of a server with SIGSTOP, as a frozen VM would leave it: its connections stay open, and
nothing on it answers or times out.

Binaries are looked up in `$PAGEKV_PG_BIN` if set (only there), else on `PATH`, then in the newest
`/usr/lib/postgresql/*/bin` (Debian keeps them off `PATH`), then `/usr/local/pgsql/bin`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOW_TO_INSTALL = (
    "install PostgreSQL's server binaries (Debian/Ubuntu: `apt-get install -y postgresql`) "
    "or point $PAGEKV_PG_BIN at the directory holding initdb and pg_ctl"
)


def find_pg_bin() -> Path | None:
    """The directory holding `initdb`, `pg_ctl` and `postgres`, or None if there is none."""
    if env := os.environ.get("PAGEKV_PG_BIN"):
        # An explicit choice is the only one (so `PAGEKV_PG_BIN=/none` acts as "no PostgreSQL").
        directory = Path(env)
        tools = ("initdb", "pg_ctl", "postgres")
        return directory if all(os.access(directory / t, os.X_OK) for t in tools) else None
    candidates: list[Path] = []
    if found := shutil.which("initdb"):
        candidates.append(Path(found).resolve().parent)
        candidates.append(Path(found).parent)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    candidates.append(Path("/usr/local/pgsql/bin"))
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClusterError(RuntimeError):
    """The throwaway cluster could not be created, started or stopped."""


class TempCluster:
    """One throwaway cluster. `start()` creates it on first use; `destroy()` removes everything.

    `fsync=False` (the default, for tests) keeps every commit's WAL *written* before the commit
    returns — so stopping the server with `-m immediate` loses nothing acknowledged — but skips
    flushing it to disk, which only matters if the machine itself crashes. Benchmarks pass
    `fsync=True` to measure durable commits.

    The port and the socket directory are given on the server's command line, not in
    `postgresql.conf`, because a standby's data directory is a copy of its primary's, files and
    all: each node keeps its own whatever it was copied from.
    """

    def __init__(
        self,
        bindir: Path | None = None,
        *,
        fsync: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        found = bindir or find_pg_bin()
        if found is None:
            raise ClusterError(f"PostgreSQL binaries not found: {HOW_TO_INSTALL}")
        self.bindir = found
        self.port = _free_port()
        # As root the server runs as `postgres`, which must reach the directory: use /tmp, not a
        # $TMPDIR that may sit under a private home directory.
        as_root = os.geteuid() == 0 and os.path.isdir("/tmp")
        self.root = Path(tempfile.mkdtemp(prefix="pagekv-pg-", dir="/tmp" if as_root else None))
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self.fsync = fsync
        self.settings = {
            "listen_addresses": "'127.0.0.1'",
            "max_connections": "200",
            "fsync": "on" if fsync else "off",
            "synchronous_commit": "on",
            "shared_buffers": "128MB",
            **(settings or {}),
        }
        self._runas: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise ClusterError(
                    "running as root, and there is no `postgres` user to run the server as; "
                    f"{HOW_TO_INSTALL}"
                ) from None
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._runas = ["runuser", "-u", "postgres", "--"]
        self._initialized = False
        self.running = False
        self.frozen: list[int] = []
        """The processes `freeze()` stopped (the postmaster first), until `thaw()`."""

    @property
    def url(self) -> str:
        """The `postgresql://` URL of the cluster's `postgres` database as its superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> str:
        """Run one of the server's commands (as `postgres` when root); return its output."""
        command = [*self._runas, *args]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-3000:] if self.logfile.exists() else ""
            raise ClusterError(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                + (f"\nserver log:\n{log}" if log else "")
            )
        return done.stdout

    def sql(self, statement: str) -> str:
        """Run one statement as the superuser through `psql`; its rows, unaligned, one a line."""
        return self._run(
            str(self.bindir / "psql"),
            *("-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port)),
            *("-U", "postgres", "-d", "postgres", "-c", statement),
        ).strip()

    def start(self) -> None:
        """Create the cluster if needed and start the server; wait until it accepts connections."""
        if not self._initialized:
            self._run(
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            )
            with open(self.datadir / "postgresql.conf", "a") as conf:
                conf.write("\n# pagekv throwaway cluster\n")
                for name, value in self.settings.items():
                    conf.write(f"{name} = {value}\n")
            self._initialized = True
        self._run(
            str(self.bindir / "pg_ctl"),
            *("-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", "60"),
            *("-o", f"-p {self.port} -k {self.root}"),
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clean) or `immediate` (like a crash: WAL replay on start).
        A frozen one is thawed first (a stopped process would never act on the request)."""
        self.thaw()
        if self.running:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"
            )
            self.running = False

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crashed host would leave it: no shutdown of any kind.

        Its backends, left behind, notice and exit on their own; this returns once all of them
        are gone (they hold the shared memory a later start or `pg_rewind` needs). The lock files
        the postmaster leaves (data directory, socket) are removed then, with its socket: their
        PID may still name an exited process not yet reaped, which a new postmaster would take
        for a live one. A frozen server's backends, stopped, would notice nothing: they are
        killed too, in the one instant, so that none of them runs again (as a fenced host: the
        standby promoted in its place must be the only primary).
        """
        if not self.running:
            return
        lock_file = self.datadir / "postmaster.pid"
        pid = self._postmaster()
        children = _children(pid)
        for process in (pid, *children) if self.frozen else (pid,):
            os.kill(process, signal.SIGKILL)
        self.thaw()
        self.running = False
        deadline = time.monotonic() + 60
        for process in (pid, *children):
            while _state(process) not in ("", "Z"):
                if time.monotonic() > deadline:
                    raise ClusterError(f"process {process} of the killed server did not exit")
                time.sleep(0.01)
        lock_file.unlink()
        for leftover in self.root.glob(f".s.PGSQL.{self.port}*"):
            leftover.unlink()

    def freeze(self) -> None:
        """SIGSTOP every process of the running server: the postmaster first, so that it forks
        no more, then each of its children. Returns once all of them are stopped. The kernel
        still accepts and acknowledges TCP connections to it; nothing answers them."""
        if self.frozen or not self.running:
            raise ClusterError("freeze needs a running server that is not frozen")
        pid = self._postmaster()
        self.frozen = [pid]
        _stop(pid)
        for child in _children(pid):
            self.frozen.append(child)
            _stop(child)

    def thaw(self) -> None:
        """SIGCONT what `freeze()` stopped (a process that has exited since is skipped)."""
        frozen, self.frozen = self.frozen, []
        for process in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, signal.SIGCONT)

    def _postmaster(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def replica(self) -> TempCluster:
        """A new node (own directory and port, not started) streaming from this running one:
        `pg_basebackup -R` copies the data directory and writes the standby's settings."""
        node = TempCluster(self.bindir, fsync=self.fsync, settings=self.settings)
        node._run(
            str(self.bindir / "pg_basebackup"),
            *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
            *("-D", str(node.datadir), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
        )
        node._initialized = True
        return node

    def promote(self) -> None:
        """Promote this standby to primary and wait until it accepts writes.

        Then a checkpoint: `pg_rewind` reads the new timeline from the control file, which only a
        checkpoint updates; without it the old primary is found "on the same timeline" and left
        unrewound, and started as a standby with WAL this node never had, it was seen to release
        a synchronous commit it did not hold.
        """
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", "promote")
        self.sql("CHECKPOINT")

    def rewind_from(self, primary: TempCluster) -> None:
        """Make this stopped node, a former primary, a standby of `primary` (`pg_rewind -R`):
        whatever it committed that `primary` never received is discarded. Not started."""
        if self.running:
            raise ClusterError("stop the node before rewinding it")
        source = f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres"
        self._run(
            str(self.bindir / "pg_rewind"),
            *("-D", str(self.datadir), "--source-server", source, "-R", "--no-sync"),
        )

    def destroy(self) -> None:
        """Stop the server (if running) and delete the cluster's directory."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> TempCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The fields after the command name (which may hold spaces): state, ppid, ...
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _stop(pid: int) -> None:
    """SIGSTOP `pid` and wait until it is stopped (`T`) or gone: the signal is delivered
    asynchronously. A backend that exited meanwhile is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while _state(pid) not in ("T", "t", "", "Z"):
        if time.monotonic() > deadline:
            raise ClusterError(f"process {pid} did not stop")
        time.sleep(0.001)


def _state(pid: int) -> str:
    """A process's state letter (`Z`: exited, not yet reaped), or "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


class ReplicatedPair:
    """A primary and a streaming standby on loopback: two data directories, two ports.

    `synchronous=True` sets `synchronous_standby_names = '*'` on both (the standby's
    configuration is the primary's copy, so a promoted standby keeps it): a commit returns only
    once the standby has flushed its WAL. `url` names both nodes in a fixed order, whichever is
    the primary, with `target_session_attrs=read-write`: what a client of a real pair is given.

    A failover is `fail_over()` (the primary stopped with `-m immediate` or SIGKILLed, the standby
    promoted; roles swap) then `rebuild_standby()` (the old primary rewound and started as the new
    primary's standby). With synchronous replication the new primary's commits wait until then.
    A frozen primary (`primary.freeze()`) fails over with `fail_over("frozen")`: the standby is
    promoted first, then the old primary killed where it stands.
    """

    def __init__(
        self, bindir: Path | None = None, *, fsync: bool = False, synchronous: bool = True
    ) -> None:
        settings = {
            # pg_rewind needs hint bits logged (or data checksums), and the old primary's WAL back
            # to the last checkpoint before the timelines forked: its crash recovery would
            # otherwise recycle that segment.
            "wal_log_hints": "on",
            "wal_keep_size": "'256MB'",
            # a standby whose primary went away retries every 5 s by default
            "wal_retrieve_retry_interval": "'100ms'",
            "synchronous_standby_names": "'*'" if synchronous else "''",
            "synchronous_commit": "on",
        }
        self.primary = TempCluster(bindir, fsync=fsync, settings=settings)
        for tool in ("pg_basebackup", "pg_rewind", "psql"):
            if not os.access(self.primary.bindir / tool, os.X_OK):
                shutil.rmtree(self.primary.root, ignore_errors=True)
                raise ClusterError(f"{tool} not found in {self.primary.bindir}: {HOW_TO_INSTALL}")
        self.standby: TempCluster | None = None
        self.nodes: list[TempCluster] = [self.primary]

    def start(self) -> None:
        """Start the primary, make and start the standby, wait until it streams."""
        self.primary.start()
        self.standby = self.primary.replica()
        self.nodes.append(self.standby)
        self.standby.start()
        self.wait_for_standby()

    def url(self, database: str = "postgres", /, **options: object) -> str:
        """The two-host URL of `database` as the superuser, with `options` in its query."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        query = "&".join(
            f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **options}.items()
        )
        return f"postgresql://postgres@{hosts}/{database}?{query}"

    def wait_for_standby(self, timeout: float = 60) -> None:
        """Wait until the primary sees a standby streaming (as its synchronous one, if any)."""
        deadline = time.monotonic() + timeout
        query = (
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND "
            "(sync_state = 'sync' OR current_setting('synchronous_standby_names') = '')"
        )
        while self.primary.sql(query) == "0":
            if time.monotonic() > deadline:
                raise ClusterError(f"no standby streaming from port {self.primary.port}")
            time.sleep(0.02)

    def fail_over(self, how: str = "immediate") -> None:
        """Lose the primary (`immediate`: `pg_ctl stop -m immediate`; `kill`: SIGKILL of the
        postmaster; `frozen`: it was frozen, and every process of it is SIGKILLed once the standby
        is promoted, as a cluster manager fences a host it cannot reach) and promote the standby.
        The old primary is left stopped, as the standby."""
        if self.standby is None or not self.standby.running:
            raise ClusterError("no running standby to fail over to")
        match how:
            case "immediate":
                self.primary.stop("immediate")
            case "kill":
                self.primary.kill()
            case "frozen":
                if not self.primary.frozen:
                    raise ClusterError("fail_over('frozen') needs a frozen primary")
            case _:
                raise ValueError(f"how must be 'immediate', 'kill' or 'frozen', not {how!r}")
        self.standby.promote()
        if how == "frozen":
            self.primary.kill()
        self.primary, self.standby = self.standby, self.primary

    def rebuild_standby(self) -> float:
        """Rewind the stopped old primary from the new one, start it as its standby, wait until
        it streams. Returns when (`time.monotonic()`) it was started: until then the new primary
        had no standby, so with synchronous replication it acknowledged no commit."""
        if self.standby is None or self.standby.running:
            raise ClusterError("the standby to rebuild must exist and be stopped")
        self.standby.rewind_from(self.primary)
        started = time.monotonic()
        self.standby.start()
        self.wait_for_standby()
        return started

    def destroy(self) -> None:
        """Stop and delete both nodes."""
        for node in self.nodes:
            node.destroy()

    def __enter__(self) -> ReplicatedPair:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Start a throwaway cluster (`--standby`: a replicated pair), print its URL, and remove it on
    Enter, Ctrl-C or SIGTERM."""
    signal.signal(signal.SIGTERM, _interrupt)
    fsync = "--fsync" in sys.argv
    if "--standby" in sys.argv:
        with ReplicatedPair(fsync=fsync) as pair:
            _serve(pair.url())
    else:
        with TempCluster(fsync=fsync) as cluster:
            _serve(cluster.url)


def _serve(url: str) -> None:
    print(url, flush=True)
    with contextlib.suppress(KeyboardInterrupt, EOFError):
        input("press Enter to stop and delete the cluster\n")


if __name__ == "__main__":
    main()
