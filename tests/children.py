"""Child processes for the tests that signal them: started with SIGINT and SIGTERM at their
default dispositions, whatever this process was given.

A process started as a background job of a non-interactive shell ignores SIGINT, and an ignored
signal stays ignored across fork and exec: a Python child then never installs its
KeyboardInterrupt handler, runs to its end and exits 0. A test that interrupts a child must not
depend on how the suite itself was launched.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any


def _default_dispositions() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def interruptible(args: Sequence[str], **popen: Any) -> subprocess.Popen:
    """`subprocess.Popen(args, **popen)`, the child's SIGINT and SIGTERM at their defaults."""
    return subprocess.Popen(args, preexec_fn=_default_dispositions, **popen)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """This process ignores SIGINT inside the block, as a background job of a shell does: what
    a test starts here inherits the ignored signal unless it resets it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
