"""Each list's "vs chosen" with the uncertainty of the figures it rests on, on planted rounds: a
difference inside its interval is no ranking, a size both lists replay weighs on both alike, and a
machine too noisy to choose is said to be, with the rounds it would need."""

from __future__ import annotations

import math
import statistics

import pytest

from graphrt.plan import spread as plan_spread
from graphrt.plan.measure_sizes import SizeFigures, interpolate
from graphrt.plan.optimize import evaluate
from graphrt.plan.summary import problem_for, vs_chosen_text

TRAFFIC = {1: 40, 2: 30, 3: 20, 4: 10}
STEADY = (1.0, 1.0, 1.0, 1.0)  # round medians, relative: no spread
JITTER = (0.99, 1.0, 1.01, 1.0)  # a quiet machine's
NOISE = (0.7, 1.0, 1.3, 1.1)  # a busy machine's


def figures(eager: dict[int, tuple[float, ...]], graph: dict[int, tuple[float, ...]]) -> dict[int, SizeFigures]:
    """Measured sizes 1..4: eager 1 ms + 0.2 a row, replays 0.5 ms + 0.01 a row, each times the
    relative round medians given for it (STEADY where none)."""
    out = {}
    for b in range(1, 5):
        e = tuple((1.0 + 0.2 * b) * r for r in eager.get(b, STEADY))
        g = tuple((0.5 + 0.01 * b) * r for r in graph.get(b, STEADY))
        out[b] = SizeFigures(b, statistics.median(e), min(e), max(e), statistics.median(g), min(g), max(g),
                             graph_bytes=100, capture_s=0.01, first_graph_bytes=100, first_capture_s=0.01,
                             measured=True, eager_rounds_ms=e, graph_rounds_ms=g)
    return out


def compare(measured, chosen, lists, traffic=TRAFFIC):
    problem = problem_for(interpolate(measured, 4), traffic)
    return plan_spread.compare(problem, measured, chosen, lists)


def test_a_list_far_slower_than_the_chosen_one_is_ranked_with_its_interval_around_it():
    measured = figures({b: JITTER for b in range(1, 5)}, {b: JITTER for b in range(1, 5)})
    (eager,), verdict = compare(measured, (4,), [((), True)])
    problem = problem_for(interpolate(measured, 4), TRAFFIC)
    assert eager.ratio == pytest.approx(evaluate(problem, ()).total_ns / evaluate(problem, (4,)).total_ns - 1)
    low, high = eager.interval
    assert 0 < low <= eager.ratio <= high
    assert eager.measurable and not verdict.noisy
    assert vs_chosen_text(eager.as_dict(), verdict.noisy) == (f"{eager.ratio:+.1%}", f"{low:+.1%}..{high:+.1%}")


def test_a_difference_inside_the_figures_noise_is_no_measurable_difference():
    # (1, 4) and (2, 4) differ by batch 1's replay of 1 row or 2 rows: 0.01 ms, against replays
    # of batches 1 and 2 that vary by 30 % between rounds
    measured = figures({}, {1: NOISE, 2: NOISE[::-1]})
    (other,), _ = compare(measured, (1, 4), [((2, 4), True)])
    low, high = other.interval
    assert low < 0 < high
    assert not other.measurable
    assert vs_chosen_text(other.as_dict(), False)[0] == "no measurable difference"


def test_a_size_both_lists_replay_weighs_on_both_alike_and_widens_no_comparison():
    # most steps are batch 4's, whose replay both lists run: their difference is batch 1's few
    # steps, through its own graph or padded to 2, and the noise of batch 4 cancels out of it
    measured = figures({b: NOISE for b in range(1, 5)}, {b: NOISE for b in range(1, 5)})
    (other,), verdict = compare(measured, (1, 2, 4), [((2, 4), True)], traffic={1: 5, 2: 5, 4: 90})
    low, high = other.interval
    assert verdict.chosen_reach > 0.05  # the chosen plan's own mean step is this unsure
    assert high - low < verdict.chosen_reach / 5  # its difference from the other, far less


