"""The one median and percentile (graphrt.quantiles): against Python's `statistics` and numpy on
known values, and the rule every figure over steps keeps: one unknown value makes the figure
unknown, never the median of the values that happen to be known."""

import statistics

import numpy
import pytest
from hypothesis import given, strategies as st

from graphrt.quantiles import median, percentile

values = st.lists(st.integers(-50_000, 50_000), min_size=1, max_size=40)


@given(values)
def test_the_median_is_statistics_median_and_a_count_stays_a_whole_number(xs):
    assert median(xs) == statistics.median(xs)
    assert type(median(xs)) is type(statistics.median(xs))  # int for an odd count of ints: JSON writes 3, not 3.0


@given(values, st.floats(0, 100))
def test_a_percentile_of_values_in_any_order_is_numpys_linear_one(xs, q):
    assert percentile(xs, q) == pytest.approx(numpy.percentile(xs, q), rel=1e-12, abs=1e-9)


@given(values, st.integers(0, 40))
def test_one_unknown_value_makes_the_median_and_every_percentile_unknown(xs, where):
    with_unknown = [*xs[:where], None, *xs[where:]]
    assert median(with_unknown) is None
    assert percentile(with_unknown, 50) is None and percentile(with_unknown, 90) is None


def test_a_figure_of_no_values_is_refused_for_the_caller_to_say_what_none_means():
    with pytest.raises(ValueError, match="^no samples$"):
        median([])
    with pytest.raises(ValueError, match="^no samples$"):
        percentile(iter(()), 50)
