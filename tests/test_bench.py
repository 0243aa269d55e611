"""`pagekv bench`: a quick run completes, the JSON carries every figure, ratios come from paired
runs, workload selection works, and bad arguments fail with a clear message.

Timings are never asserted against targets here (the machine is shared and noisy); only what must
hold on any machine: counts, structure, arithmetic, and that simulated latency is really paid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import statistics
import threading
from pathlib import Path
from typing import Any

import pytest

import pagekv.bench.results
import pagekv.bench.sampling
import pagekv.bench.targets
import pagekv.cli.benchmark
from pagekv.bench import WORKLOADS, Summary
from pagekv.bench.results import (
    DROP_ORDER,
    BenchReport,
    Config,
    Machine,
    hidden_columns,
    render,
    terminal_width,
)
from pagekv.bench.sampling import (
    Harness,
    MemoryUse,
    Ratio,
    Sample,
    SystemResult,
    WorkloadResult,
    run_workloads,
)
from pagekv.bench.systems import (
    NATIVE_WAL_FULL,
    NATIVE_WAL_FULL_FRESH,
    PAGE_SIZE,
    PAGEKV,
    WARM_UP_PAGES,
    NativeSubject,
    Subject,
    Workspace,
    WriterGroup,
)
from pagekv.bench.targets import TargetResult, evaluate
from pagekv.bench.workloads import Sizes, default_selection, writers_workload
from pagekv.cli import main
from pagekv.cli.benchmark import BenchProgress
from pagekv.cli.progress import StatusLine
from pagekv.kv import ActorKv, FlushCounts, KvStore, redact_url
from pagekv.kv.wrappers import KvWrapper

TARGET_STATUSES = {"met", "missed", "not measured", "n/a"}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def run_bench(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str, str]:
    out = tmp_path / "bench.json"
    assert main(["bench", *argv, "--json", str(out)]) == 0
    captured = capsys.readouterr()
    return json.loads(out.read_text()), captured.out, captured.err


QuickRun = tuple[dict[str, Any], str, str, BenchReport]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    """One `pagekv bench --quick` on memory://, every default workload (a few seconds), into
    streams that are not terminals; the report object too, to render it at other widths."""
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    reports: list[BenchReport] = []
    print_report = pagekv.cli.benchmark.print_report

    def keep(report: BenchReport) -> None:
        reports.append(report)
        print_report(report)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pagekv.cli.benchmark, "print_report", keep)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["bench", "--quick", "--kv", "memory://", "--json", str(out)])
    assert code == 0
    (report,) = reports
    return json.loads(out.read_text()), stdout.getvalue(), stderr.getvalue(), report


@pytest.fixture(scope="module")
def quick(quick_run: QuickRun) -> tuple[dict[str, Any], str, str]:
    doc, out, err, _ = quick_run
    return doc, out, err


def test_quick_run_prints_every_workload_and_the_targets(
    quick: tuple[dict[str, Any], str, str],
) -> None:
    doc, out, err = quick
    for name in default_selection(large=False):
        assert f"\n{name} — " in out, name
    assert "\n\nTargets\n" in out
    assert "native MEMORY/OFF/EXCL" in out and "native :memory:" in out
    assert "native median time per op ÷ pagekv median time per op" in out  # direction stated
    # Progress into a pipe: a line every 5 s at most and the last one, not a line per step.
    lines = err.splitlines()
    assert re.fullmatch(r"pagekv bench: (\d+)/\1 steps, \d+ s, done", lines[-1]), lines[-1]
    assert len(lines) <= 2 + doc["elapsed_s"] / 5
    assert "\r" not in err
    assert doc["command"].startswith("pagekv bench --kv memory:// --quick --json ")


def test_no_internal_wording(
    quick: tuple[dict[str, Any], str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Report, help and docstrings say what a target is, not which issue asked for it."""
    doc, out, _ = quick
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = capsys.readouterr().out
    modules = (
        pagekv.bench.targets,
        pagekv.bench.results,
        pagekv.bench.sampling,
        pagekv.cli.benchmark,
    )
    texts = [out, help_text, json.dumps(doc["targets"], ensure_ascii=False)]
    texts += [m.__doc__ or "" for m in modules]
    for text in texts:
        assert not re.search(r"issue[ -]4|the issue's", text, re.IGNORECASE), text[:200]
    assert "performance targets" in help_text


