"""A throwaway PostgreSQL cluster: a temporary directory, loopback only, a random free port.

The test suite and the benchmarks start one per run so that the `postgresql://` backend is always
exercised against a real server; `python -m pagekv.kv.pg_cluster` starts one by hand and prints its
URL. `initdb` refuses to run as root, so when this process is root the server's commands run as the
`postgres` system user (Debian's `postgresql` package creates it) through `runuser`.

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
        self.settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
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

    @property
    def url(self) -> str:
        """The `postgresql://` URL of the cluster's `postgres` database as its superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
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
                conf.write(f"port = {self.port}\n")
                for name, value in self.settings.items():
                    conf.write(f"{name} = {value}\n")
            self._initialized = True
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            "60",
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clean) or `immediate` (like a crash: WAL replay on start)."""
        if self.running:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"
            )
            self.running = False

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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Start a throwaway cluster, print its URL, and remove it on Enter, Ctrl-C or SIGTERM."""
    signal.signal(signal.SIGTERM, _interrupt)
    with TempCluster(fsync="--fsync" in sys.argv) as cluster:
        print(cluster.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt, EOFError):
            input("press Enter to stop and delete the cluster\n")


if __name__ == "__main__":
    main()
