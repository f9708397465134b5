"""Statistics that a stalled step or a slow stretch of a busy machine cannot move far: the median
absolute deviation, outliers beyond it, and a seeded bootstrap interval.

A step is only ever slowed by what else the machine does (a descheduled thread, another job's
burst), never sped up, so outliers are one-sided: a step is one when it lies beyond
`median + OUTLIER_MADS * MAD`, the MAD scaled to a normal distribution's sigma, so that no step of
a steady machine is taken for one. Steps of a steady device may agree to the microsecond; the MAD
is floored at `MAD_FLOOR` of the median so that a step 2 % slower than its identical neighbours
is not called an outlier.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from graphrt.quantiles import percentile

OUTLIER_MADS = 5.0
MAD_FLOOR = 0.01  # of the median
NORMAL_MAD = 1.4826  # a normal distribution's sigma / its median absolute deviation

T = TypeVar("T")


def median(values: Sequence[float]) -> float:
    """The 50th percentile, interpolated as a run's median step is (graphrt.measure.stats.Stats),
    so that a plan's figures and a run's agree to the bit."""
    return percentile(values, 50)


def mad(values: Sequence[float]) -> float:
    """The median absolute deviation from the median, scaled to a normal's sigma."""
    centre = median(values)
    return NORMAL_MAD * median([abs(v - centre) for v in values])


def outlier_bound(values: Sequence[float]) -> float:
    """The slowest a sample may be and still count: median + OUTLIER_MADS * MAD (floored)."""
    centre = median(values)
    return centre + OUTLIER_MADS * max(mad(values), MAD_FLOOR * abs(centre))


def split_outliers(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """(kept, left out), each in the order given: those beyond `outlier_bound` are left out."""
    bound = outlier_bound(values)
    return [v for v in values if v <= bound], [v for v in values if v > bound]


def bootstrap(groups: Sequence[Sequence[float]], statistic: Callable[[list[list[float]]], T],
              replicates: int, seed: int) -> list[T]:
    """`statistic` of `replicates` resamplings, each group resampled with replacement on its own
    (to its own length) from a generator seeded by `seed`: the same figures every time."""
    rng = random.Random(seed)
    return [statistic([rng.choices(group, k=len(group)) for group in groups]) for _ in range(replicates)]


def interval(values: Sequence[float], level: float) -> tuple[float, float]:
    """The central `level` (0..1) of `values`: their (1 - level) / 2 and (1 + level) / 2 quantiles."""
    tail = 100 * (1 - level) / 2
    return percentile(values, tail), percentile(values, 100 - tail)
