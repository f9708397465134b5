"""The chosen plan, captured for real and run on a sample of the traffic, against its prediction.

A sample of decode steps is drawn from the traffic (seeded), and each runs as a server would
run it: a batch the plan holds pads up to the smallest captured size and replays that graph, a
larger one runs eagerly. Every step is timed on its own (`timing.StepTimer`), from an idle device
as the per-size figures were (`measure_sizes.DRAINED`): an eager fallback queued behind replays
would otherwise be timed as its GPU work alone, its launch cost hidden in the queue. One untimed
step of every size in the sample runs first.

A shared machine's speed drifts between the measuring and the check, so the check does not set
the sample against the plan's figures alone. It runs in rounds, as `graphrt bench` interleaves
its modes: a stretch of the sample in traffic order, then each of the sample's sizes a few steps
alone, as the measuring timed them. The verdict compares the sample with the cost model on the
sizes re-timed beside it (the same machine, the same minutes): it holds when stepping sizes in
a server's mixed order costs what steps of one size cost, padding and eager fallback included.
Set against the plan's own figures, the re-timed ones say how far the machine has moved since
the measuring (a `--measurements` file from another day, another load).

Each mean is made as the prediction is: each size's median step, weighted by its steps in the
sample (a mean of raw steps would weigh a machine's outliers that medians leave out), with a band
from the sizes' p10s and p90s. Two means agree when their bands overlap. The plan's graph memory
is measured as it is captured.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.plan.measure_sizes import DRAINED, SizeFigures
from graphrt.plan.traffic import Traffic
from graphrt.measure.stats import Stats
from graphrt.measure.timing import StepTimer
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.units import format_bytes

Quantiles = tuple[float, float, float]  # a size's median, p10 and p90 step, ms
ROUNDS = 3  # stretches of the sample, each followed by the sizes re-timed alone
ALONE_STEPS = 4  # consecutive steps of one size, per size and round


@dataclass(frozen=True)
class Mean:
    """A mean step over the sample: each size's median (and p10, p90) weighted by its steps."""

    ms: float
    band: tuple[float, float]  # from the p10s and the p90s

    def overlaps(self, other: Mean) -> bool:
        return self.band[0] <= other.band[1] and other.band[0] <= self.band[1]

    def describe(self) -> str:
        return f"{self.ms:.3f} ms (p10..p90 {self.band[0]:.3f}..{self.band[1]:.3f})"

    @classmethod
    def weighted(cls, steps_of: dict[int, int], quantiles_of: dict[int, Quantiles]) -> Mean:
        """From each size's (median, p10, p90), weighted by its steps."""
        total = sum(steps_of.values())
        ms, low, high = (sum(n * quantiles_of[b][i] for b, n in steps_of.items()) / total for i in range(3))
        return cls(ms, (low, high))


@dataclass(frozen=True)
class Check:
    steps: int  # sampled steps timed through the plan
    measured: Mean  # the sample, in traffic order, through the captured plan
    retimed: Mean  # the cost model on the sample's sizes re-timed alone beside it
    predicted: Mean  # the cost model on the figures the plan was made from
    measured_bytes: int  # the plan's graphs, captured largest first into one pool
    predicted_bytes: int

    @property
    def agrees(self) -> bool:
        """The sample costs what its sizes cost alone, as far as the timing's spread can tell."""
        return self.measured.overlaps(self.retimed)

    @property
    def figures_hold(self) -> bool:
        """The sizes re-timed now cost what the plan's figures say, within the spreads."""
        return self.retimed.overlaps(self.predicted)

    def describe(self) -> str:
        verdict = "agree within the timing's spread" if self.agrees else "disagree beyond the timing's spread"
        drift = self.retimed.ms / self.predicted.ms - 1
        held = ("they hold" if self.figures_hold else
                f"the machine ran {abs(drift):.1%} {'slower' if drift > 0 else 'faster'} than while "
                "measuring: measure again before trusting the plan's figures")
        return "\n".join([
            f"check: {self.steps} steps drawn from the traffic through the captured plan, in {ROUNDS} "
            "rounds, each followed by the sample's sizes re-timed alone:",
            f"  measured mean step          {self.measured.describe()}",
            f"  cost model, sizes re-timed  {self.retimed.describe()}: {verdict}",
            f"  cost model, plan's figures  {self.predicted.describe()}: {held}",
            f"  graph memory                measured {format_bytes(self.measured_bytes, 'MiB', 3)}, "
            f"predicted {format_bytes(self.predicted_bytes, 'MiB', 3)}"])

    def as_dict(self) -> dict:
        def mean(m: Mean) -> dict:
            return {"ms": m.ms, "band_ms": list(m.band)}

        return {"steps": self.steps, "measured": mean(self.measured), "retimed": mean(self.retimed),
                "predicted": mean(self.predicted), "agrees": self.agrees, "figures_hold": self.figures_hold,
                "measured_bytes": self.measured_bytes, "predicted_bytes": self.predicted_bytes}

    @classmethod
    def from_dict(cls, d: dict) -> Check:
        def mean(m: dict) -> Mean:
            return Mean(m["ms"], tuple(m["band_ms"]))

        return cls(d["steps"], mean(d["measured"]), mean(d["retimed"]), mean(d["predicted"]),
                   d["measured_bytes"], d["predicted_bytes"])


