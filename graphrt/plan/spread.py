"""How sure a plan's comparisons are: each list's "vs chosen" with the uncertainty of the figures
it rests on, and whether the figures can choose at all.

The per-size figures are medians of round medians (graphrt.plan.size_rounds). How far a round
median strays from its figure is the machine's doing (a busy stretch slows any size alike), not
the size's: three rounds of one size that happen to agree do not make it known to the
microsecond while every other size's rounds stray by a fifth. So the strays are pooled: each
round median over its figure, of every size and mode. A replicate redraws every measured
figure as itself times the median of as many pooled strays as it has rounds (drawn with
replacement), interpolates the sizes between as the plan does, and costs every list over the
traffic on those figures. A list's "vs chosen" is its mean step over the chosen plan's in the same
replicate, less one, so a size both lists replay weighs on both alike; its interval is the
central LEVEL of the replicates. An interval that holds 0 is no measurable difference: the
figures cannot rank the two lists.

The chosen plan's own mean step gets an interval the same way. Where it reaches further than
NOISY from the mean, the machine was too noisy to choose between plans: the plan says so, with
the rounds it would need, instead of a verdict. Figures read from a plan made before rounds
carry none: their uncertainty is unknown, and said so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from graphrt.plan import size_rounds
from graphrt.plan.measure_sizes import SizeFigures, between
from graphrt.plan.optimize import Problem, evaluate
from graphrt.measure import robust

NOISY = 0.10  # the furthest the chosen plan's interval may reach from its mean step for a choice

Listed = tuple[tuple[int, ...], bool]  # a list's sizes (those evaluated) and whether it pads


@dataclass(frozen=True)
class VsChosen:
    ratio: float  # the list's mean step / the chosen plan's - 1, on the figures themselves
    interval: tuple[float, float] | None  # the central LEVEL of the replicates; None: unknown

    @property
    def measurable(self) -> bool:
        """The interval leaves 0 out: one list is faster than the other beyond the noise."""
        return self.interval is not None and (self.interval[0] > 0 or self.interval[1] < 0)

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "interval": None if self.interval is None else list(self.interval),
                "measurable": self.measurable}


@dataclass(frozen=True)
class Verdict:
    rounds: int  # the most rounds any measured figure rests on (extra rounds included)
    chosen_reach: float | None  # how far the chosen plan's interval reaches from its mean; None: unknown

    @property
    def noisy(self) -> bool:
        return self.chosen_reach is not None and self.chosen_reach > NOISY

    def describe(self) -> str | None:
        """What the plan says in place of a verdict, where it cannot give one."""
        level = f"{size_rounds.LEVEL:.0%}"
        if self.chosen_reach is None:
            return ("the per-size figures carry no rounds (a plan made before them): how far apart "
                    "the lists are beyond noise is unknown; measure again to know")
        if not self.noisy:
            return None
        # an interval narrows as the square root of the rounds; and more than any figure had
        needed = max(math.ceil(self.rounds * (self.chosen_reach / NOISY) ** 2), self.rounds + 1)
        return (f"the machine is too noisy to choose: the chosen plan's mean step is known only to "
                f"±{self.chosen_reach:.1%} ({level} interval, figures of up to {self.rounds} rounds; a choice needs "
                f"±{NOISY:.0%}): plan on an idle machine, or with --rounds {needed} or more")

    def as_dict(self) -> dict:
        return {"noisy": self.noisy, "chosen_reach": self.chosen_reach, "level": size_rounds.LEVEL,
                "rounds": self.rounds, "said": self.describe()}


def _line(values: dict[int, float], top: int) -> tuple[int, ...]:
    """Figures (ms) at the measured sizes -> ns at every size 1..`top`, linear between."""
    points = sorted(values)
    out = []
    for b in range(1, top + 1):
        if b in values:
            ms = values[b]
        else:
            lo, hi, t = between(points, b)
            ms = values[lo] + t * (values[hi] - values[lo])
        out.append(round(ms * 1e6))
    return tuple(out)


def replicates(problem: Problem, measured: dict[int, SizeFigures]) -> list[Problem] | None:
    """`problem` with its step figures redrawn from the pooled strays of the rounds (see the
    module), REPLICATES times (seeded); None where a measured size has no rounds."""
    sizes = sorted(measured)
    if not all(measured[b].has_rounds for b in sizes):
        return None
    groups = [g for b in sizes for g in (measured[b].eager_rounds_ms, measured[b].graph_rounds_ms)]
    figures = [robust.median(g) for g in groups]
    strays = [ms / figure for g, figure in zip(groups, figures) for ms in g]  # in the groups' order

    def redrawn(resampled: list[list[float]]) -> Problem:
        # one draw of len(strays) pooled strays, cut into as many as each figure has rounds
        drawn, start, redrawn_ms = resampled[0], 0, []
        for g, figure in zip(groups, figures):
            redrawn_ms.append(figure * robust.median(drawn[start:start + len(g)]))
            start += len(g)
        eager = dict(zip(sizes, redrawn_ms[0::2]))
        graph = dict(zip(sizes, redrawn_ms[1::2]))
        return replace(problem, eager_ns=_line(eager, problem.size), graph_ns=_line(graph, problem.size))

    return robust.bootstrap([strays], redrawn, size_rounds.REPLICATES, size_rounds.SEED)


def compare(problem: Problem, measured: dict[int, SizeFigures], chosen: tuple[int, ...],
            lists: Sequence[Listed]) -> tuple[list[VsChosen], Verdict]:
    """Each of `lists` against the `chosen` plan (which pads), and the verdict on the figures."""
    base = evaluate(problem, chosen).total_ns
    ratios = [evaluate(problem, sizes, padding).total_ns / base - 1 for sizes, padding in lists]
    drawn = replicates(problem, measured)
    if drawn is None:
        return [VsChosen(r, None) for r in ratios], Verdict(0, None)
    rounds = max(len(g) for f in measured.values() for g in (f.eager_rounds_ms, f.graph_rounds_ms))
    chosen_totals = [evaluate(p, chosen).total_ns for p in drawn]
    intervals = [robust.interval([evaluate(p, sizes, padding).total_ns / c - 1
                                  for p, c in zip(drawn, chosen_totals)], size_rounds.LEVEL)
                 for sizes, padding in lists]
    low, high = robust.interval([c / base - 1 for c in chosen_totals], size_rounds.LEVEL)
    return ([VsChosen(r, i) for r, i in zip(ratios, intervals)], Verdict(rounds, max(-low, high)))
