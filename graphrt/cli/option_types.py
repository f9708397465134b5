"""What an option's value must be, checked before any work: the click types of numeric options
(every float option's, a seed's, and a count of timed steps' bound), and what `--plot PATH`
(analyze, plan) needs.

Amounts: a finite number in range, never one that rounds to nothing.

`float()` takes `nan` and `inf`, and click's `FloatRange` lets both through its bounds (`nan` fails
no comparison); a command would then fail deep inside, in a traceback. An amount the command
counts in a smaller unit (GiB as bytes, seconds as microseconds) is refused where it is not 0
yet rounds to 0 there: `--device-memory 1e-300` would otherwise be taken as 0 bytes, though `0`
is refused.

matplotlib is optional (`graphrt[plot]`); without it a command would read its traces or measure
for minutes and only then find it cannot draw.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import click

from graphrt.errors import GraphrtError
from graphrt.io import check_writable


class Amount(click.FloatRange):
    """A float option's value: finite, within the bounds, and, where it is not 0, at least one
    `quantum` (the unit it is counted in, named `quantum_said`, e.g. 2**-30 and "byte" for GiB)."""

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False,
                 quantum: float | None = None, quantum_said: str = "") -> None:
        super().__init__(min=min, max=max, min_open=min_open)
        self.quantum, self.quantum_said = quantum, quantum_said

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        number = super().convert(number, param, ctx)
        if self.quantum and number and round(number / self.quantum) == 0:
            self.fail(f"{value!r} is less than one {self.quantum_said}, the unit it is counted in, "
                      "so it would count as 0.", param, ctx)
        return number


# What torch's generators take (torch.Generator.manual_seed): a seed outside fails deep in a run.
SEED = click.IntRange(-(1 << 63), (1 << 64) - 1)

# Steps or repeats an option asks to time one by one (plan --verify-steps, trace --overhead, bench
# --repeats): each is held as a figure, and plan samples them up front, so a count of 10^12 fills
# memory before the first is timed; a million is hours of steps on any device.
MAX_TIMED_STEPS = 1_000_000

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
