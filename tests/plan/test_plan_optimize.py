"""The plan optimizer (graphrt.plan.optimize) against brute force over every subset."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings, strategies as st

from graphrt.plan.optimize import Budget, Problem, choose, evaluate, frontier
from graphrt.errors import GraphrtError


def _cost(problem: Problem, sizes: tuple[int, ...]) -> tuple[int, int, int]:
    """Total step ns, memory and capture us of `sizes`, computed the plain way: each step at
    the smallest captured size that holds it, else eager; the largest graph first in the pool."""
    total = 0
    for b, w in enumerate(problem.weights, 1):
        holding = [s for s in sizes if s >= b]
        total += w * (problem.graph_ns[min(holding) - 1] if holding else problem.eager_ns[b - 1])
    top = max(sizes)
    memory = problem.first_bytes[top - 1] + sum(problem.inc_bytes[s - 1] for s in sizes if s != top)
    capture = problem.first_us[top - 1] + sum(problem.inc_us[s - 1] for s in sizes if s != top)
    return total, memory, capture


def _brute_force(problem: Problem, budget: Budget) -> dict[int, tuple]:
    """Per number of graphs, the best key (total, graphs, memory, capture, sizes) of every
    subset within the budget."""
    best: dict[int, tuple] = {}
    for k in range(1, problem.size + 1):
        for sizes in combinations(range(1, problem.size + 1), k):
            total, memory, capture = _cost(problem, sizes)
            if ((budget.max_graphs is None or k <= budget.max_graphs)
                    and (budget.memory_bytes is None or memory <= budget.memory_bytes)
                    and (budget.capture_us is None or capture <= budget.capture_us)):
                key = (total, k, memory, capture, sizes)
                best[k] = min(best.get(k, key), key)
    return best


@st.composite
def problems(draw) -> Problem:
    m = draw(st.integers(1, 7))
    small = st.integers(0, 6)  # few distinct values: ties are frequent, and must break alike
    column = lambda values: tuple(draw(st.lists(values, min_size=m, max_size=m)))  # noqa: E731
    return Problem(weights=column(st.integers(0, 5)), eager_ns=column(small), graph_ns=column(small),
                   inc_bytes=column(small), first_bytes=column(st.integers(0, 12)),
                   inc_us=column(small), first_us=column(st.integers(0, 12)))


budgets = st.builds(Budget, max_graphs=st.none() | st.integers(1, 4),
                    memory_bytes=st.none() | st.integers(0, 30), capture_us=st.none() | st.integers(0, 30))


@settings(max_examples=400, deadline=None)
@given(problems(), budgets)
def test_the_frontier_is_brute_forces_best_plan_for_every_number_of_graphs_under_any_budget(problem, budget):
    expected = _brute_force(problem, budget)
    found = {k: plan.key for k, plan in frontier(problem, budget).items()}
    assert found == expected


@settings(max_examples=300, deadline=None)
@given(problems(), budgets)
def test_the_chosen_plan_is_the_best_subset_within_the_budget_or_a_refusal(problem, budget):
    expected = _brute_force(problem, budget)
    if not expected:
        with pytest.raises(GraphrtError, match="no plan fits"):
            choose(problem, budget)
        return
    chosen, _ = choose(problem, budget)
    assert chosen.key == min(expected.values())


@settings(max_examples=200, deadline=None)
@given(problems(), st.data())
def test_a_plans_evaluation_is_the_plain_per_step_cost(problem, data):
    sizes = tuple(sorted(data.draw(st.sets(st.integers(1, problem.size), min_size=1))))
    plan = evaluate(problem, sizes)
    assert (plan.total_ns, plan.memory_bytes, plan.capture_us) == _cost(problem, sizes)


def _flat(m: int, weights: tuple[int, ...], **figures: tuple[int, ...]) -> Problem:
    ones = (1,) * m
    return Problem(weights=weights, **{f: figures.get(f, ones) for f in
                                       ("eager_ns", "graph_ns", "inc_bytes", "first_bytes", "inc_us", "first_us")})


def test_padding_and_eager_shares_count_rows_computed_for_no_sequence_and_steps_with_no_graph():
    problem = _flat(4, (1, 0, 2, 1))  # one step at batch 1, two at 3, one at 4
    plan = evaluate(problem, (2,))
    assert (plan.rows, plan.padded_rows, plan.eager_steps) == (2 + 3 * 2 + 4, 1, 3)
    plan = evaluate(problem, (4,))
    assert (plan.rows, plan.padded_rows, plan.eager_steps) == (4 * 4, 3 + 2, 0)


def test_a_budget_no_plan_fits_is_refused_saying_what_the_smallest_plan_needs():
    problem = _flat(3, (1, 1, 1), first_bytes=(3 << 20, 2 << 20, 5 << 20), first_us=(400_000, 900_000, 100_000))
    with pytest.raises(GraphrtError) as refused:
        choose(problem, Budget(memory_bytes=(2 << 20) - 1))
    assert "needs 2.000 MiB (batch 2) and 0.100 s of capture (batch 3)" in str(refused.value)
    chosen, _ = choose(problem, Budget(memory_bytes=2 << 20))  # just enough for that one graph
    assert chosen.sizes == (2,)


def test_max_graphs_below_one_is_refused():
    with pytest.raises(GraphrtError, match="at least one graph"):
        choose(_flat(2, (1, 1)), Budget(max_graphs=0))