def test_target_names_say_what_ran(quick: tuple[dict[str, Any], str, str]) -> None:
    """A --quick run without latency: sizes from the run, no latency in a name, and a threshold
    set for the full size not judged at the smaller one."""
    doc, out, _ = quick
    targets = {t["target"]: t for t in doc["targets"]}
    assert {
        "1 MiB insert: KV round trips",
        "10 MiB insert: KV round trips",
        "cold read of 100 pages: KV round trips",
        "8 MiB cold scan: KV round trips",
        "8 MiB cold scan throughput, memory://",
        "10 MiB insert: write amplification before compaction",
        "wake of a 16 MiB database",
    } <= set(targets)
    for name in targets:
        assert "20 ms" not in name and "50 MiB" not in name and "100 MiB" not in name, name
    blob = targets["1 MiB insert: KV round trips"]
    assert blob["status"] in ("met", "missed")  # same size at --quick: judged
    assert f"≈ {blob['value'] * 20:,.0f} ms at 20 ms a round trip" in blob["note"]
    for name in ("8 MiB cold scan: KV round trips", "8 MiB cold scan throughput, memory://"):
        scan = targets[name]
        assert scan["status"] == "n/a", scan
        assert scan["note"].startswith("n/a at --quick size: ") and "50 MiB scan" in scan["note"]
        assert scan["value"] is not None  # still measured and shown
    wake = targets["wake of a 16 MiB database"]
    assert wake["status"] in ("met", "missed") and "judged at 16 MiB" in wake["note"]
    assert "16 MiB open = round trips of the 1 MiB open" in wake["criterion"]
    assert "n/a at --quick size: ≤ 64 is set for a 50 MiB scan" in out


def _result(name: str, round_trips: float, ratio: float | None = None) -> WorkloadResult:
    """A workload result with only what the targets read: pagekv's round trips and median, and
    its speed ratio to native MEMORY/OFF/EXCLUSIVE."""
    summary = Summary(
        median_s_per_op=0.8,
        min_s_per_op=0.7,
        max_s_per_op=0.9,
        q1_s_per_op=0.75,
        q3_s_per_op=0.85,
        ops_per_s=1.25,
        mib_per_s=None,
        round_trips_per_op=round_trips,
        round_trips_per_op_max=round_trips,
        round_trips_by_op={"list": round_trips},
    )
    pagekv = SystemResult("pagekv", "pagekv", "pagekv", "", summary=summary)
    ratios = []
    if ratio is not None:
        base = "native-memory-off-exclusive"
        ratios.append(Ratio(base, "native MEMORY/OFF/EXCL", ratio, [ratio], ratio, ratio))
    return WorkloadResult(name, name, "op", "cold", None, [pagekv], ratios, 1.0)


def test_size_dependent_thresholds_are_judged_at_the_full_size_only() -> None:
    results = [_result("cold-scan", 35, ratio=0.35), _result("blob-1m", 2)]

    def by_workload(sizes: Sizes, latency_ms: float = 0) -> dict[str, TargetResult]:
        targets = evaluate(results, "memory://", latency_ms, sizes)
        return {t.target: t for t in targets}

    full = by_workload(Sizes.full())
    assert full["50 MiB cold scan: KV round trips"].status == "met"
    assert full["50 MiB cold scan throughput, memory://"].status == "met"
    assert full["wake of a 100 MiB database"].status == "not measured"
    quick = by_workload(Sizes.quick())
    for name in ("8 MiB cold scan: KV round trips", "8 MiB cold scan throughput, memory://"):
        assert quick[name].status == "n/a" and "set for a 50 MiB scan" in quick[name].note
        assert quick[name].value == full[name.replace("8 MiB", "50 MiB")].value
    assert quick["1 MiB insert: KV round trips"].status == "met"  # the same 1 MiB at --quick
    # A 64-round-trip scan of 8 MiB would be bad, but it is still not judged against 50 MiB's.
    assert by_workload(Sizes.quick())["8 MiB cold scan: KV round trips"].status == "n/a"
    # Latency: the note gives the time measured, not one implied at 20 ms; speed is n/a.
    slow = by_workload(Sizes.full().for_latency(20), latency_ms=20)
    blob = slow["1 MiB insert: KV round trips"]
    assert blob.status == "met" and blob.note == "median 800 ms measured at 20 ms a round trip"
    assert slow["50 MiB cold scan throughput, memory://"].status == "n/a"
    assert by_workload(Sizes.full())["1 MiB insert: KV round trips"].note == (
        "≈ 40 ms at 20 ms a round trip"
    )


