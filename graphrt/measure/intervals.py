"""Time covered by a set of intervals and the gaps between them: how busy a GPU (or a thread)
was over a step, in linear time after one sort."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def busy_and_gaps(intervals: Iterable[tuple[int, int]]) -> tuple[int, list[int]]:
    """(time covered by the union of the intervals, the gaps between them), in ns."""
    spans = np.array(list(intervals), dtype=np.int64).reshape(-1, 2)
    return busy_and_gaps_of(spans[:, 0], spans[:, 1])


def busy_and_gaps_of(starts: np.ndarray, ends: np.ndarray) -> tuple[int, list[int]]:
    """`busy_and_gaps` of the intervals (starts[i], ends[i]): in (start, end) order, each adds
    what it reaches past the latest end before it, and leaves a gap where it starts after that."""
    if not len(starts):
        return 0, []
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
    busy = int(np.maximum(0, ends - np.maximum(starts, before)).sum())
    gaps = (starts - before)[1:][starts[1:] > before[1:]]
    return busy, gaps.tolist()
