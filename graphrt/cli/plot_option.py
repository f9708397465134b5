"""`--plot PATH` (analyze, plan): what drawing needs, checked before any work.

matplotlib is optional (`graphrt[plot]`); without it a command would read its traces or measure
for minutes and only then find it cannot draw.
"""

from __future__ import annotations

import importlib

from graphrt.errors import GraphrtError
from graphrt.io import check_writable

INSTALL = "pip install 'graphrt[plot]'"


def check_plot(path: str | None) -> None:
    """Refuse `--plot path` now, in one line, where the file cannot be written or matplotlib is
    not installed; without --plot (None), nothing is checked and matplotlib is not imported."""
    if path is None:
        return
    check_writable(path)
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise GraphrtError(f"--plot needs matplotlib, which is not installed here: {INSTALL}") from None
