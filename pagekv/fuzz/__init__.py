"""Crash, fault and takeover fuzzing of page I/O against a native SQLite oracle."""

from pagekv.fuzz.execution import Coverage, FuzzFailure, Runner
from pagekv.fuzz.oracle import Oracle, digest
from pagekv.fuzz.processes import fuzz_processes
from pagekv.fuzz.session import Found, FuzzConfig, fuzz, load_replay, minimize, run_seed
from pagekv.fuzz.steps import (
    EVENTS,
    Blob,
    Compact,
    Crash,
    InjectFault,
    Latency,
    Reopen,
    Sql,
    Step,
    StepGenerator,
    Takeover,
    Txn,
)

__all__ = [
    "EVENTS",
    "Blob",
    "Compact",
    "Coverage",
    "Crash",
    "Found",
    "FuzzConfig",
    "FuzzFailure",
    "InjectFault",
    "Latency",
    "Oracle",
    "Reopen",
    "Runner",
    "Sql",
    "Step",
    "StepGenerator",
    "Takeover",
    "Txn",
    "digest",
    "fuzz",
    "fuzz_processes",
    "load_replay",
    "minimize",
    "run_seed",
]