def sample(traffic: Traffic, steps: int, seed: int) -> list[int]:
    """`steps` batch sizes drawn from the traffic's distribution, in a seeded order."""
    sizes = list(traffic)
    weights = torch.tensor([traffic[b] for b in sizes], dtype=torch.float64)
    drawn = torch.multinomial(weights, steps, replacement=True, generator=torch.Generator().manual_seed(seed))
    return [sizes[i] for i in drawn.tolist()]


def _cover(plan: tuple[int, ...], batch: int) -> int | None:
    return next((s for s in plan if s >= batch), None)


def predict(figures: list[SizeFigures], plan: tuple[int, ...], batches: list[int]) -> Mean:
    """Mean step of `batches` through `plan` by the cost model, from the figures' medians, p10s
    and p90s: a covered batch costs its graph's replay, another its own eager step."""
    by_size = {f.batch: f for f in figures}
    steps_of = Counter(batches)
    quantiles_of = {}
    for b in steps_of:
        c = _cover(plan, b)
        f = by_size[c] if c is not None else by_size[b]
        quantiles_of[b] = ((f.graph_ms, f.graph_p10, f.graph_p90) if c is not None else
                           (f.eager_ms, f.eager_p10, f.eager_p90))
    return Mean.weighted(steps_of, quantiles_of)


def check(model: Qwen2ForCausalLM, figures: list[SizeFigures], plan: tuple[int, ...],
          predicted_bytes: int, traffic: Traffic, steps: int, position: int, seed: int = 0) -> Check:
    """Capture `plan` on `model` and time `steps` sampled steps through it, in rounds with the
    sizes re-timed alone (see the module). The cache must hold max(plan, traffic) rows and
    `position` + 1 slots."""
    device = model.lm_head.weight.device
    batches = sample(traffic, steps, seed)
    graphs = GraphBackend(model, plan, lint=False)  # the measurement linted this step already
    captured = graphs.prepare(plan[-1])
    eager = EagerBackend(model)
    inputs = {b: (torch.zeros(b, 1, dtype=torch.long, device=device),
                  torch.full((b,), position, dtype=torch.long, device=device)) for b in set(batches)}

    def run(batch: int) -> None:
        (graphs if _cover(plan, batch) is not None else eager).step(*inputs[batch])

    # each step from an idle device, as the figures it is set against were timed (DRAINED)
    in_sample, alone = StepTimer(device, DRAINED), StepTimer(device, DRAINED)
    alone_order = []
    with torch.inference_mode():
        for batch in sorted(inputs):  # warm: a size's first eager step pays for itself
            run(batch)
        for r in range(ROUNDS):
            for batch in batches[r * steps // ROUNDS:(r + 1) * steps // ROUNDS]:
                with in_sample.step():
                    run(batch)
            for batch in sorted(inputs):
                for _ in range(ALONE_STEPS):
                    with alone.step():
                        run(batch)
                alone_order += [batch] * ALONE_STEPS
    steps_of = Counter(batches)
    sample_ms = in_sample.samples_ms()
    return Check(len(sample_ms), Mean.weighted(steps_of, _per_size(batches, sample_ms)),
                 Mean.weighted(steps_of, _per_size(alone_order, alone.samples_ms())),
                 predict(figures, plan, batches), captured.memory_bytes, predicted_bytes)


def _per_size(order: list[int], samples_ms: list[float]) -> dict[int, Quantiles]:
    per_size: dict[int, list[float]] = {}
    for batch, ms in zip(order, samples_ms):
        per_size.setdefault(batch, []).append(ms)
    stats = {b: Stats.of(ms) for b, ms in per_size.items()}
    return {b: (s.median, s.p10, s.p90) for b, s in stats.items()}
