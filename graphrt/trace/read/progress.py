"""How far the reading of a big trace has got, on stderr: nothing for one read in a second or
two, then a line every few seconds (on a terminal, one line kept up to date)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

QUIET_S = 1.5  # a read done by then says nothing


class ReadProgress:
    """A reader's progress callback (graphrt.trace.read.events.Progress) for one file."""

    def __init__(self, path: Path, out: TextIO | None = None, live: bool = True):
        """`live`: one line kept up to date where `out` is a terminal; else a line every few
        seconds (as where several files are read at once)."""
        self.path, self.out = path, out or sys.stderr
        self.size = path.stat().st_size
        self.began = self.last = time.monotonic()
        self.live = live and self.out.isatty()
        self.said = False

    def __call__(self, read_bytes: int, events: int) -> None:
        now = time.monotonic()
        if now - self.began < QUIET_S or now - self.last < (0.25 if self.live else 5.0):
            return
        self.last, self.said = now, True
        done = f"{read_bytes / 1e6:,.0f} of {self.size / 1e6:,.0f} MB, " if read_bytes else ""
        line = f"reading {self.path.name}: {done}{events:,} events, {now - self.began:.0f} s"
        self.out.write(f"\r{line}" if self.live else f"{line}\n")
        self.out.flush()

    def done(self) -> None:
        if self.said and self.live:
            self.out.write("\n")
            self.out.flush()
