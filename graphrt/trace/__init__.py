"""Traces: reading what Nsight Systems and torch.profiler recorded into one shape.

    trace = load_trace("traces/decode.sqlite")   # or .nsys-rep, or torch.profiler .json / .json.gz
    trace.ranges, trace.kernels, trace.api_calls, trace.cpu_ops   # see graphrt.trace.read.events

`graphrt.trace.analysis.steps` turns a `Trace` into per-step and per-range figures.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from graphrt.errors import GraphrtError
from graphrt.trace.read.chrome import GZIP_MAGIC, read_chrome_trace
from graphrt.trace.read.events import ApiCall, CpuOp, Kernel, Progress, Range, Trace
from graphrt.trace.read.nsys_sqlite import REPORT_SUFFIXES, SQLITE_MAGIC, read_nsys_report, read_nsys_sqlite

__all__ = ["ApiCall", "CpuOp", "Kernel", "Range", "Trace", "load_trace", "read_chrome_trace",
           "read_nsys_report", "read_nsys_sqlite"]


def load_trace(path: str | Path, progress: Progress | None = None) -> Trace:
    """Read a trace file, telling the format from its content (a report by its suffix).

    Raises GraphrtError, naming the file, for a missing file or one that is none of: an Nsight
    Systems SQLite export, a `.nsys-rep` report (needs `nsys` on PATH), a Chrome-trace JSON.
    `progress(bytes of the file read, events so far)` is called as a big file is read.
    """
    path = Path(path)
    _check_file(path)
    if path.suffix in REPORT_SUFFIXES:
        return read_nsys_report(path)
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as e:
        raise GraphrtError(f"{path}: cannot be read ({e.strerror or e})") from None
    if head.startswith(SQLITE_MAGIC):
        return read_nsys_sqlite(path, progress)
    if head.startswith(GZIP_MAGIC) or head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        return read_chrome_trace(path, progress)
    raise GraphrtError(f"{path}: neither an Nsight Systems export (SQLite or .nsys-rep) nor a "
                       "Chrome-trace JSON from torch.profiler")


def _check_file(path: Path) -> None:
    """GraphrtError naming what is really wrong with `path` where it is no trace file to open: a
    symbolic link loop or one to nothing, no such file, not a file, or an empty one."""
    try:
        info = path.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GraphrtError(f"{path}: a symbolic link loop (it never reaches a file)") from None
        if e.errno == errno.ENOENT and path.is_symlink():
            raise GraphrtError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist") from None
        raise GraphrtError(f"{path}: no such file" if e.errno == errno.ENOENT else f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        raise GraphrtError(f"{path}: not a file")
    if info.st_size == 0:
        raise GraphrtError(f"{path}: an empty file (0 bytes): no trace in it")
