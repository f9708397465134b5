"""What the plan's check says: the cost model it predicts with is the optimizer's, its verdict
compares the sample with its sizes re-timed beside it, and it names a machine that has moved
since the measuring."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from graphrt.backends.graph import GraphBackend
from graphrt.plan.measure_sizes import SizeFigures
from graphrt.plan.optimize import evaluate
from graphrt.plan.check import Check, Mean, check, predict, sample
from graphrt.plan.summary import problem_for
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

SLOW_MS = 50  # Python time in each step: eager pays it, a replay does not (a tape replays aten ops only)


def _figures(top: int) -> list[SizeFigures]:
    """Eager steps growing with the batch, replays flat and cheaper, each with its own spread."""
    return [SizeFigures(b, eager_ms=1.0 + 0.3 * b, eager_p10=0.9 + 0.3 * b, eager_p90=1.2 + 0.3 * b,
                        graph_ms=0.4 + 0.05 * b, graph_p10=0.35 + 0.05 * b, graph_p90=0.5 + 0.05 * b,
                        graph_bytes=1000 * b, capture_s=0.01, first_graph_bytes=1000 * b, first_capture_s=0.01,
                        measured=True) for b in range(1, top + 1)]


@pytest.mark.parametrize("plan", [(2, 5), (1, 3, 8), (8,), ()])
def test_the_prediction_of_a_sample_is_the_optimizers_mean_step_over_it_as_traffic(plan):
    figures = _figures(8)
    batches = [1, 1, 2, 3, 3, 3, 5, 7, 8, 8, 4, 6]
    predicted = predict(figures, plan, batches)
    optimizer = evaluate(problem_for(figures, Counter(batches)), plan)
    assert predicted.ms == pytest.approx(optimizer.mean_ms, abs=1e-6)  # the optimizer counts whole ns
    assert predicted.band[0] < predicted.ms < predicted.band[1]


def test_a_batch_above_the_plan_is_predicted_at_its_own_eager_step_and_one_below_at_its_covers_replay():
    figures = _figures(8)
    assert predict(figures, (4,), [6]).ms == pytest.approx(1.0 + 0.3 * 6)
    assert predict(figures, (4,), [2]).ms == pytest.approx(0.4 + 0.05 * 4)


def _check(measured: Mean, retimed: Mean, predicted: Mean) -> Check:
    return Check(200, measured, retimed, predicted, measured_bytes=1 << 20, predicted_bytes=1 << 20)


def test_the_verdict_sets_the_sample_against_its_sizes_re_timed_beside_it_not_against_stale_figures():
    slow_now = _check(measured=Mean(2.0, (1.8, 2.3)), retimed=Mean(2.1, (1.9, 2.4)), predicted=Mean(1.0, (0.9, 1.1)))
    assert slow_now.agrees and not slow_now.figures_hold
    said = slow_now.describe()
    assert "agree within the timing's spread" in said
    assert "the machine ran 110.0% slower than while measuring" in said
    assert "measured mean step          2.000 ms (p10..p90 1.800..2.300)" in said


def test_a_sample_costing_more_than_its_sizes_alone_disagrees_even_where_the_figures_hold():
    mixed_costs_more = _check(measured=Mean(3.0, (2.8, 3.3)), retimed=Mean(1.0, (0.9, 1.1)),
                              predicted=Mean(1.02, (0.92, 1.12)))
    assert not mixed_costs_more.agrees and mixed_costs_more.figures_hold
    said = mixed_costs_more.describe()
    assert "disagree beyond the timing's spread" in said and "they hold" in said


def test_a_faster_machine_is_named_faster():
    fast_now = _check(measured=Mean(0.5, (0.45, 0.55)), retimed=Mean(0.5, (0.45, 0.55)), predicted=Mean(1.0, (0.9, 1.1)))
    assert "the machine ran 50.0% faster than while measuring" in fast_now.describe()


def test_a_small_drift_beyond_tight_bands_is_named_by_its_size_not_rounded_to_nothing():
    # GPU steps vary by a fraction of a percent: bands that do not meet can be 0.3 % apart
    tight = _check(measured=Mean(1.0, (0.999, 1.001)), retimed=Mean(1.0, (0.999, 1.001)),
                   predicted=Mean(1.003, (1.002, 1.004)))
    assert not tight.figures_hold
    assert "the machine ran 0.3% faster than while measuring" in tight.describe()


def test_the_json_of_a_check_reads_back_as_the_same_check():
    check = _check(measured=Mean(2.0, (1.8, 2.3)), retimed=Mean(2.1, (1.9, 2.4)), predicted=Mean(1.0, (0.9, 1.1)))
    assert Check.from_dict(check.as_dict()) == check
    assert check.as_dict()["agrees"] is True and check.as_dict()["figures_hold"] is False


def test_bands_that_touch_overlap():
    assert Mean(1.0, (0.9, 1.0)).overlaps(Mean(1.1, (1.0, 1.2)))
    assert Mean(1.1, (1.0, 1.2)).overlaps(Mean(1.0, (0.9, 1.0)))
    assert not Mean(1.0, (0.9, 0.99)).overlaps(Mean(1.1, (1.0, 1.2)))


def test_the_check_says_each_of_its_figures_in_a_line_of_its_own():
    slower = _check(measured=Mean(1.6, (1.5, 1.7)), retimed=Mean(1.5, (1.4, 1.6)), predicted=Mean(1.2, (1.1, 1.3)))
    slower = Check(200, slower.measured, slower.retimed, slower.predicted, measured_bytes=3 << 20,
                   predicted_bytes=3 << 19)
    assert slower.describe().splitlines() == [
        "check: 200 steps drawn from the traffic through the captured plan, in 3 rounds, each followed by "
        "the sample's sizes re-timed alone:",
        "  measured mean step          1.600 ms (p10..p90 1.500..1.700)",
        "  cost model, sizes re-timed  1.500 ms (p10..p90 1.400..1.600): agree within the timing's spread",
        "  cost model, plan's figures  1.200 ms (p10..p90 1.100..1.300): the machine ran 25.0% slower than "
        "while measuring: measure again before trusting the plan's figures",
        "  graph memory                measured 3.000 MiB, predicted 1.500 MiB"]
    apart = Check(5, Mean(3.0, (2.9, 3.1)), Mean(1.0, (0.9, 1.1)), Mean(1.0, (0.9, 1.1)), 0, 0).describe()
    assert apart.splitlines()[2:4] == [
        "  cost model, sizes re-timed  1.000 ms (p10..p90 0.900..1.100): disagree beyond the timing's spread",
        "  cost model, plan's figures  1.000 ms (p10..p90 0.900..1.100): they hold"]


def test_a_sample_is_the_same_for_a_seed_and_another_for_another_seed():
    traffic = {1: 5, 2: 3, 7: 2}
    assert sample(traffic, 50, seed=3) == sample(traffic, 50, seed=3)
    assert sample(traffic, 50, seed=3) != sample(traffic, 50, seed=4)
    assert set(sample(traffic, 50, seed=3)) <= set(traffic)


@pytest.fixture
def slowed_tiny():
    """tiny on the CPU, its final norm sleeping SLOW_MS in Python before it runs; one thread, so
    that a loaded machine cannot stretch its tiny ops (OpenMP threads waiting on preempted ones)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, seed=0)
    model.setup_cache(4, 8)
    norm, forward = model.model.norm, model.model.norm.forward

    def slowed(*args):
        time.sleep(SLOW_MS / 1e3)
        return forward(*args)

    norm.forward = slowed
    yield model
    torch.set_num_threads(threads)


def test_the_check_replays_each_step_its_plan_holds_through_the_plans_own_graphs(slowed_tiny):
    plan = (2, 4)  # batches 1 and 3 pad up; default buckets would be 1, 2, 4
    done = check(slowed_tiny, _figures(4), plan, 0, {1: 2, 2: 2, 3: 2}, steps=6, position=4)
    assert done.steps == 6
    assert done.measured.ms < SLOW_MS and done.retimed.ms < SLOW_MS  # no step paid the Python
    assert done.measured_bytes == GraphBackend(slowed_tiny, plan, lint=False).prepare(4).memory_bytes


@pytest.mark.slow
def test_the_check_runs_a_batch_above_its_plan_eagerly(slowed_tiny):
    done = check(slowed_tiny, _figures(4), (2,), 0, {4: 3}, steps=3, position=4)
    assert done.steps == 3
    assert done.measured.band[0] >= SLOW_MS and done.retimed.band[0] >= SLOW_MS