def test_report_fits_the_width_it_is_given(quick_run: QuickRun) -> None:
    _, out, _, report = quick_run
    # Not a terminal (the fixture's stdout): every column, however wide.
    assert "columns left out" not in out
    assert max(len(line) for line in out.splitlines()) > 200
    assert render(report) == out
    order = [column for group in DROP_ORDER for column in group]
    previous = order
    for width in (80, 100, 120, 160, 240, 400):
        text = render(report, width)
        assert max(len(line) for line in text.splitlines()) <= width, width
        hidden = hidden_columns(report.workloads, width)
        assert hidden == order[: len(hidden)]  # least important first
        assert set(hidden) <= set(previous)  # more room, fewer columns left out
        previous = hidden
        head, *tables, _targets, _total = text.split("\n\n")
        said = " ".join(head.split())  # the header's lines wrap, their words kept
        assert pagekv.bench.results.RATIO_DEFINITION in said
        assert "left out" not in "\n\n".join(tables)  # said once, under the header
        if hidden:
            assert f"columns left out to fit {width} columns: {', '.join(hidden)} " in said
            assert said.count("left out") == 1 and "(--json has every figure)" in said
        else:
            assert "left out" not in said
        for table in tables:
            columns = next(line for line in table.splitlines() if line.startswith("  system "))
            for header in ("median/op", "pagekv speed", "RT/op"):
                assert header in columns
            assert ("IQR" in columns) == ("IQR" not in hidden)
            assert ("CPU/op" in columns) == ("CPU/op" not in hidden)
    assert hidden_columns(report.workloads, 80)[:4] == ["IQR", "py peak", "sqlite peak", "WA+comp"]
    assert hidden_columns(report.workloads, None) == []


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_width_is_the_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((72, 24)))
    assert terminal_width(_Tty()) == 72
    assert terminal_width(io.StringIO()) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_into_a_pipe_is_a_line_every_5_seconds() -> None:
    clock, stream = _Clock(), io.StringIO()
    progress = BenchProgress(170, StatusLine(stream, keep=False, clock=clock))
    for n in range(1, 171):
        clock.now += 0.5
        progress.step(f"step {n}")
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 18  # at 5, 10, ... 85 s, and the last one
    assert lines[0] == "pagekv bench: 10/170 steps, 5 s (step 10)"
    assert lines[1] == "pagekv bench: 20/170 steps, 10 s (step 20)"
    assert lines[-1] == "pagekv bench: 170/170 steps, 85 s, done"
    stopped = io.StringIO()
    BenchProgress(9, StatusLine(stopped, clock=clock)).finish(stopped=True)
    assert stopped.getvalue() == "pagekv bench: 0/9 steps, 0 s, stopped\n"


ERASE_LINE = "\r\x1b[2K"
"""What rich's live display writes before it redraws its one line."""


def test_progress_on_a_terminal_rewrites_one_line() -> None:
    clock, stream = _Clock(), _Tty()
    progress = BenchProgress(3, StatusLine(stream, keep=False, clock=clock, width=40))
    for n in range(3):
        clock.now += 0.5
        progress.step(f"cold-scan rep {n + 1}/3 native MEMORY/OFF/EXCL: 4.5 ms/scan")
    drawn = stream.getvalue()
    progress.finish()
    assert "\n" not in drawn  # one line, drawn over and over
    shown = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", s) for s in drawn.split(ERASE_LINE)]
    assert len(shown) == 3
    assert shown[0].startswith("[  1/3]    0.5s  cold-scan rep 1/3")
    assert shown[2].startswith("[  3/3]    1.5s  cold-scan rep 3/3")
    assert all(len(line) <= 40 for line in shown)  # cropped: a wrapped line cannot be redrawn
    # At the end the line is removed: the cursor goes back up to it and erases it.
    assert stream.getvalue().endswith("\x1b[1A\x1b[2K")


def test_no_progress_is_silent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for stream in (io.StringIO(), _Tty()):
        progress = BenchProgress(2, StatusLine(stream, enabled=False))
        progress.step("x")
        progress.finish()
        assert stream.getvalue() == ""
    argv = ["--quick", "--workload", "hot-update", "--repeat", "1", "--no-progress"]
    _, out, err = run_bench(argv, tmp_path, capsys)
    assert err == "" and "hot-update — " in out


