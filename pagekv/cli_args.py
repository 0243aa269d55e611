"""argparse types shared by the `pagekv` commands: a bad value is a usage error that names it
and what is allowed, before anything runs, never a traceback from deep inside a command."""

from __future__ import annotations

import argparse

from pagekv.kv import check_kv_url


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return seconds


def port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (0: any free port), got {n}")
    return n


def kv_url(value: str) -> str:
    try:
        check_kv_url(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value
