"""A bounded LRU cache of committed pages (the layer between the dirty buffer and the KV)."""

from __future__ import annotations

from collections import OrderedDict


class PageCache:
    """Holds at most `capacity` committed pages (>= 1, checked with the other `Options`).
    Invariant: a cached page equals the newest committed version of that page; callers evict
    pages that a commit or truncate changes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pages: OrderedDict[int, bytes] = OrderedDict()
        self._move_to_end = self._pages.move_to_end
        """Bound once: compiled, `self._pages.move_to_end(...)` looks the method up by name at
        every call (a third of a `put`, which every commit makes)."""
        self.hits = 0
        self.misses = 0

    def get(self, pgno: int) -> bytes | None:
        data = self._pages.get(pgno)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        self._move_to_end(pgno)
        return data

    def peek(self, pgno: int) -> bytes | None:
        """The cached page, if any, without counting a hit or a miss or refreshing its age."""
        return self._pages.get(pgno)

    def __contains__(self, pgno: int) -> bool:
        return pgno in self._pages

    def put(self, pgno: int, data: bytes) -> None:
        self._pages[pgno] = data
        self._move_to_end(pgno)
        while len(self._pages) > self.capacity:
            self._pages.popitem(last=False)

    def put_many(self, pages: dict[int, bytes]) -> None:
        """`put` of each page in order (a read-ahead's), without a call per page: the pages end
        up newest, in their order, so evicting the oldest after all of them leaves what evicting
        after each would."""
        cached = self._pages
        for pgno, data in pages.items():
            cached[pgno] = data
            self._move_to_end(pgno)
        for _ in range(len(cached) - self.capacity):
            cached.popitem(last=False)

    def discard(self, pgno: int) -> None:
        self._pages.pop(pgno, None)

    def drop_above(self, pages: int) -> None:
        for pgno in [p for p in self._pages if p > pages]:
            del self._pages[pgno]

    def clear(self) -> None:
        self._pages.clear()

    def __len__(self) -> int:
        return len(self._pages)
