"""Mistakes a user makes on the command line get one line saying what is wrong, never a
traceback; and the HTTP client says which server it could not reach."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import apsw
import pytest

from pagekv.actor import ActorContext, Registry, actor
from pagekv.cli import fuzzing as cli
from pagekv.cli.progress import StatusLine
from pagekv.cli.transfers import _copy_progress
from pagekv.client import HttpClient, ServerUnreachable
from pagekv.fuzz.execution import Coverage
from pagekv.transfer.store_copy import CopyProgress
from pagekv.vfs import DatabaseDead, caused_by_interrupt


def _pagekv(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagekv", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["fuzz", "--processes", "--kv", "memory://", "--seconds", "1"],
            "--processes needs a durable store",
        ),
        (["fuzz", "--replay", "missing.json"], "cannot replay missing.json: No such file"),
        (["fuzz", "--replay", "bad.json"], "cannot replay bad.json: "),
        (["fuzz", "--writers", "4", "--seconds", "1"], "--writers goes with --processes"),
        (["fuzz", "--faults", "", "--seconds", "1"], "--faults names none of the disruptions"),
    ],
    ids=[
        "fuzz-processes-memory",
        "replay-missing",
        "replay-malformed",
        "fuzz-writers-alone",
        "fuzz-no-faults",
    ],
)
def test_a_mistake_is_one_line_not_a_traceback(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "bad.json").write_text('{"steps": 3}')
    result = _pagekv(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagekv fuzz: ") and says in lines[0], lines


def test_inspect_into_a_pipe_closed_early_ends_quietly(tmp_path: Path) -> None:
    """`pagekv inspect --json | head -c 5` printed a BrokenPipeError traceback (an answer past
    the pipe's buffer: a 1 MiB state)."""
    store = f"file:{tmp_path}/store"
    big = actor("big", state={"blob": "x" * (1 << 20)})

    @big.action
    async def touch(ctx: ActorContext) -> None:
        return None

    async def create() -> None:
        async with Registry([big], kv=store).run() as client:
            await client.get_or_create("big", "k").touch()

    anyio.run(create)
    script = f"{sys.executable} -m pagekv inspect --kv {store} big/k --json | head -c 5"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert len(result.stdout) == 5, result.stdout
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


@pytest.mark.anyio
async def test_the_client_names_the_server_it_cannot_reach() -> None:
    async with HttpClient("http://127.0.0.1:1", retry_for=0) as client:
        with pytest.raises(ServerUnreachable, match=r"http://127\.0\.0\.1:1.*nothing was sent"):
            await client.get("counter", "k").increment(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_fuzz_progress_off_a_terminal_is_a_line_every_few_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off a terminal it printed nothing until the end; on one, a line rewritten in place and
    kept when the run ends."""
    clock = [0.0]
    line = StatusLine(clock=lambda: clock[0])
    progress = cli._Progress(line)
    for second in range(1, 31):  # a call per second for 30 s
        clock[0] = float(second)
        progress(Coverage())
    line.end()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 6 and all(line.startswith("pagekv fuzz: runs ") for line in lines), lines
    terminal = _Tty()
    line = StatusLine(terminal)
    cli._Progress(line)(Coverage(runs=1))
    cli._Progress(line)(Coverage(runs=2))
    line.end()
    drawn = terminal.getvalue()
    assert drawn.count("  runs ") == 3 and "  runs 2, " in drawn  # the last drawn again at the end
    assert drawn.split("\r\x1b[2K")[-1].startswith("  runs 2, ") and "\n" in drawn  # kept


def test_copy_progress_keeps_each_phases_last_line() -> None:
    """On a terminal each phase's last line stays (the next phase draws below it); off one, a
    line every few seconds and each phase's last, plain."""
    reports = [
        CopyProgress(phase, done, 2, 0, 2**20 * done, float(done))
        for phase in ("copy", "verify")
        for done in (1, 2)
    ]
    terminal = _Tty()
    report = _copy_progress(StatusLine(terminal))
    for p in reports:
        report(p)
    kept = [
        re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", s).split("\r")[-1]
        for s in terminal.getvalue().split("\n")
    ]
    assert kept[0].startswith("pagekv copy: copy 2/2 namespaces, 2.0 MiB")
    assert kept[1].startswith("pagekv copy: verify 2/2 namespaces, 2 s")
    log = io.StringIO()
    report = _copy_progress(StatusLine(log, clock=lambda: 0.0))
    for p in reports:
        report(p)
    assert log.getvalue().splitlines() == [
        "pagekv copy: copy 2/2 namespaces, 2.0 MiB (1.0 MiB/s), 2 s",
        "pagekv copy: verify 2/2 namespaces, 2 s",
    ]


@pytest.mark.parametrize(
    "args",
    [["fuzz", "--seconds", "60"], ["bench", "--workload", "commit-1", "--repeat", "1000"]],
    ids=["fuzz", "bench"],
)
def test_ctrl_c_mid_run_is_one_line_and_130(tmp_path: Path, args: list[str]) -> None:
    """A SIGINT while fuzz or bench runs: the progress line ends, one line says so, and the
    status is the shell's for an interrupt (it was a traceback: of the KeyboardInterrupt, or of
    the SQLite IOError it becomes when it lands in a VFS callback under bench, status 1)."""
    command = [sys.executable, "-m", "pagekv", *args]
    with subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        time.sleep(1.5)  # past the start-up, into the runs (each takes much longer)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"pagekv {args[0]}: interrupted", err


def test_an_error_a_ctrl_c_caused_counts_as_the_interrupt() -> None:
    """The chain bench meets (SQLite's IOError from the VFS's DatabaseDead, whose `cause` is
    the interrupt) is an interrupt; an error without one in its chain is not."""
    dead = DatabaseDead(KeyboardInterrupt())
    try:
        raise apsw.IOError("pagekv: database is dead") from dead
    except apsw.IOError as e:
        assert caused_by_interrupt(e)
    assert not caused_by_interrupt(apsw.IOError("disk I/O error"))
    assert not caused_by_interrupt(DatabaseDead(OSError("full")))