def test_json_has_every_field(quick: tuple[dict[str, Any], str, str]) -> None:
    doc, _, _ = quick
    assert set(doc) == _fields(BenchReport)
    assert set(doc["machine"]) == _fields(Machine)
    for key in ("python", "sqlite", "apsw", "cpu_count"):
        assert doc["machine"][key], key
    assert set(doc["config"]) == _fields(Config)
    config = doc["config"]
    assert config["quick"] is True and config["repeat"] == 3 and config["latency_ms"] == 0
    assert config["systems"] == ["pagekv", "native-memory-off-exclusive", "native-in-memory"]
    assert [w["name"] for w in doc["workloads"]] == default_selection(large=False)
    assert "blob-50m" not in config["workloads"]
    for workload in doc["workloads"]:
        assert set(workload) == _fields(WorkloadResult)
        by_name = {s["system"]: s for s in workload["systems"]}
        assert list(by_name) == config["systems"]
        for name, system in by_name.items():
            assert set(system) == _fields(SystemResult)
            if system["skipped"]:
                assert name == "native-in-memory" and WORKLOADS[workload["name"]].needs_reopen
                assert system["samples"] == [] and system["summary"] is None
                continue
            assert set(system["summary"]) == _fields(Summary)
            assert set(system["memory"]) == _fields(MemoryUse)
            assert len(system["samples"]) == 3
            assert sorted(s["rep"] for s in system["samples"]) == [0, 1, 2]
            for sample in system["samples"]:
                assert set(sample) == _fields(Sample)
                assert sample["seconds"] > 0 and sample["ops"] > 0
                assert sample["cpu_seconds"] > 0
            assert system["summary"]["cpu_s_per_op"] == pytest.approx(
                statistics.median(s["cpu_seconds"] / s["ops"] for s in system["samples"])
            )
        pagekv = by_name["pagekv"]["summary"]
        assert pagekv["round_trips_per_op"] is not None
        assert pagekv["kv_bytes_written_per_op"] is not None
        for ratio in workload["ratios"]:
            assert set(ratio) == _fields(Ratio)
    for target in doc["targets"]:
        assert set(target) == _fields(TargetResult)
        assert target["status"] in TARGET_STATUSES
    assert len(doc["targets"]) == 13


def _median_per_op(system: dict[str, Any]) -> float:
    return statistics.median(s["seconds"] / s["ops"] for s in system["samples"])


def test_ratios_come_from_paired_samples(quick: tuple[dict[str, Any], str, str]) -> None:
    doc, _, _ = quick
    checked = 0
    for workload in doc["workloads"]:
        systems = {s["system"]: s for s in workload["systems"]}
        pagekv = systems["pagekv"]
        own = {s["rep"]: s["seconds"] / s["ops"] for s in pagekv["samples"]}
        assert pagekv["summary"]["median_s_per_op"] == pytest.approx(_median_per_op(pagekv))
        baselines = [n for n, s in systems.items() if n != "pagekv" and not s["skipped"]]
        assert [r["baseline"] for r in workload["ratios"]] == baselines
        for ratio in workload["ratios"]:
            native = systems[ratio["baseline"]]
            expected = _median_per_op(native) / _median_per_op(pagekv)
            assert ratio["speed_ratio"] == pytest.approx(expected)
            paired = [s["seconds"] / s["ops"] / own[s["rep"]] for s in native["samples"]]
            assert ratio["paired"] == pytest.approx(paired)
            assert ratio["paired_min"] == pytest.approx(min(paired))
            assert ratio["paired_max"] == pytest.approx(max(paired))
            checked += 1
        # Interleaved: within each repetition every system ran once, in a rotating order.
        for rep in range(3):
            orders = sorted(
                s["order"]
                for system in systems.values()
                for s in system["samples"]
                if s["rep"] == rep
            )
            assert orders == list(range(len(orders)))
    reopened = sum(w["prepare"] in ("cold", "closed") for w in doc["workloads"])  # no :memory:
    assert checked == 2 * len(doc["workloads"]) - reopened


