"""Generation fencing: the rule every backend applies inside its atomic write."""

from __future__ import annotations

from pagekv.kv.errors import FenceMismatch


def check_fence(fence: int | None, current: int) -> None:
    """Raise `FenceMismatch` unless the write is unfenced or names the current generation.

    Backends call this *inside* the transaction that applies the write, after reading the
    generation in that same transaction, so a concurrent takeover cannot slip between the two.
    """
    if fence is not None and fence != current:
        raise FenceMismatch(fence, current)
