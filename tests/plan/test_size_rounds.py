"""The plan's per-size figures over interleaved rounds, on planted samples: a round visits every
size and mode, a stalled step is left out and named, a slow round does not move a figure, and a
wide figure earns extra rounds, boundedly."""

from __future__ import annotations

import pytest

from graphrt.plan import size_rounds
from graphrt.plan.size_rounds import Timed, run_rounds

BASE = {"eager": 1.0, "graph": 0.5}  # ms a step, at batch 1; + 0.1 ms a row


def steady(bs: int, mode: str) -> float:
    return BASE[mode] + 0.1 * bs


class Planted:
    """A deterministic source of step times: each size and mode's steady step, with the noise a
    test plants (by the index of the block, in the order blocks are asked for), recording the
    order it is asked in."""

    def __init__(self, noise=lambda block, bs, mode, step: 0.0):
        self.noise = noise
        self.asked: list[tuple[int, str, int]] = []

    def __call__(self, bs: int, mode: str, timed: int) -> list[float]:
        block = len(self.asked)
        self.asked.append((bs, mode, timed))
        # a few microseconds' jitter, so a figure has a spread as a real one does
        return [steady(bs, mode) * (1 + 0.001 * ((block + step) % 3)) + self.noise(block, bs, mode, step)
                for step in range(timed)]


def test_every_round_times_every_size_and_mode_and_the_next_round_goes_the_other_way():
    source = Planted()
    run_rounds((1, 2, 3), source, rounds=4, per_round=3)
    assert len(source.asked) == 4 * 6  # no figure wide: no extra round
    first = [(bs, mode) for bs, mode, _ in source.asked[:6]]
    assert first == [(1, "eager"), (1, "graph"), (2, "eager"), (2, "graph"), (3, "eager"), (3, "graph")]
    for r in range(4):  # round-robin: no size's steps in one block
        round_keys = [(bs, mode) for bs, mode, _ in source.asked[6 * r:6 * (r + 1)]]
        assert round_keys == (first if r % 2 == 0 else first[::-1])
    assert {timed for _, _, timed in source.asked} == {3}


def test_a_stalled_step_is_left_out_of_its_figure_and_named():
    # round 2 runs backwards: its last block, 11, is batch 1's eager steps; the second of them stalls
    stall = lambda block, bs, mode, step: 20.0 if (block, step) == (11, 1) else 0.0
    timed = run_rounds((1, 2, 3), Planted(stall), rounds=4, per_round=3)
    stalled = timed[1, "eager"]
    assert stalled.outliers == pytest.approx((steady(1, "eager") * 1.0 + 20.0,), rel=0.01)
    assert stalled.median == pytest.approx(steady(1, "eager"), rel=0.003)
    assert all(not timed[k].outliers for k in timed if k != (1, "eager"))


def test_a_slow_round_does_not_move_a_figure_beyond_the_rounds_spread():
    # the whole of round 3 runs 40 % slow (another job took the cores): every step in it, all sizes
    slow = lambda block, bs, mode, step: 0.4 * steady(bs, mode) if 12 <= block < 18 else 0.0
    timed = run_rounds((1, 2, 3), Planted(slow), rounds=4, per_round=3)
    for (bs, mode), figure in timed.items():
        assert figure.median == pytest.approx(steady(bs, mode), rel=0.003), (bs, mode)
        every_step = [ms for r in figure.rounds for ms in r]  # a mean of them has moved by 10 %
        assert sum(every_step) / len(every_step) > steady(bs, mode) * 1.09


def test_a_figure_wider_than_the_bound_earns_extra_rounds_and_only_it():
    # batch 2's replays alternate between fast and 30 % slow rounds: its figure stays wide
    flaky = lambda block, bs, mode, step: 0.3 * steady(bs, mode) if (bs, mode) == (2, "graph") and block % 2 else 0.0
    source = Planted(flaky)
    timed = run_rounds((1, 2, 3), source, rounds=3, per_round=2)
    extra = source.asked[3 * 6:]
    assert extra and {(bs, mode) for bs, mode, _ in extra} == {(2, "graph")}
    assert len(extra) <= 3  # bounded: at most as many extra rounds as the first
    assert len(timed[2, "graph"].round_medians) == 3 + len(extra)
    assert timed[2, "graph"].width > size_rounds.WIDE
    assert all(len(timed[k].round_medians) == 3 for k in timed if k != (2, "graph"))


def test_rounds_are_heard_as_they_start():
    heard = []
    run_rounds((1, 2), Planted(), rounds=2, per_round=1, on_round=lambda index, label: heard.append((index, label)))
    assert heard == [(0, "round 1 of 2"), (1, "round 2 of 2")]


def test_a_figure_is_the_median_of_its_round_medians_and_its_spread_that_of_its_kept_steps():
    figure = Timed(((1.0, 1.1, 1.2), (2.0, 2.0, 2.0), (1.3, 1.3, 1.4), (1.5, 1.6, 1.5)))
    assert figure.round_medians == (1.1, 2.0, 1.3, 1.5)
    assert figure.median == pytest.approx(1.4)
    assert figure.outliers == ()
    assert figure.p10 <= figure.median <= figure.p90
    low, high = size_rounds.median_interval(figure.round_medians)
    assert low < figure.median < high
    assert figure.width == pytest.approx(max(figure.median - low, high - figure.median) / figure.median)


def test_a_round_whose_every_step_was_left_out_gives_no_round_median():
    figure = Timed(((1.0, 1.0), (1.0, 1.01), (50.0, 60.0), (0.99, 1.0), (1.0, 1.02)))
    assert figure.outliers == (50.0, 60.0)
    assert len(figure.round_medians) == 4