def test_kv_counts_are_those_of_the_design(quick: tuple[dict[str, Any], str, str]) -> None:
    """Counts, not timings: they hold on any machine."""
    doc, _, _ = quick
    pagekv = {
        w["name"]: next(s for s in w["systems"] if s["system"] == "pagekv")["summary"]
        for w in doc["workloads"]
    }
    assert pagekv["hot-update"]["round_trips_by_op"] == {"write": 1.0}
    assert pagekv["commit-100"]["round_trips_per_op"] == 1.0
    assert pagekv["blob-1m"]["write_amplification"] == pytest.approx(1.0, abs=0.1)
    assert pagekv["blob-10m"]["write_amplification_with_compaction"] == pytest.approx(2.0, abs=0.2)
    assert pagekv["wake-small"]["round_trips_per_op"] == pagekv["wake-big"]["round_trips_per_op"]
    # The hot rows come with the open (preload hints), in its one read round trip.
    assert pagekv["wake-lookup"]["round_trips_by_op"] == {"get": 1, "list": 1, "takeover": 1}
    assert pagekv["cold-read-100"]["kv_bytes_written_per_op"] == 0


def test_workload_selection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, out, _ = run_bench(
        ["--workload", "blob-1m", "hot-update", "--workload", "blob-1m", "--repeat", "1"],
        tmp_path,
        capsys,
    )
    assert [w["name"] for w in doc["workloads"]] == ["blob-1m", "hot-update"]
    assert doc["config"]["repeat"] == 1 and doc["config"]["quick"] is False
    assert "--workload blob-1m hot-update" in doc["command"]
    statuses = {t["target"]: t["status"] for t in doc["targets"]}
    assert statuses["1 MiB insert: KV round trips"] in ("met", "missed")
    assert statuses["cold read of 100 pages: KV round trips"] == "not measured"
    assert statuses["50 MiB cold scan: KV round trips"] == "not measured"
    assert "commit-1 —" not in out


def test_latency_is_paid_per_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, out, _ = run_bench(
        ["--quick", "--workload", "cold-read-100", "--latency-ms", "5", "--repeat", "1"],
        tmp_path,
        capsys,
    )
    assert "+5 ms simulated latency" in out
    (workload,) = doc["workloads"]
    pagekv = next(s for s in workload["systems"] if s["system"] == "pagekv")
    (sample,) = pagekv["samples"]
    assert sample["seconds"] >= sum(sample["round_trips"].values()) * 0.005


def test_file_store_uses_durable_baselines_next_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    doc, out, _ = run_bench(
        [
            "--kv",
            f"file:{store}",
            "--quick",
            "--workload",
            "hot-update",
            "blob-1m",
            "--repeat",
            "2",
        ],
        tmp_path,
        capsys,
    )
    warm, fresh = "native-wal-full", "native-wal-full-fresh"
    assert doc["config"]["systems"] == ["pagekv", "native-delete-full", warm, fresh]
    assert Path(doc["config"]["scratch_dir"]).parent == store
    assert not Path(doc["config"]["scratch_dir"]).exists()  # native files cleaned up
    statuses = {t["target"]: t["status"] for t in doc["targets"]}
    target = "one-row commits on a warm database, file:// vs WAL+FULL"
    assert statuses[target] == "not measured"  # no commit-1
    assert statuses["one-row commits, memory://"] == "n/a"
    assert "native DELETE+FULL" in out and "native WAL+FULL" in out
    hot, blob = ({s["system"]: s for s in w["systems"]} for w in doc["workloads"])
    # Warm: the WAL had its full size before the first timed sample and kept it through them.
    assert hot[warm]["wal_bytes_before"] > WARM_UP_PAGES * PAGE_SIZE
    assert hot[warm]["wal_bytes_after"] == hot[warm]["wal_bytes_before"]
    assert hot[fresh]["wal_bytes_before"] is None
    assert "on a new file every sample" in hot[fresh]["settings"]
    assert "native WAL+FULL fresh" in out
    assert fresh not in blob and blob[warm]["wal_bytes_before"] is None  # a one-shot: fresh
    assert "fresh: a new database file for every sample" in out


