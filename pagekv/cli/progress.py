"""Progress on stderr for the long commands (`copy`, `fuzz`, `bench`): one status line.

On a terminal it is `rich`'s live display: one line redrawn in place, cropped to the terminal's
width (a line that wrapped could not be redrawn), and at the end kept or removed. Anywhere else
(a log, a pipe) rich would show nothing until the end, so the line is written plain, without
escape codes, at most once every `every_s` seconds and once at the end if the caller has a last
line: a long run leaves a few lines, not one per step. rich is imported only on a terminal: it
takes ~30 ms to import, which a piped run need not pay.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.live import Live

EVERY_S = 5.0
"""Off a terminal, the least time between two progress lines."""


class StatusLine:
    """One progress line on `stream` (default stderr): `show` it as often as there is news,
    `end` it once. `keep`: on a terminal, the last line stays on screen after `end` (else it is
    removed). `width`: the terminal's columns (default: what rich finds out)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        keep: bool = True,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.terminal = self.stream.isatty()
        self.keep = keep
        self.every_s = every_s
        self.clock = clock
        self.width = width
        self._last_plain = clock()
        self._live: Live | None = None

    def show(self, line: str, *, plain: str | None = None, now: bool = False) -> None:
        """`line` on a terminal; off one, `plain` (default `line`) as a line of its own if
        `every_s` has passed since the last one written, or `now`."""
        if not self.enabled:
            return
        if self.terminal:
            from rich.text import Text

            self._display().update(Text(line, no_wrap=True, overflow="ellipsis"), refresh=True)
            return
        if now or self.clock() - self._last_plain >= self.every_s:
            self._last_plain = self.clock()
            self.stream.write((line if plain is None else plain) + "\n")
            self.stream.flush()

    def end(self, plain: str | None = None) -> None:
        """Stop the line: on a terminal, leave its last state (`keep`) or remove it; off one,
        write `plain` if given. The line can be shown again afterwards (a next phase)."""
        if not self.enabled:
            return
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif not self.terminal and plain is not None:
            self.stream.write(plain + "\n")
            self.stream.flush()

    def _display(self) -> Live:
        """The live display, started at the first line shown (so a run that shows nothing
        writes nothing, not even the escape codes that hide and show the cursor)."""
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(
                file=self.stream, force_terminal=True, width=self.width, highlight=False
            )
            self._live = Live(
                console=console,
                auto_refresh=False,
                transient=not self.keep,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        return self._live
