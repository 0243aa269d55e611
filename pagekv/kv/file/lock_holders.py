"""Who holds the `file:` store's files, from `/proc` (Linux): the processes holding a lock on
one (`/proc/locks`), to name them when a wait for it times out, and the processes that have one
open (`/proc/*/fd`), before a schema upgrade. Diagnostics only: nothing here is on the way of a
request that does not wait in vain."""

from __future__ import annotations

import os
from pathlib import Path


def lock_holders(path: Path) -> str:
    """Who holds a lock (`flock`, or SQLite's POSIX locks) on the file at `path`, from
    `/proc/locks` (Linux): `pid 123 (stopped)`."""
    try:
        held = _locks(path)
    except OSError:
        return "another process (no /proc/locks here to name it)"
    holders = []
    for _, pid in held:
        mine = " (this process)" if pid == os.getpid() else ""
        holders.append(f"pid {pid}{mine}{_process_state(str(pid))}")
    return ", ".join(holders) if holders else "a process that has let go since"


def flock_holders(path: Path) -> set[int]:
    """The pids holding a `flock` on the file at `path` (Linux; `OSError` without
    `/proc/locks`): on `kv.log` the log's lock, on `kv.shm` the flusher lock."""
    return {pid for kind, pid in _locks(path) if kind == "FLOCK"}


def _locks(path: Path) -> list[tuple[str, int]]:
    """`(kind, pid)` of each lock `/proc/locks` lists on the file at `path`."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as locks:
        lines = locks.read().splitlines()
    held = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] in ("FLOCK", "POSIX") and fields[5] == inode:
            held.append((fields[1], int(fields[4])))
    return held


def _process_state(pid: str) -> str:
    """` (stopped)` and the like, from `/proc/PID/stat`; empty where it cannot be read."""
    states = {"T": "stopped", "t": "stopped by a debugger", "D": "in uninterruptible I/O"}
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return f" ({states[state]})" if state in states else ""


def processes_holding(paths: list[Path]) -> list[str]:
    """The other processes that have any of `paths` open, as `pid 123 (python3)`, from
    `/proc/*/fd` (Linux; a process another user owns is visible only to root). Slow (a look at
    every descriptor of every process): for rare checks, such as before an upgrade."""
    keys = set()
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        keys.add((st.st_dev, st.st_ino))
    if not keys:
        return []
    me, found = str(os.getpid()), []
    try:
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and pid != me]
    except OSError:
        return []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in keys:
                found.append(f"pid {pid}{_command(pid)}")
                break
    return found


def _command(pid: str) -> str:
    """` (python3)`: the process's command name, from `/proc/PID/comm`; empty if gone."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return f" ({comm.read().strip()})"
    except OSError:
        return ""
