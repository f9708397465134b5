"""Nsight Systems in the tests: one nsys at a time on this machine, whichever pytest process
(or `pytest -n` worker) runs it, and a failed nsys run shows what nsys said, not only its status.

A profile that fails is recorded once more, with a warning that keeps the first failure's words:
these tests check what graphrt makes of a report, and an nsys run on a loaded CPU machine has
failed once with exit status 1 where the same run passes alone. The scripts profiled here are
fixed and do the same each time, so a fault of theirs fails both runs and the test."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from graphrt.trace.record.nsys_profile import Finished, run_bounded

LOCK = Path(tempfile.gettempdir()) / f"graphrt-tests-nsys-{os.getuid()}.lock"
TIMEOUT_S = 300
_held = 0  # how deep this process is in one_at_a_time: a second flock of its own would wait for ever


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """Hold the machine's nsys turn: other pytest processes wait here until it is let go; within
    one process it may be taken again inside itself."""
    global _held
    with ExitStack() as stack:
        if not _held:
            lock = stack.enter_context(open(LOCK, "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # let go when the file closes
        _held += 1
        try:
            yield
        finally:
            _held -= 1


def _said(run: Finished) -> str:
    return f"exit status {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"


def profile(script: Path, report: Path, *trace: str, env: dict[str, str] | None = None) -> Finished:
    """`nsys profile -t TRACE` of `python SCRIPT` into REPORT.nsys-rep, CPU sampling and context
    switches off (nsys 2022.4's agent never ends without them on a CPU machine). What it said."""
    cmd = ["nsys", "profile", *trace, "-s", "none", "--cpuctxsw=none", "-f", "true", "-o", str(report),
           sys.executable, str(script)]
    with one_at_a_time():
        run = run_bounded(cmd, timeout_s=TIMEOUT_S, env=env)
        if run.returncode != 0:
            warnings.warn(f"nsys profile of {script.name} failed once and was run again: {_said(run)}")
            run = run_bounded(cmd, timeout_s=TIMEOUT_S, env=env)
    assert run.returncode == 0, f"nsys profile of {script.name}: {_said(run)}"
    return run


def export(report: Path, sqlite: Path) -> Path:
    """`nsys export` of REPORT (an .nsys-rep) to the SQLite file SQLITE, which it returns."""
    with one_at_a_time():
        run = run_bounded(["nsys", "export", "-t", "sqlite", "-q", "true", "-f", "true", "-o", str(sqlite),
                           str(report)], timeout_s=TIMEOUT_S)
    assert run.returncode == 0, f"nsys export of {report.name}: {_said(run)}"
    return sqlite


def nvtx_sums(path: Path) -> str:
    """`nsys stats -r nvtxsum` of an export, as CSV from its header row on."""
    with one_at_a_time():
        run = run_bounded(["nsys", "stats", "-q", "-r", "nvtxsum", "-f", "csv", "-o", "-", str(path)],
                          timeout_s=TIMEOUT_S)
    assert run.returncode == 0, f"nsys stats of {path.name}: {_said(run)}"
    return run.stdout[run.stdout.index("Time (%)"):]
