"""The statistics graphrt reports for step times, against Python's `statistics` module."""

import statistics
import time

import pytest
import torch
from hypothesis import given, strategies as st

from graphrt.measure.stats import Stats
from graphrt.measure.timing import StepTimer
from graphrt.quantiles import percentile

samples = st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=2, max_size=40)


@given(samples)
def test_percentiles_are_the_inclusive_quantiles(xs):
    # statistics.quantiles(method="inclusive") is the linear interpolation between closest
    # ranks that numpy and torch.quantile also use by default
    cuts = statistics.quantiles(xs, n=100, method="inclusive")
    s = sorted(xs)
    for q in range(1, 100):
        assert percentile(s, q) == pytest.approx(cuts[q - 1], rel=1e-12, abs=1e-12), q
    assert (percentile(s, 0), percentile(s, 100)) == (s[0], s[-1])


def test_percentiles_of_known_samples():
    s = [1.0, 2.0, 4.0, 8.0, 16.0]  # ranks 0..4; p10 sits at rank 0.4, p90 at rank 3.6
    assert percentile(s, 10) == pytest.approx(1.4)
    assert percentile(s, 50) == 4.0
    assert percentile(s, 90) == pytest.approx(8 + 0.6 * 8)
    assert percentile([3.0], 90) == 3.0


def test_no_samples_is_an_error():
    with pytest.raises(ValueError, match="^no samples$"):
        percentile([], 50)


@given(samples)
def test_stats_of_unsorted_samples(xs):
    st_ = Stats.of(xs)
    cuts = statistics.quantiles(xs, n=10, method="inclusive")
    assert st_.median == pytest.approx(statistics.median(xs), rel=1e-12, abs=1e-12)
    assert (st_.p10, st_.p90) == (pytest.approx(cuts[0], abs=1e-9), pytest.approx(cuts[-1], abs=1e-9))
    assert st_.mean == pytest.approx(statistics.fmean(xs), rel=1e-12, abs=1e-12)
    assert st_.n == len(xs)


def test_spread_is_the_p10_to_p90_width_over_the_median():
    st_ = Stats.of([10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0])
    assert (st_.p10, st_.median, st_.p90) == (11.0, 15.0, 19.0)
    assert st_.spread == pytest.approx(8 / 15)
    assert Stats.of([0.0, 0.0]).spread == 0.0  # no division by a zero median


def test_cpu_step_timer_gives_each_block_its_wall_time_in_milliseconds():
    timer = StepTimer(torch.device("cpu"))
    for seconds in (0.03, 0.06):
        with timer.step():
            time.sleep(seconds)
    first, second = timer.samples_ms()
    # sleep never returns early; a busy machine may make it late, but not by seconds
    assert 30 <= first < 3000 and 60 <= second < 3000


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_drained_step_behind_queued_gpu_work_holds_its_hosts_launch_time():
    # a step whose host takes 20 ms to launch its one kernel, queued behind ~100 ms of GPU work:
    # undrained, its start event fires once that work is done and the 20 ms hide in the queue;
    # drained, the queue is empty when it starts and the 20 ms are inside its window
    x = torch.ones(8, device="cuda")

    def time_one(drained: bool) -> float:
        timer = StepTimer(torch.device("cuda"), drained=drained)
        torch.cuda._sleep(200_000_000)  # spins the GPU for ~100 ms at 2 GHz
        with timer.step():
            time.sleep(0.02)
            x.add_(1)
        return timer.samples_ms()[0]

    assert time_one(drained=True) >= 20
    assert time_one(drained=False) < 20