def test_extra_baselines_join_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--quick", "--workload", "hot-update", "--repeat", "1", "--baseline", "wal-normal"]
    argv += ["memory-off-exclusive", "--baseline", "memory-off"]
    doc, out, _ = run_bench(argv, tmp_path, capsys)
    added = ["native-wal-normal", "native-memory-off"]
    assert doc["config"]["systems"] == [
        "pagekv",
        "native-memory-off-exclusive",  # the matched baseline, named again: listed once
        "native-in-memory",
        *added,
    ]
    assert "--baseline wal-normal memory-off-exclusive memory-off" in doc["command"]
    (workload,) = doc["workloads"]
    settings = {s["system"]: s["settings"] for s in workload["systems"]}
    assert "journal_mode=WAL, synchronous=NORMAL on a file" in settings["native-wal-normal"]
    assert "locking_mode" not in settings["native-memory-off"]
    assert [r["baseline"] for r in workload["ratios"]][-2:] == added
    assert "native WAL+NORMAL" in out and "native MEMORY/OFF " in out
    statuses = {t["target"]: t["status"] for t in doc["targets"]}
    assert statuses["one-row commits, memory://"] == "not measured"  # no commit-1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'; choose from: commit-1, commit-100"),
        (["--repeat", "0"], "--repeat: must be at least 1, got 0"),
        (["--repeat", "two"], "--repeat: expected a whole number, got 'two'"),
        (["--latency-ms", "-1"], "--latency-ms: must be >= 0, got -1"),
        (["--kv", "bogus://x"], "--kv: unknown KV URL scheme 'bogus'"),
        (["--json", "/nonexistent-dir/x.json"], "--json: directory '/nonexistent-dir' does not"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--baseline", "wal"], "unknown baseline 'wal'; choose from: delete-full, wal-full"),
    ],
)
def test_bad_arguments_fail_clearly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "usage: pagekv" in err


def test_passwords_in_the_store_url_are_not_printed_or_saved() -> None:
    assert redact_url("postgresql://u:secret@h:5432/db?x=1") == "postgresql://u:***@h:5432/db?x=1"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("file:./store") == "file:./store"
    assert redact_url("postgresql://u:p%40ss@h/db") == "postgresql://u:***@h/db"


