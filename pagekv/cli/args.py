"""argparse types shared by the `pagekv` commands: a bad value is a usage error that names it
and what is allowed, before anything runs, never a traceback from deep inside a command."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TypeVar

from pagekv.kv import DEFAULT_URL, check_kv_url

_T = TypeVar("_T")


def _parse(value: str, kind: Callable[[str], _T], expected: str) -> _T:
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None


def positive_int(value: str) -> int:
    n = _parse(value, int, "a whole number")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def positive_seconds(value: str) -> float:
    seconds = _parse(value, float, "seconds")
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return seconds


def milliseconds(value: str) -> float:
    ms = _parse(value, float, "milliseconds")
    if not ms >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return ms


def port(value: str) -> int:
    n = _parse(value, int, "a port number")
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (0: any free port), got {n}")
    return n


KV_ENV = "PAGEKV_KV"


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """`--kv URL` of the commands that work on the user's store (serve, inspect, export,
    import, ui, demo): the default is `$PAGEKV_KV`, else the embedded store in `./.pagekv`."""
    parser.add_argument(
        "--kv",
        default=os.environ.get(KV_ENV, DEFAULT_URL),
        type=kv_url,
        help=f"store URL (default ${KV_ENV}, else {DEFAULT_URL})",
    )


def kv_url(value: str) -> str:
    try:
        check_kv_url(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value
