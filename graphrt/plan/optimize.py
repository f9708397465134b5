"""Which batch sizes to capture: the exact optimum for a traffic, under a budget.

The cost model. Candidate sizes are 1..M. A plan is a set of one or more sizes. A decode step
of batch b runs as the smallest captured size s >= b, costing that graph's step `graph_ns[s]`,
or, where no captured size holds b, eagerly, costing `eager_ns[b]`. A plan's figure of merit is
its total step time over the traffic (its mean step times the number of steps).

Graphs are captured largest first into one pool (`GraphBackend.prepare`). The largest graph of a
plan goes first, into an empty pool: it costs `first_bytes[top]` and `first_us[top]` (capture
microseconds). Every other graph is captured after larger ones and reuses what they left in
the pool: it costs its increment `inc_bytes[s]`, `inc_us[s]`, measured after the larger sizes.
The model takes an increment not to depend on *which* larger graphs came before it: what a
pool cannot reuse for a smaller graph is mostly that graph's own output, and the working memory
of the largest covers every smaller one. A plan's memory (capture time) is then
`first(top) + sum of inc(s) over its other sizes`; `graphrt plan --check` captures the chosen
plan for real and prints its measured memory beside this prediction.

All figures are integers (nanoseconds, bytes, microseconds), so sums are exact and equal costs
are real ties, broken the same way every time: the smaller total step time, then fewer graphs,
less memory, less capture time, then the lexicographically smallest sizes.

The search is a dynamic program over sorted sizes. A partial plan ending at size j (its largest
so far) serves every batch up to j. Extending it by a size j' > j serves batches j+1..j' at
`graph_ns[j']` and makes j a non-top graph (its increment falls due); ending it serves the
batches above j eagerly and charges j as the first graph in the pool. Two partial plans with the
same end j and the same number of graphs complete with the same suffixes at the same added
cost, so per (j, graphs) it keeps only those no other one beats on every budgeted resource and
on the tie-break order: the result is the exact optimum, not a heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from graphrt.errors import GraphrtError
from graphrt.units import MIB, format_bytes


@dataclass(frozen=True)
class Problem:
    """Per candidate size 1..M (index b - 1): the traffic's steps at batch b and the figures."""

    weights: tuple[int, ...]  # decode steps at batch b
    eager_ns: tuple[int, ...]  # one eager step of batch b
    graph_ns: tuple[int, ...]  # one replay of the graph captured at b
    inc_bytes: tuple[int, ...]  # memory the graph of b adds to a pool larger graphs filled
    first_bytes: tuple[int, ...]  # ... and to an empty pool
    inc_us: tuple[int, ...]  # its capture time after larger graphs
    first_us: tuple[int, ...]  # ... and as the first capture of a pool

    def __post_init__(self) -> None:
        fields = (self.eager_ns, self.graph_ns, self.inc_bytes, self.first_bytes, self.inc_us, self.first_us)
        if any(len(f) != len(self.weights) for f in fields):
            raise ValueError("every figure needs one value per candidate size")
        if any(v < 0 for f in (self.weights, *fields) for v in f):
            raise ValueError("figures and weights are non-negative")

    @property
    def size(self) -> int:
        return len(self.weights)


@dataclass(frozen=True)
class Budget:
    """Any combination; None: unbounded."""

    max_graphs: int | None = None
    memory_bytes: int | None = None
    capture_us: int | None = None


@dataclass(frozen=True)
class Plan:
    """A set of sizes and what it costs over the traffic."""

    sizes: tuple[int, ...]
    total_ns: int  # sum over steps of each step's time
    memory_bytes: int
    capture_us: int
    steps: int
    eager_steps: int  # steps no graph holds
    rows: int  # rows computed, padding included
    padded_rows: int  # rows computed for no sequence

    @property
    def mean_ms(self) -> float:
        return self.total_ns / self.steps / 1e6

    @property
    def key(self) -> tuple:
        """The order plans are ranked in: what the optimum minimises, then the tie-breaks."""
        return (self.total_ns, len(self.sizes), self.memory_bytes, self.capture_us, self.sizes)


def evaluate(problem: Problem, sizes: tuple[int, ...], padding: bool = True) -> Plan:
    """What `sizes` (any subset of 1..M, possibly empty) costs over the problem's traffic.
    Without `padding` (an engine that pads no batch) a step runs its graph only where its
    batch is a captured size, and eagerly otherwise."""
    sizes = tuple(sorted(set(sizes)))
    if sizes and not 1 <= sizes[0] <= sizes[-1] <= problem.size:
        raise ValueError(f"sizes {sizes} are outside 1..{problem.size}")
    total = eager = rows = padded = 0
    cover = iter(sizes)
    c = next(cover, None)
    for b, w in enumerate(problem.weights, 1):
        while c is not None and c < b:
            c = next(cover, None)
        if c is None or (not padding and c != b):
            total, eager, rows = total + w * problem.eager_ns[b - 1], eager + w, rows + w * b
        else:
            total, rows, padded = total + w * problem.graph_ns[c - 1], rows + w * c, padded + w * (c - b)
    memory = capture = 0
    if sizes:
        *rest, top = sizes
        memory = problem.first_bytes[top - 1] + sum(problem.inc_bytes[s - 1] for s in rest)
        capture = problem.first_us[top - 1] + sum(problem.inc_us[s - 1] for s in rest)
    return Plan(sizes, total, memory, capture, sum(problem.weights), eager, rows, padded)


