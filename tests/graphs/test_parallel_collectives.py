"""Collectives inside a captured step, on two gloo ranks: functional all-reduces record and
replay in a tape, and ranks whose steps issue different collectives are refused before capture."""

from __future__ import annotations

import pytest
import ranks
import torch

from graphrt.graphs.agree import IssuedCollectives, disagreement
from graphrt.graphs.collectives import Collective, PendingCollectives
from graphrt.parallel.launch import launch

ALL_REDUCE = "_c10d_functional.all_reduce.default"


@pytest.mark.processes
def test_a_functional_all_reduce_dispatches_and_a_tape_replays_it_with_new_values(rank_pool):
    results = rank_pool.results("tape_of_all_reduce")
    for rank in (0, 1):
        got = results[rank]
        assert ALL_REDUCE in got["dispatched"]
        assert got["tape"] == ["aten.mul.Tensor", ALL_REDUCE, "aten.add.Tensor"]
        # after the inputs became 10 and 20: (2*10 + 2*20) + 1 on both ranks
        assert torch.equal(got["replayed"], torch.full((4,), 61.0))
        assert torch.equal(got["replayed"], got["eager"])


@pytest.fixture(scope="module")
def refusals(rank_pool) -> dict[int, dict[str, list[str]]]:
    """Per rank, per faulty step (tests/ranks.py), what was said of it."""
    return rank_pool.results("refusals")


@pytest.mark.processes
@pytest.mark.parametrize("case, expected", [
    ("rank 0 only", "collective #1: rank 0 issues _c10d_functional.all_reduce.default(sum, [2, 3] "
                    "float32, group 0); rank 1 issues no collective"),
    ("order", "collective #1: rank 0 issues _c10d_functional.all_reduce.default(sum, [2, 3] float32, "
              "group 0); rank 1 issues _c10d_functional.all_reduce.default(sum, [3] float32, group 0)"),
    ("shape", "collective #1: rank 0 issues _c10d_functional.all_reduce.default(sum, [1, 3] float32, "
              "group 0); rank 1 issues _c10d_functional.all_reduce.default(sum, [2, 3] float32, group 0)"),
])
def test_ranks_whose_steps_issue_different_collectives_are_refused_naming_op_and_ranks(
        refusals, case, expected):
    said = {rank: refusals[rank][case] for rank in (0, 1)}
    assert said[0] == said[1] and len(said[0]) == 1
    assert expected in said[0][0]


@pytest.mark.processes
@pytest.mark.parametrize("case", ["unwaited", "unwaited first of two", "unwaited second of two"])
def test_a_collective_waited_outside_the_step_is_refused_by_the_check_and_by_a_capture_naming_it(
        refusals, case):
    # the one left unwaited all-reduces [2, 3]; a waited one beside it [1, 3]
    unwaited = "_c10d_functional.all_reduce.default(sum, [2, 3] float32, group 0) is not waited inside the step"
    for rank in (0, 1):
        check, captured = refusals[rank][case]
        assert check.startswith(f"rank 0: {unwaited}")
        assert captured.startswith(unwaited)


def test_a_collective_whose_result_is_dropped_unwaited_is_still_named_after_a_later_one_is_waited():
    all_reduce, wait = torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.wait_tensor.default
    x = torch.ones(2, 3)
    pending = PendingCollectives()
    pending.note(all_reduce, (x, "sum", "0"), {}, x.clone())  # its result dropped at once, never waited
    # the next result is allocated where the dropped one was freed: its wait must not pass for the first's
    waited = x[:1].clone()
    pending.note(all_reduce, (x[:1], "sum", "0"), {}, waited)
    pending.note(wait, (waited,), {}, waited)
    assert pending.unwaited_error().startswith(
        "_c10d_functional.all_reduce.default(sum, [2, 3] float32, group 0) is not waited inside the step")
    everything_waited = PendingCollectives()
    everything_waited.note(all_reduce, (x, "sum", "0"), {}, waited)
    everything_waited.note(wait, (waited,), {}, waited)
    assert everything_waited.unwaited_error() is None


def test_steps_that_agree_pass_and_the_first_difference_is_named():
    reduce = Collective(ALL_REDUCE, "0", (1, 8), "float32", "sum")
    other = Collective(ALL_REDUCE, "0", (1, 8), "float32", "avg")
    same = IssuedCollectives((reduce, reduce), None)
    assert disagreement([same, same]) is None
    said = disagreement([same, same, IssuedCollectives((reduce, other), None)])
    assert "collective #2: ranks 0, 1 issue" in said and "rank 2 issues " + str(other) in said


@pytest.mark.parametrize("slow_rank", [0, 1, 2])
def test_the_slowest_rank_counts_wherever_it_sits_rank_0_included(slow_rank):
    from graphrt.run.rank_figures import RankFigures, slowest, spread_ms

    ranks = [RankFigures(r, (9.0, 9.0, 9.0) if r == slow_rank else (1.0, 2.0, 1.0), None, None, ())
             for r in range(3)]
    assert slowest(ranks).median == 9.0 and spread_ms(ranks) == 8.0


def test_a_tensor_parallel_step_takes_the_slowest_ranks_time_at_each_step():
    from graphrt.run.rank_figures import RankFigures, slowest, spread_ms

    fast = RankFigures(0, (1.0, 5.0, 1.0), None, None, ())
    slow = RankFigures(1, (2.0, 2.0, 2.0), None, None, ())
    stats = slowest([fast, slow])
    assert stats.median == 2.0 and stats.n == 3  # steps (2, 5, 2): neither rank's own median
    assert slowest([fast, slow]).p90 > 4.0
    assert spread_ms([fast, slow]) == 1.0  # medians 1 and 2


@pytest.mark.processes
@pytest.mark.parametrize("lint", [True, False])
def test_ranks_that_disagree_are_refused_before_the_lint_issues_a_collective_one_would_wait_in(lint):
    # the lint captures the step with its real collectives: were it first, rank 0 would wait
    # forever in the all-reduce rank 1 issues alone (the alarm in tests/ranks.py ends it)
    said = launch(ranks.disagreeing_capture, [lint], 2)
    assert said[0] == said[1] is not None
    assert "collective #5: rank 0 issues no collective; rank 1 issues _c10d_functional.all_reduce" in said[0]


@pytest.mark.processes
def test_a_run_whose_ranks_disagree_is_refused_before_its_first_mode_issues_a_collective():
    # eager issues its collectives for real, as it decodes: the ranks agree before it runs
    said = launch(ranks.disagreeing_run, [], 2)
    assert said[0] == said[1] is not None
    assert "collective #5: rank 0 issues no collective; rank 1 issues _c10d_functional.all_reduce" in said[0]