def test_figures_whose_few_rounds_agree_by_chance_still_carry_the_machines_noise():
    # the replays of batches 3 and 4 happened to time alike in every round, while every other
    # figure's rounds strayed by up to 30 %: two lists that differ by those two replays alone
    # (batch 3's steps through its own graph, or padded to 4) are not ranked on their luck
    measured = figures({b: NOISE for b in range(1, 5)}, {1: NOISE, 2: NOISE})
    (other,), _ = compare(measured, (4,), [((3, 4), True)], traffic={3: 100})
    assert other.ratio == pytest.approx(0.53 / 0.54 - 1, abs=1e-6)  # on the figures themselves
    assert other.interval[0] < 0 < other.interval[1] and not other.measurable


def test_the_same_list_as_the_chosen_one_is_no_difference_at_all():
    measured = figures({b: NOISE for b in range(1, 5)}, {b: NOISE for b in range(1, 5)})
    (same,), _ = compare(measured, (2, 4), [((2, 4), True)])
    assert same.ratio == 0 and same.interval == (0.0, 0.0) and not same.measurable


def test_a_machine_too_noisy_to_choose_says_so_and_the_rounds_it_would_need():
    measured = figures({b: NOISE for b in range(1, 5)}, {b: NOISE for b in range(1, 5)})
    (eager,), verdict = compare(measured, (4,), [((), True)])
    assert verdict.noisy and verdict.chosen_reach > plan_spread.NOISY
    needed = max(math.ceil(4 * (verdict.chosen_reach / plan_spread.NOISY) ** 2), 5)  # more than it had
    said = verdict.describe()
    assert said.startswith("the machine is too noisy to choose: the chosen plan's mean step is known only to ±")
    assert said.endswith(f"plan on an idle machine, or with --rounds {needed} or more")
    assert verdict.as_dict()["noisy"] is True and verdict.as_dict()["said"] == said
    assert vs_chosen_text(eager.as_dict(), verdict.noisy)[0] == "too noisy"  # no ranking, even of all eager


def test_a_quiet_machine_gives_a_verdict_and_says_nothing_in_its_place():
    measured = figures({b: JITTER for b in range(1, 5)}, {b: JITTER for b in range(1, 5)})
    _, verdict = compare(measured, (4,), [((), True)])
    assert not verdict.noisy and verdict.describe() is None
    assert verdict.rounds == 4


def test_figures_without_rounds_give_no_interval_and_say_the_uncertainty_is_unknown():
    # a --measurements file of a plan made before rounds
    with_rounds = figures({}, {})
    measured = {b: SizeFigures(**{**vars(f), "eager_rounds_ms": (), "graph_rounds_ms": ()})
                for b, f in with_rounds.items()}
    (eager,), verdict = compare(measured, (4,), [((), True)])
    assert eager.interval is None and not eager.measurable and eager.ratio > 0
    assert verdict.chosen_reach is None and not verdict.noisy
    assert verdict.describe().startswith("the per-size figures carry no rounds")
    assert vs_chosen_text(eager.as_dict(), False) == (f"{eager.ratio:+.1%}", "unknown")


def test_the_intervals_are_the_same_every_time_for_the_same_rounds():
    measured = figures({b: NOISE for b in range(1, 5)}, {1: NOISE})
    assert compare(measured, (2, 4), [((1, 4), True), ((), True)]) == compare(measured, (2, 4), [((1, 4), True),
                                                                                                   ((), True)])


def test_the_rounds_a_noisy_machine_would_need_are_always_more_than_its_figures_had():
    barely = plan_spread.Verdict(rounds=8, chosen_reach=plan_spread.NOISY * 1.02)
    assert barely.noisy and barely.describe().endswith("--rounds 9 or more")
    far = plan_spread.Verdict(rounds=4, chosen_reach=plan_spread.NOISY * 2)
    assert far.describe().endswith("--rounds 16 or more")  # an interval narrows as 1/sqrt(rounds)
