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
    starts, ends, before = _in_order(starts, ends)
    gaps = (starts - before)[1:][starts[1:] > before[1:]]
    return _busy(starts, ends, before), gaps.tolist()


def busy_of(starts: np.ndarray, ends: np.ndarray) -> int:
    """The busy time of `busy_and_gaps_of` alone: a device's whole run leaves about a gap a
    kernel, a list of millions of ints not made here."""
    return _busy(*_in_order(starts, ends)) if len(starts) else 0


def _in_order(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The intervals in (start, end) order, and the latest end before each (int64's least first)."""
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    return starts, ends, np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])


def _busy(starts: np.ndarray, ends: np.ndarray, before: np.ndarray) -> int:
    return int(np.maximum(0, ends - np.maximum(starts, before)).sum())
