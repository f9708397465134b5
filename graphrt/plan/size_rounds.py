"""Per batch size and mode, step times that a stall cannot capture: interleaved rounds.

A busy machine slows some stretches of a measuring and not others. If each size's steps were
timed in one block, a stretch lost to another job would fall on one size alone and make it look
slow or fast for good. So the sizes are timed round-robin: each round times every size and mode
a few steps (sizes ascending and eager first, then the next round in the reverse order), and a
slow stretch lands on one round of a few sizes, where the figures below leave it out:

- the steps of a size and mode beyond `median + k * MAD` of all its steps are outliers, left out
  and kept by name (`graphrt.measure.robust`);
- each round gives the median of its remaining steps, and the figure is the median of those
  round medians: one slow round of four moves it by no more than the rounds' own spread;
- the figure's uncertainty is a bootstrap over its round medians (the central `LEVEL`); a figure
  known to no better than `WIDE` (either way) is timed again in extra rounds, at most as many
  as the first, and only the wide ones.

The timing itself is a function given in (`TimeBlock`), so the rounds run the same on a device
and on samples a test plants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from graphrt.measure import robust
from graphrt.quantiles import percentile
from graphrt.vocab import Mode

MODES = (Mode.EAGER, Mode.GRAPH)  # what a plan times: each size eagerly and replayed
ROUNDS = 4  # the default number of rounds every size and mode is timed in
WIDE = 0.05  # a figure whose interval reaches further than this from it earns another round
LEVEL = 0.9  # the central share of the bootstrap an interval holds
REPLICATES = 400  # bootstrap resamplings
SEED = 0  # the bootstrap's, so that the same steps give the same figures

# (batch, mode, timed steps) -> each timed step's milliseconds, in order
TimeBlock = Callable[[int, str, int], list[float]]
Key = tuple[int, str]  # (batch, mode)


@dataclass(frozen=True)
class Timed:
    """One size and mode's timed steps, per round, in milliseconds."""

    rounds: tuple[tuple[float, ...], ...]

    @cached_property
    def _bound(self) -> float:
        return robust.outlier_bound([ms for r in self.rounds for ms in r])

    @property
    def outliers(self) -> tuple[float, ...]:
        """The steps left out, in the order they were timed."""
        return tuple(ms for r in self.rounds for ms in r if ms > self._bound)

    @property
    def kept(self) -> list[float]:
        return sorted(ms for r in self.rounds for ms in r if ms <= self._bound)

    @property
    def round_medians(self) -> tuple[float, ...]:
        """The median of each round's kept steps (a round with none left out of the figures)."""
        kept = ([ms for ms in r if ms <= self._bound] for r in self.rounds)
        return tuple(robust.median(r) for r in kept if r)

    @property
    def median(self) -> float:
        return robust.median(self.round_medians)

    @property
    def p10(self) -> float:
        return percentile(self.kept, 10)

    @property
    def p90(self) -> float:
        return percentile(self.kept, 90)

    @property
    def width(self) -> float:
        """How far the figure's interval reaches from it, as a share of it (the larger side)."""
        return relative_reach(self.round_medians)


def median_interval(round_medians: Sequence[float]) -> tuple[float, float]:
    """The central LEVEL of the bootstrap of the median of `round_medians`."""
    medians = robust.bootstrap([round_medians], lambda g: robust.median(g[0]), REPLICATES, SEED)
    return robust.interval(medians, LEVEL)


def relative_reach(round_medians: Sequence[float]) -> float:
    """How far `median_interval` reaches from the median, as a share of it."""
    centre = robust.median(round_medians)
    low, high = median_interval(round_medians)
    return max(centre - low, high - centre) / centre if centre else 0.0


def _order(keys: list[Key], round_index: int) -> list[Key]:
    """Ascending sizes, eager first; every other round the reverse, so that no size or mode is
    always timed first or last in a round."""
    ordered = sorted(keys, key=lambda k: (k[0], MODES.index(k[1])))
    return ordered[::-1] if round_index % 2 else ordered


def run_rounds(sizes: Sequence[int], time_block: TimeBlock, rounds: int, per_round: int,
               on_round: Callable[[int, str], None] = lambda index, label: None) -> dict[Key, Timed]:
    """Every size in `sizes` and mode in MODES, `per_round` steps each in each of `rounds`
    rounds, then extra rounds (at most `rounds`) of those whose figure is wider than WIDE.
    `on_round(index, label)` hears of each round as it starts."""
    keys = [(bs, mode) for bs in sizes for mode in MODES]
    samples: dict[Key, list[tuple[float, ...]]] = {k: [] for k in keys}
    for index in range(2 * rounds):
        due = keys if index < rounds else [k for k in keys if Timed(tuple(samples[k])).width > WIDE]
        if not due:
            break
        on_round(index, f"round {index + 1} of {rounds}" if index < rounds else
                 f"extra round {index - rounds + 1}: {len(due)} wide figures")
        for bs, mode in _order(due, index):
            samples[bs, mode].append(tuple(time_block(bs, mode, per_round)))
    return {k: Timed(tuple(r)) for k, r in samples.items()}
