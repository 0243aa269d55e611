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
import statistics
from pathlib import Path
from typing import Any

import pytest

from pagekv.bench import WORKLOADS, Summary
from pagekv.bench.report import BenchReport, Config, Machine
from pagekv.bench.runner import MemoryUse, Ratio, Sample, SystemResult, WorkloadResult
from pagekv.bench.targets import TargetResult
from pagekv.bench.workloads import default_selection
from pagekv.cli import main
from pagekv.kv import redact_url

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


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    """One `pagekv bench --quick` on memory://, every default workload (a few seconds)."""
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["bench", "--quick", "--kv", "memory://", "--json", str(out)])
    assert code == 0
    return json.loads(out.read_text()), stdout.getvalue(), stderr.getvalue()


def test_quick_run_prints_every_workload_and_the_targets(
    quick: tuple[dict[str, Any], str, str],
) -> None:
    doc, out, err = quick
    for name in default_selection(large=False):
        assert f"\n{name} — " in out, name
    assert "Targets (issue 4)" in out
    assert "native MEMORY/OFF/EXCL" in out and "native :memory:" in out
    assert "native median time per op ÷ pagekv median time per op" in out  # direction stated
    assert "[  1/" in err and "rep 3/3" in err  # progress on stderr
    assert doc["command"].startswith("pagekv bench --kv memory:// --quick --json ")


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
        pagekv = by_name["pagekv"]["summary"]
        assert pagekv["round_trips_per_op"] is not None
        assert pagekv["kv_bytes_written_per_op"] is not None
        for ratio in workload["ratios"]:
            assert set(ratio) == _fields(Ratio)
    for target in doc["targets"]:
        assert set(target) == _fields(TargetResult)
        assert target["status"] in TARGET_STATUSES
    assert len(doc["targets"]) == 11


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
    assert statuses["1 MiB insert at 20 ms latency"] in ("met", "missed")
    assert statuses["cold read of 100 pages at 20 ms"] == "not measured"
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
        ["--kv", f"file:{store}", "--quick", "--workload", "hot-update", "--repeat", "1"],
        tmp_path,
        capsys,
    )
    assert doc["config"]["systems"] == ["pagekv", "native-delete-full", "native-wal-full"]
    assert Path(doc["config"]["scratch_dir"]).parent == store
    assert not Path(doc["config"]["scratch_dir"]).exists()  # native files cleaned up
    statuses = {t["target"]: t["status"] for t in doc["targets"]}
    assert statuses["one-row commits, file:// vs WAL+FULL"] == "not measured"  # no commit-1
    assert statuses["one-row commits, memory://"] == "n/a"
    assert "native DELETE+FULL" in out and "native WAL+FULL" in out


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
