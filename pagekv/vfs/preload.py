"""Preload hints: the pages SQLite reads first after an open, saved at close so that the next open
fetches them with page 1, in the one read round trip an open makes anyway.

An actor wakes, runs a few actions and sleeps, and its actions tend to touch the same pages each
time: the schema, B-tree interior pages, its hot rows. Without hints each of those is a cold miss
and a round trip after the open; with them the open brings them all (DESIGN §4, "preload page 1
and hinted pages"). Hints are advisory: they are page numbers, and the preload finds the pages
through the same index as any read, so a stale hint costs a fetched page, never a wrong one.
"""

from __future__ import annotations

from typing import Final

MAX_HINT_PAGES: Final = 127
"""With page 1, the 128 keys one `get` may ask for: the hinted pages fill at most 508 KiB."""


class PreloadHints:
    """The first distinct pages (after page 1, which every open fetches) that SQLite reads after
    an open, up to `budget`; `stored` are the hints this open was given."""

    def __init__(self, stored: tuple[int, ...], budget: int) -> None:
        self.stored = stored
        self.budget = budget
        self.learning = budget > 0
        """True until `budget` pages are seen: the read path calls `note` only while it is."""
        self._seen: dict[int, None] = {}

    def note(self, pgno: int) -> None:
        """SQLite read `pgno`."""
        seen = self._seen
        if pgno != 1 and pgno not in seen:
            seen[pgno] = None
            if len(seen) >= self.budget:
                self.learning = False

    def to_save(self) -> tuple[int, ...] | None:
        """The hints the next open should get, or None when they are the stored ones (or this
        open read nothing but page 1, which tells nothing)."""
        pages = tuple(self._seen)
        return None if not pages or pages == self.stored else pages

    def saved(self, pages: tuple[int, ...]) -> None:
        self.stored = pages
