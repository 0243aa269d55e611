"""`pagekv bench`: pagekv against native SQLite, interleaved in one run, with KV traffic counted.

The pieces: `workloads` (one definition per workload, also used by the pytest-benchmark suite in
`benchmarks/`), `systems` (pagekv and the native baselines matched in durability), `sampling`
(interleaved samples and their summaries), `targets` (the performance targets), `results` (text and
JSON). The command line, `pagekv bench`, is `pagekv.cli.benchmark`.
"""

from pagekv.bench.sampling import (
    Harness,
    Sample,
    Summary,
    SystemResult,
    WorkloadResult,
    WorkloadRun,
)
from pagekv.bench.systems import (
    ALL_SYSTEMS,
    PAGEKV,
    Subject,
    SystemSpec,
    Workspace,
    baselines_for,
)
from pagekv.bench.targets import TargetResult, evaluate
from pagekv.bench.workloads import WORKLOADS, Prepare, Sizes, Workload, build

__all__ = [
    "ALL_SYSTEMS",
    "PAGEKV",
    "WORKLOADS",
    "Harness",
    "Prepare",
    "Sample",
    "Sizes",
    "Subject",
    "Summary",
    "SystemResult",
    "SystemSpec",
    "TargetResult",
    "Workload",
    "WorkloadResult",
    "WorkloadRun",
    "Workspace",
    "baselines_for",
    "build",
    "evaluate",
]
