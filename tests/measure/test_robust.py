"""The robust statistics on their own: the MAD, the one-sided outlier rule and its floor, a seeded
bootstrap that resamples each group on its own, and a central interval."""

from __future__ import annotations

import statistics

import pytest

from graphrt.measure import robust


def test_the_mad_is_the_median_distance_from_the_median_scaled_to_a_normals_sigma():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]  # distances from 3: 2, 1, 0, 1, 97
    assert robust.mad(values) == pytest.approx(robust.NORMAL_MAD * 1.0)


def test_a_stalled_step_is_left_out_and_a_steady_one_kept():
    steps = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 9.0]
    kept, left_out = robust.split_outliers(steps)
    assert left_out == [9.0]
    assert kept == steps[:-1]  # in the order given


def test_outliers_are_one_sided_a_fast_step_is_never_left_out():
    # noise only slows a step: one far below the rest is the machine's own speed, kept
    kept, left_out = robust.split_outliers([1.0, 1.01, 0.99, 1.02, 0.2])
    assert left_out == [] and 0.2 in kept


def test_the_bound_is_the_median_plus_k_mads():
    values = [1.0, 1.1, 1.2, 1.3, 1.4]  # median 1.2, MAD 0.1 * 1.4826
    assert robust.outlier_bound(values) == pytest.approx(1.2 + robust.OUTLIER_MADS * 0.1 * robust.NORMAL_MAD)


def test_identical_steps_floor_the_mad_so_a_step_a_little_slower_is_kept():
    # a steady device times steps to the same microsecond: MAD 0, yet 2 % slower is no stall
    steps = [2.0] * 9 + [2.04]
    assert robust.mad(steps) == 0
    assert robust.split_outliers(steps)[1] == []
    assert robust.outlier_bound(steps) == pytest.approx(2.0 * (1 + robust.OUTLIER_MADS * robust.MAD_FLOOR))
    assert robust.split_outliers(steps + [2.2])[1] == [2.2]  # beyond the floored bound


def test_the_bootstrap_is_the_same_for_the_same_seed_and_resamples_each_group_from_itself():
    groups = [[1.0, 2.0, 3.0], [10.0, 20.0]]
    seen = []

    def statistic(resampled):
        seen.append([len(g) for g in resampled])
        assert set(resampled[0]) <= {1.0, 2.0, 3.0} and set(resampled[1]) <= {10.0, 20.0}
        return sum(resampled[0]) + sum(resampled[1])

    first = robust.bootstrap(groups, statistic, 50, seed=7)
    assert first == robust.bootstrap(groups, statistic, 50, seed=7)
    assert first != robust.bootstrap(groups, statistic, 50, seed=8)
    assert len(first) == 50 and all(lengths == [3, 2] for lengths in seen)  # each to its own length


def test_the_bootstrap_of_identical_values_has_no_spread():
    drawn = robust.bootstrap([[4.0, 4.0, 4.0]], lambda g: statistics.median(g[0]), 100, seed=0)
    assert robust.interval(drawn, 0.9) == (4.0, 4.0)


def test_the_interval_holds_the_central_share_of_the_values():
    values = [float(v) for v in range(101)]  # quantiles are the values themselves
    assert robust.interval(values, 0.9) == pytest.approx((5.0, 95.0))
    assert robust.interval(list(reversed(values)), 0.5) == pytest.approx((25.0, 75.0))
