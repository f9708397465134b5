"""Busy time and gaps of a set of intervals (a GPU's kernels), against the time units each one
covers, counted one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from graphrt.measure.intervals import busy_and_gaps_of, busy_of

SPANS = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8)).map(lambda s: (s[0], s[0] + s[1])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(SPANS)
def test_busy_time_is_the_time_some_interval_covers_and_gaps_the_uncovered_runs_between(spans):
    covered = [any(s <= t < e for s, e in spans) for t in range(40)]
    runs, gap = [], 0  # the uncovered runs after the first covered unit and before a later one
    for t, busy in enumerate(covered):
        if busy and gap and any(covered[:t]):
            runs.append(gap)
        gap = 0 if busy else gap + 1
    starts, ends = (np.array([s[i] for s in spans], dtype=np.int64) for i in (0, 1))
    assert busy_and_gaps_of(starts, ends) == (sum(covered), runs)
    assert busy_of(starts, ends) == sum(covered)
