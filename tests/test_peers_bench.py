"""`benchmarks/peers/workflows.py`: it parses, reports and runs pagekv's side without DBOS
installed (DBOS is an optional extra); with DBOS installed a tiny run of DBOS with WAL+FULL
completes too, with the pragmas it claims. Timings are never asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "peers" / "workflows.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_workflows", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_script_parses_without_importing_dbos() -> None:
    script = _script()
    args = script.parse_args(["--reps", "2", "--systems", "pagekv", "dbos-wal-full"])
    assert (args.reps, args.requests, args.systems) == (2, 200, ["pagekv", "dbos-wal-full"])
    assert "dbos" not in sys.modules
    with pytest.raises(SystemExit):
        script.parse_args(["--requests", "4", "--concurrency", "8"])


def test_ratios_are_medians_of_each_repetitions_ratio() -> None:
    script = _script()
    sizes = script.Sizes(requests=10, concurrency=2, steps=50)

    def run(pagekv: float, dbos: float) -> dict[str, dict[str, object]]:
        return {
            "pagekv": {"figures": dict.fromkeys(script.CASES, pagekv), "setup": {}},
            "dbos-wal-full": {"figures": dict.fromkeys(script.CASES, dbos), "setup": {}},
        }

    table = script.report(
        [run(100, 50), run(60, 60), run(90, 30)], sizes, ["pagekv", "dbos-wal-full"]
    )
    row = next(line for line in table.splitlines() if "50-step" in line)
    assert row.split(" | ")[1:] == ["90 (60-100)", "50 (30-60)", "2.00x (1.00-3.00) |"]


def test_a_tiny_run(tmp_path: Path) -> None:
    """pagekv's side always (it breaks when pagekv's API moves), DBOS's when it is installed."""
    with_dbos = importlib.util.find_spec("dbos") is not None
    systems = ["pagekv", "dbos-wal-full"] if with_dbos else ["pagekv"]
    out = tmp_path / "figures.json"
    command = [sys.executable, str(SCRIPT), "--reps", "1", "--requests", "2"]
    command += ["--concurrency", "2", "--steps", "3", "--dir", str(tmp_path), "--json", str(out)]
    subprocess.run([*command, "--systems", *systems], check=True, capture_output=True, timeout=120)
    (run,) = json.loads(out.read_text())["runs"]
    assert sorted(run) == sorted(systems)
    assert all(v > 0 for s in run.values() for v in s["figures"].values())
    if with_dbos:
        assert run["dbos-wal-full"]["setup"]["connections"] == ["journal_mode=wal synchronous=2"]


HTTP_PEERS = SCRIPT.parent / "http_peers.py"


def _http_peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_http", HTTP_PEERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_http_comparison_reports_each_rounds_ratio_and_cpu_per_action() -> None:
    script = _http_peers()
    args = script.parse_args(["--rounds", "2", "--seconds", "1"])

    def sample(rate: float, cpu: float) -> object:
        return script.Sample(script.Run(rate, 1.0, 2.0), cpu)

    samples = {
        ("pagekv", action, clients): [sample(100, 500), sample(300, 700)]
        for action, clients in script.CASES
    } | {
        ("miniflare", action, clients): [sample(200, 400), sample(100, 600)]
        for action, clients in script.CASES
    }
    samples["rivetkit", "bump", 1] = [sample(10, 9000), sample(20, 8000)]
    rows = [
        r.split(" | ")[1:]
        for r in script.report(samples, ["miniflare", "rivetkit"], args).splitlines()[4:]
    ]
    assert rows[:3] == [
        ["1", "pagekv", "200 (100-300)", "", "600 |"],
        ["1", "miniflare", "150 (100-200)", "1.75x (0.50x-3.00x)", "500 |"],
        ["1", "rivetkit", "15 (10-20)", "12.50x (10.00x-15.00x)", "8,500 |"],
    ], rows
    assert [r[1] for r in rows[3:5]] == ["pagekv", "miniflare"]  # rivetkit has no bump_sql
    failed = {("rivetkit", "bump", 1): script.Failed("timed out")}
    rows = [
        r.split(" | ")[1:]
        for r in script.report(samples, ["miniflare", "rivetkit"], args, failed).splitlines()[4:]
    ]
    assert rows[2] == ["1", "rivetkit", "failed: timed out", "| |"], rows


def test_the_http_comparison_without_its_peers_says_how_to_install_them(tmp_path: Path) -> None:
    """The peers are optional npm installs: asked for one that is not there, the script exits
    2 naming the command."""
    script = _http_peers()
    missing = [name for name, peer in script.PEERS.items() if not peer.installed()]
    if not missing:
        pytest.skip("every peer is installed here")
    done = subprocess.run(
        [sys.executable, str(HTTP_PEERS), "--rounds", "1", "--peers", missing[0]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"npm install --prefix benchmarks/peers/{script.PEERS[missing[0]].directory.name}" in (
        done.stderr
    )
