"""Where the newest visible version of every page lives: a delta chunk or the base pages.

The index is rebuilt at open from the stored index parts and the head's shrink list, and kept up
to date by each commit through the same `apply_commit`, so the live instance and a reopened one can
never disagree about which version of a page is current.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pagekv.vfs.errors import StorageCorrupt
from pagekv.vfs.format import Head, Shrink

DeltaLoc = tuple[int, int]
"""(txid, chunk) of a delta chunk."""


@dataclass
class PageIndex:
    """Invariant: a page in `deltas` is read from that chunk; otherwise, a page `<= base_limit`
    is a base page that must exist; any other page below EOF is a hole and reads as zeros."""

    base_limit: int = 0
    deltas: dict[int, DeltaLoc] = field(default_factory=dict)
    chunks: dict[int, int] = field(default_factory=dict)
    """Number of chunks of each live delta txid (for read-ahead across chunks)."""
    delta_entries: int = 0
    """Index entries applied since the last compaction, superseded ones included."""

    def apply_commit(
        self, txid: int, parts: list[list[tuple[int, int]]], shrinks: Sequence[Shrink]
    ) -> None:
        """Apply commit `txid`: its index parts in order, each shrink after its `after_part`."""
        pending = sorted(shrinks, key=lambda s: s.after_part) if shrinks else []
        for number, entries in enumerate(parts):
            while pending and pending[0].after_part <= number:
                self.apply_shrink(pending.pop(0).pages)
            for pgno, chunk in entries:
                self.deltas[pgno] = (txid, chunk)
                self.chunks[txid] = max(self.chunks.get(txid, 0), chunk + 1)
            self.delta_entries += len(entries)
        for shrink in pending:
            self.apply_shrink(shrink.pages)

    def apply_shrink(self, pages: int) -> None:
        for pgno in [p for p in self.deltas if p > pages]:
            del self.deltas[pgno]
        self.base_limit = min(self.base_limit, pages)

    def compacted(self, pages: int) -> None:
        """Every page up to `pages` is now a base page."""
        self.deltas.clear()
        self.chunks.clear()
        self.delta_entries = 0
        self.base_limit = pages

    @classmethod
    def build(cls, head: Head, parts: dict[int, dict[int, list[tuple[int, int]]]]) -> PageIndex:
        """Rebuild from the head and the stored parts of live deltas (`{txid: {part: entries}}`)."""
        index = cls(base_limit=head.base_pages)
        shrinks: dict[int, list[Shrink]] = {}
        for shrink in head.shrinks:
            shrinks.setdefault(shrink.txid, []).append(shrink)
        for txid in sorted(parts.keys() | shrinks.keys()):
            numbered = parts.get(txid, {})
            if sorted(numbered) != list(range(len(numbered))):
                raise StorageCorrupt(
                    f"index parts of txid {txid} are not contiguous: {sorted(numbered)}"
                )
            index.apply_commit(
                txid, [numbered[n] for n in range(len(numbered))], shrinks.get(txid, ())
            )
        index.apply_shrink(head.pages)
        return index
