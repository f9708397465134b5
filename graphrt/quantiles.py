"""The one median and the one percentile every figure of graphrt is summarised with, and their rule
for what is not known: a value that is unknown (None) makes the figure over it unknown. Taking the
median of the values that are known would report a figure of some steps as if it were of all of
them (docs/design.md, Invariants, 10).

Of no values at all there is no figure either way; that is the caller's to say (a step without a
launch has no launch delay, a group without a step no median), so both refuse it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import overload


def _known(values: Iterable[float | None]) -> list[float] | None:
    """The values as a list, or None where any is unknown; ValueError("no samples") for none."""
    listed = list(values)
    if not listed:
        raise ValueError("no samples")
    if any(v is None for v in listed):
        return None
    return listed  # type: ignore[return-value]: no None left


@overload
def median(values: Iterable[float]) -> float: ...
@overload
def median(values: Iterable[float | None]) -> float | None: ...
def median(values):
    """The middle value, or the mean of the two middle ones (`statistics.median`: an odd count of
    whole numbers has a whole median, so a count stays a count in JSON); None where any value is
    unknown."""
    known = _known(values)
    return None if known is None else statistics.median(known)


@overload
def percentile(values: Iterable[float], q: float) -> float: ...
@overload
def percentile(values: Iterable[float | None], q: float) -> float | None: ...
def percentile(values, q):
    """The q-th percentile (q in 0..100) of `values` in any order, linear between the closest
    ranks (numpy's and torch.quantile's default, `statistics.quantiles(method="inclusive")`); None
    where any value is unknown."""
    known = _known(values)
    if known is None:
        return None
    ordered = sorted(known)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
