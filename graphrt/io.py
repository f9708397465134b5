"""Writing results so an interrupted run never leaves a half-written file (docs/design.md, Invariants, 7)."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temporary file in `path`'s folder, made with the folders above it where missing."""
    if file := next((p for p in path.parents if p.is_file()), None):
        raise GraphrtError(f"{path}: cannot write here ({file} is a file, not a folder)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise GraphrtError(f"{path}: cannot write here ({e.strerror})") from None


def check_writable(path: str | Path) -> None:
    """Fail now, not after a long run, if `path` cannot be written."""
    fd, tmp = _temp_beside(Path(path))
    os.close(fd)
    os.unlink(tmp)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write to a temporary file beside `path`, then rename it over `path` in one step."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a result is as readable as any file
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):  # a full disk, a file size limit, a directory in the way
            raise GraphrtError(f"{path}: cannot write here ({e.strerror})") from None
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_png(path: str | Path, figure: Any, dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG at `path`, written whole (`write_atomic`); the caller closes it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return write_atomic(path, buffer.getvalue())
