"""Every command's arguments are checked before it runs: a bad value is a usage error (exit 2)
naming the flag and what it allows, never a traceback or a half-done run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagekv.cli import main

APP = str(Path(__file__).parent / "server" / "server_defs.py")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--rows", "0"], "argument --rows: must be at least 1, got 0"),
        (["demo", "--rows", "-3"], "argument --rows: must be at least 1, got -3"),
        (["demo", "--kv", "bogus://"], "argument --kv: unknown KV URL scheme 'bogus'"),
        (["inspect", "--limit", "-1"], "argument --limit: must be at least 1, got -1"),
        (["inspect", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (["inspect", "--rows", "x"], "argument --rows: expected a whole number, got 'x'"),
        (["inspect", "--kv", "file:/x?log_kib=abc"], "log_kib must be a whole number"),
        (["serve", APP, "--port", "99999"], "argument --port: must be 0..65535"),
        (["serve", APP, "--kv", "bogus://x"], "argument --kv: unknown KV URL scheme 'bogus'"),
        (["serve", APP, "--max-body-bytes", "0"], "argument --max-body-bytes: must be at least 1"),
        (["fuzz", "--seconds", "-5"], "argument --seconds: must be more than 0, got -5"),
        (["fuzz", "--seconds", "nan"], "argument --seconds: must be more than 0, got nan"),
        (["fuzz", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["fuzz", "--kv", "memory://?latency_ms=x"], "latency_ms must be a number"),
        (["bench", "--kv", "memory://?x=1"], "argument --kv: unknown option(s) ['x']"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert f"usage: pagekv {argv[0]}" in err


def test_inspect_never_creates_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo"
    assert main(["inspect", "--kv", f"file:{missing}"]) == 1
    assert f"no file store at {missing}" in capsys.readouterr().err
    assert not missing.exists()
