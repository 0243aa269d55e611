"""Sequential read-ahead: how many pages to fetch on a cache miss.

A table scan reads leaves in page order but also misses on B-tree interior pages that lie
elsewhere. One tracked *stream* grows its window (doubling up to `max_pages`) while misses land
near its end; a miss elsewhere fetches a small window and is remembered as a *probe*, so that an
interior page does not reset the stream, and a miss just past a probe starts a new stream.
Positions advance by what a fetch really brought (a delta chunk holds more pages than asked).
The first window is 128 pages (512 KiB) and the largest 512 (2 MiB): at remote-KV latencies a
round trip costs far more than the bytes, so a cold read of ~100 pages takes two round trips and a
50 MiB scan a few dozen (measured in `benchmarks/RESULTS.md`).
"""

from __future__ import annotations


class ReadAhead:
    def __init__(self, first_pages: int = 128, max_pages: int = 512) -> None:
        self.first = first_pages
        self.max = max_pages
        self._window = first_pages
        self._stream_end = -2 * (first_pages + max_pages)
        self._probe_end = -first_pages
        self._in_stream = False

    def window(self, pgno: int) -> int:
        """Pages to fetch starting at `pgno` (the missed page included)."""
        if self._stream_end - self._window <= pgno <= self._stream_end + self.first:
            self._window = min(self._window * 2, self.max)
        elif self._probe_end - self.first <= pgno <= self._probe_end + self.first:
            self._window = self.first * 2
        else:
            self._in_stream = False
            self._probe_end = pgno + self.first
            return self.first
        self._in_stream = True
        self._stream_end = pgno + self._window
        return self._window

    def fetched(self, end: int) -> None:
        """The last fetch brought pages up to (not including) `end`."""
        if self._in_stream:
            self._stream_end = max(self._stream_end, end)
        else:
            self._probe_end = max(self._probe_end, end)