def test_json_alone_prints_the_document_as_every_commands_json_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--json` took a file name only; `inspect --json` prints: now both print the document."""
    code = main(["bench", "--quick", "--workload", "commit-1", "--json", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["command"].endswith("--json")
    assert [w["name"] for w in doc["workloads"]] == ["commit-1"]
    assert doc["machine"]["build"].startswith(("compiled", "interpreted")), "which build ran"


def test_a_warm_native_database_is_reused_and_a_fresh_one_is_not(tmp_path: Path) -> None:
    workspace = Workspace("memory://", 0, scratch=tmp_path)
    harness = Harness(
        workspace, WORKLOADS["commit-1"], [NATIVE_WAL_FULL, NATIVE_WAL_FULL_FRESH], Sizes.quick()
    )
    try:
        for spec in harness.systems:
            harness.open(spec)
        warm = harness.ready(NATIVE_WAL_FULL)
        assert isinstance(warm, NativeSubject) and warm.path is not None
        grown = warm.wal_bytes()
        assert grown is not None and grown > WARM_UP_PAGES * PAGE_SIZE
        assert warm.execute("SELECT count(*) FROM sqlite_schema").fetchall() == [(1,)]
        assert warm.execute("PRAGMA freelist_count").fetchall() == [(0,)]  # no pages to refill
        for _ in range(2):
            WORKLOADS["commit-1"].body(warm, [bytes(100)] * 300)
            harness.done(warm)
            assert harness.ready(NATIVE_WAL_FULL) is warm
        assert warm.wal_bytes() == grown
        assert warm.execute("SELECT count(*) FROM t").fetchall() == [(600,)]
        first = harness.ready(NATIVE_WAL_FULL_FRESH)
        assert isinstance(first, NativeSubject) and first.path is not None
        assert (first.wal_bytes() or 0) < grown
        harness.done(first)
        assert not first.path.exists()
        second = harness.ready(NATIVE_WAL_FULL_FRESH)
        assert second is not first
        harness.done(second)
    finally:
        harness.close()
        workspace.close()


class _Connection:
    """Stands in for a database's connection: every writer's first commit waits at a barrier
    for all the others', which only N threads running at once can pass."""

    def __init__(self, barrier: threading.Barrier, threads: set[str]) -> None:
        self.barrier = barrier
        self.threads = threads
        self.rows = 0

    def execute(self, sql: str, bindings: tuple[object, ...] | None = None) -> None:
        if self.rows == 0:
            self.threads.add(threading.current_thread().name)
            self.barrier.wait(timeout=10)
        self.rows += 1


class _Member(Subject):
    def __init__(self, connection: _Connection) -> None:
        self.spec = PAGEKV
        self.connection = connection  # type: ignore[assignment]

    def close(self) -> None: ...

    def open(self) -> None: ...

    def destroy(self) -> None: ...


def test_the_writers_body_runs_every_writer_at_once_on_its_own_database() -> None:
    n, threads = 4, set[str]()
    barrier = threading.Barrier(n)
    connections = [_Connection(barrier, threads) for _ in range(n)]
    group = WriterGroup(PAGEKV.with_writers(n), [_Member(c) for c in connections])
    rows = [[bytes(100)] * (5 + i) for i in range(n + 2)]  # inputs for more writers than 4
    assert WORKLOADS["writers"].body(group, rows) == sum(5 + i for i in range(n))
    assert [c.rows for c in connections] == [5 + i for i in range(n)]
    assert len(threads) == n and threading.current_thread().name not in threads


class _SpyStore:
    """The bench's store, seen: the namespaces opened on it, and flush counts of a durable
    store (one flush per two writes) where it has none."""

    def __init__(self, inner: KvStore) -> None:
        self.inner = inner
        self.opened: list[str] = []
        self.writes = 0

    def namespace(self, actor_id: str) -> ActorKv:
        self.opened.append(actor_id)
        spy = self

        class Counted(KvWrapper):
            def _call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
                if op == "write":
                    spy.writes += 1
                return fn(*args, **kwargs)

        return Counted(self.inner.namespace(actor_id))

    def flush_counts(self) -> FlushCounts:
        return FlushCounts(writes=self.writes, flushes=self.writes // 2, folds=0)

    def close(self) -> None:
        self.inner.close()


def test_writers_run_as_namespaces_of_one_store_with_flushes_counted(tmp_path: Path) -> None:
    workspace = Workspace("memory://", 0, scratch=tmp_path)
    spy = _SpyStore(workspace.store)
    workspace.store = spy
    sizes = Sizes.quick()
    workload = writers_workload((3,))
    progress = BenchProgress(0, StatusLine(enabled=False))
    try:
        (result,) = run_workloads(workspace, [workload], [PAGEKV], sizes, 2, progress)
    finally:
        workspace.close()
    assert workload.writers == (1, 3)
    names = [s.system for s in result.systems]
    assert names == ["pagekv-x1", "pagekv-x3"]
    one, three = result.systems
    assert (one.writers, three.writers) == (1, 3)
    assert len(spy.opened) == 4 and len(set(spy.opened)) == 4  # 1 + 3 databases, one store
    for sample in three.samples:
        assert sample.ops == 3 * sizes.writer_commits
        assert sample.counters["commits"] == 3 * sizes.writer_commits
        assert sample.store_writes == sample.round_trips["write"] > 0
        assert sample.flushes is not None and abs(sample.flushes - sample.store_writes / 2) <= 1
    assert three.summary is not None and three.summary.flushes_per_op is not None
    assert three.summary.flushes_per_op == pytest.approx(0.5, abs=0.02)
    assert three.scaling == pytest.approx(
        three.summary.ops_per_s / one.summary.ops_per_s  # type: ignore[union-attr]
    )
    paired = {s.rep: s.seconds_per_op for s in one.samples}
    assert three.scaling_paired == pytest.approx(
        [paired[s.rep] / s.seconds_per_op for s in three.samples]
    )
    assert three.memory is None  # no memory pass for concurrent writers


def test_writers_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, out, _ = run_bench(["--quick", "--writers", "2", "--repeat", "2"], tmp_path, capsys)
    (workload,) = doc["workloads"]  # --writers without --workload: the concurrent one alone
    assert workload["name"] == "writers" and doc["config"]["writers"] == [1, 2]
    assert doc["command"].startswith("pagekv bench --kv memory:// --writers 2 --quick --repeat 2 ")
    systems = {s["system"]: s for s in workload["systems"]}
    assert list(systems) == [
        "pagekv-x1",
        "native-memory-off-exclusive-x1",
        "native-in-memory-x1",
        "pagekv-x2",
        "native-memory-off-exclusive-x2",
        "native-in-memory-x2",
    ]
    assert systems["pagekv-x2"]["scaling"] is not None and systems["pagekv-x1"]["scaling"] is None
    assert systems["native-memory-off-exclusive-x2"]["scaling"] is not None
    for s in systems["pagekv-x2"]["samples"]:
        assert s["ops"] == 2 * Sizes.quick().writer_commits
    # pagekv is compared with native SQLite at the same number of writers
    assert [r["baseline"] for r in workload["ratios"]] == [
        "native-memory-off-exclusive-x1",
        "native-in-memory-x1",
        "native-memory-off-exclusive-x2",
        "native-in-memory-x2",
    ]
    table = out.split("\nwriters — ")[1].split("\n\n")[0]
    header = table.splitlines()[1]
    assert "scaling" in header and "flush/op" in header
    assert re.search(r"^  pagekv x2 .* n/a ", table, re.MULTILINE)  # memory:// flushes nothing
    assert "flush/op: n/a (memory:// makes nothing durable)" in out
    statuses = {t["target"]: t for t in doc["targets"]}
    assert statuses["64 concurrent writers: flushes per commit, file://"]["status"] == "n/a"


def _writers_result(scaling: float, flushes: float | None) -> WorkloadResult:
    summary = dataclasses.replace(
        _result("writers", 1).systems[0].summary,  # type: ignore[arg-type]
        flushes_per_op=flushes,
        store_writes_per_op=1.0,
    )
    one = SystemResult("pagekv-x1", "pagekv x1", "pagekv", "", summary=summary, writers=1)
    many = SystemResult(
        "pagekv-x64", "pagekv x64", "pagekv", "", summary=summary, writers=64, scaling=scaling
    )
    many.scaling_paired = [scaling * 0.9, scaling * 1.1]
    return WorkloadResult("writers", "writers", "commit", "warm", None, [one, many], [], 1.0)


def test_the_concurrency_targets() -> None:
    def targets(url: str, result: WorkloadResult) -> dict[str, TargetResult]:
        found = {t.target: t for t in evaluate([result], url, 0, Sizes.full())}
        return {k: v for k, v in found.items() if k.startswith("64 ")}

    flushes = "64 concurrent writers: flushes per commit, file://"
    scaling = "64 writers vs 1, one-row commits, file:?flush_delay_ms=2"
    good = _writers_result(12.5, 0.05)
    on_file = targets("file:/x", good)
    assert on_file[flushes].status == "met" and on_file[flushes].value == 0.05
    assert on_file[scaling].status == "n/a" and "flush_delay_ms=2" in on_file[scaling].note
    delayed = targets("file:/x?flush_delay_ms=2", good)
    assert delayed[scaling].status == "met" and delayed[scaling].measured == "12.50x"
    assert delayed[scaling].note == "per repetition 11.25x..13.75x"
    bad = targets("file:/x?flush_delay_ms=2", _writers_result(3.0, 0.9))
    assert bad[flushes].status == "missed" and bad[scaling].status == "missed"
    uncounted = targets("file:/x", _writers_result(3.0, None))
    assert uncounted[flushes].status == "n/a" and "no count" in uncounted[flushes].note
    assert targets("memory://", good)[flushes].status == "n/a"
    absent = {t.target: t for t in evaluate([], "file:/x?flush_delay_ms=2", 0, Sizes.full())}
    assert absent[flushes].status == absent[scaling].status == "not measured"
    # Native SQLite pays no flush delay: speed ratios to it are not judged then.
    commits = {t.target: t for t in evaluate([], "file:/x?flush_delay_ms=2", 0, Sizes.full())}
    assert commits["one-row commits on a warm database, file:// vs WAL+FULL"].status == "n/a"


def test_the_file_stores_flushes_per_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--kv", f"file:{tmp_path / 'store'}", "--quick", "--writers", "4", "--repeat", "1"]
    doc, out, _ = run_bench(argv, tmp_path, capsys)
    systems = {s["system"]: s for s in doc["workloads"][0]["systems"]}
    for name in ("pagekv-x1", "pagekv-x4"):
        per_commit = systems[name]["summary"]["flushes_per_op"]
        assert per_commit is not None and 0 < per_commit <= 1.01, name
    assert systems["native-wal-full-x1"]["summary"]["flushes_per_op"] is None
    assert "flush/op: durable flushes of the store per op" in out


@pytest.mark.parametrize(("url", "synced"), [("file:{tmp}/store", True), ("memory://", False)])
def test_a_durable_sample_starts_after_the_last_ones_writeback(
    url: str, synced: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(pagekv.bench.sampling.os, "sync", lambda: syncs.append(1))
    workspace = Workspace(url.format(tmp=tmp_path), 0, scratch=tmp_path)
    try:
        sizes = dataclasses.replace(Sizes.quick(), hot_updates=5)
        progress = BenchProgress(0, StatusLine(enabled=False))
        run_workloads(
            workspace,
            [WORKLOADS["hot-update"]],
            [PAGEKV, NATIVE_WAL_FULL],
            sizes,
            2,
            progress,
            memory=False,
        )
    finally:
        workspace.close()
    assert len(syncs) == (4 if synced else 0)  # 2 repetitions x 2 systems