def fits(plan: Plan, budget: Budget) -> bool:
    return ((budget.max_graphs is None or len(plan.sizes) <= budget.max_graphs)
            and (budget.memory_bytes is None or plan.memory_bytes <= budget.memory_bytes)
            and (budget.capture_us is None or plan.capture_us <= budget.capture_us))


# A partial plan: (step ns of the batches it serves, memory and capture us of its graphs but
# the last, its sizes); ordered as the tie-break orders plans of one number of graphs.
_Label = tuple[int, int, int, tuple[int, ...]]


def _pareto(labels: list[_Label], memory: bool, capture: bool) -> list[_Label]:
    """The labels no other one beats on the tie-break order and on every budgeted resource."""
    kept: list[_Label] = []
    for label in sorted(labels):
        _, mem, cap, _ = label
        if not any((not memory or k[1] <= mem) and (not capture or k[2] <= cap) for k in kept):
            kept.append(label)
    return kept


def _lower_bounds(inc: tuple[int, ...], first: tuple[int, ...]) -> list[int]:
    """Per end size j: the least a partial plan ending at j still adds (end there, or go on)."""
    m = len(first)
    least_above = [0] * m
    best = None
    for j in range(m - 1, -1, -1):
        least_above[j] = best if best is not None else -1
        best = first[j] if best is None else min(best, first[j])
    return [first[j] if least_above[j] < 0 else min(first[j], inc[j] + least_above[j]) for j in range(m)]


def frontier(problem: Problem, budget: Budget = Budget()) -> dict[int, Plan]:
    """For each number of graphs k (1 up to the budget's), the best plan of exactly k graphs
    within the memory and capture budgets; a k no plan fits is absent."""
    m = problem.size
    k_max = min(budget.max_graphs or m, m)
    served = [0, *accumulate(problem.weights)]  # steps at batches <= b
    eager_up_to = [0, *accumulate(w * e for w, e in zip(problem.weights, problem.eager_ns))]
    mem_on, cap_on = budget.memory_bytes is not None, budget.capture_us is not None
    mem_lb = _lower_bounds(problem.inc_bytes, problem.first_bytes)
    cap_lb = _lower_bounds(problem.inc_us, problem.first_us)
    labels: dict[tuple[int, int], list[_Label]] = {}
    best: dict[int, Plan] = {}
    for j in range(1, m + 1):
        graph = problem.graph_ns[j - 1]
        for k in range(1, min(k_max, j) + 1):
            grown: list[_Label] = [(served[j] * graph, 0, 0, (j,))] if k == 1 else [
                (ns + (served[j] - served[i]) * graph, mem + problem.inc_bytes[i - 1],
                 cap + problem.inc_us[i - 1], sizes + (j,))
                for i in range(k - 1, j) for ns, mem, cap, sizes in labels.get((i, k - 1), ())]
            grown = [label for label in grown  # those that can still end within the budget
                     if (not mem_on or label[1] + mem_lb[j - 1] <= budget.memory_bytes)
                     and (not cap_on or label[2] + cap_lb[j - 1] <= budget.capture_us)]
            labels[j, k] = _pareto(grown, mem_on, cap_on)
            for ns, mem, cap, sizes in labels[j, k]:
                plan = Plan(sizes, ns + eager_up_to[m] - eager_up_to[j], mem + problem.first_bytes[j - 1],
                            cap + problem.first_us[j - 1], served[m], served[m] - served[j], 0, 0)
                if fits(plan, budget) and (k not in best or plan.key < best[k].key):
                    best[k] = plan
    # the row counts are the evaluation's: the search tracks only what it ranks by
    return {k: evaluate(problem, plan.sizes) for k, plan in sorted(best.items())}


def choose(problem: Problem, budget: Budget = Budget(), said: str | None = None) -> tuple[Plan, dict[int, Plan]]:
    """The best plan of one or more graphs within `budget`, and the frontier it was chosen from.
    A budget no plan fits is refused, saying what the smallest plan needs (and the budget as
    `said`, as the user gave it, where given)."""
    if budget.max_graphs is not None and budget.max_graphs < 1:
        raise GraphrtError(f"--max-graphs {budget.max_graphs}: a plan holds at least one graph")
    plans = frontier(problem, budget)
    if not plans:
        raise GraphrtError(f"no plan fits {said or describe_budget(budget)}: {smallest_plan(problem)}")
    return min(plans.values(), key=lambda plan: plan.key), plans


def smallest_plan(problem: Problem) -> str:
    """What the least plan needs: any plan holds a first graph, whose cost bounds it below."""
    mem = min(range(problem.size), key=lambda i: (problem.first_bytes[i], i))
    cap = min(range(problem.size), key=lambda i: (problem.first_us[i], i))
    return (f"the smallest plan, one graph, needs {format_bytes(problem.first_bytes[mem], 'MiB', 3)} "
            f"(batch {mem + 1}) and {problem.first_us[cap] / 1e6:.3f} s of capture (batch {cap + 1})")


def describe_budget(budget: Budget) -> str:
    parts = [f"--max-graphs {budget.max_graphs}" if budget.max_graphs is not None else "",
             f"--memory {budget.memory_bytes / MIB:g} MiB" if budget.memory_bytes is not None else "",
             f"--capture-seconds {budget.capture_us / 1e6:g}" if budget.capture_us is not None else ""]
    return " ".join(p for p in parts if p) or "no budget"
