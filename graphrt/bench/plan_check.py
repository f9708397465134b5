"""The chosen plan, captured for real and run on a sample of the traffic, against its prediction.

A sample of decode steps is drawn from the traffic (seeded), and each runs as a server would
run it: a batch the plan holds pads up to the smallest captured size and replays that graph, a
larger one runs eagerly. Every step is timed on its own (`timing.StepTimer`), after one untimed
step of every size in the sample. The measured mean step is made as the prediction is: each
size's median step in the sample, weighted by its steps (a mean of raw steps would weigh a
machine's outliers that medians leave out). The prediction for the same sample is the cost
model's, from the per-size medians, with a band from the per-size p10s and p90s; the measured
mean has its band too, from each size's p10 and p90 in the sample. The two agree when the bands
overlap: a shared machine's speed drifts between the measuring and the check, and the check
can tell no finer than that spread. The plan's graph memory is measured as it is captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.bench.measure_sizes import SizeFigures
from graphrt.bench.traffic import Traffic
from graphrt.measure.stats import Stats
from graphrt.measure.timing import StepTimer
from graphrt.model.decoder import Qwen2ForCausalLM


@dataclass(frozen=True)
class Check:
    steps: int
    measured_ms: float  # mean step over the sample, from each size's median step in it
    predicted_ms: float  # the cost model's mean over the same sample, from per-size medians
    band_ms: tuple[float, float]  # ... from per-size p10s and p90s
    measured_band_ms: tuple[float, float]  # the sample's own, from each size's p10 and p90
    measured_bytes: int  # the plan's graphs, captured largest first into one pool
    predicted_bytes: int

    @property
    def agrees(self) -> bool:
        """The two spreads overlap: the prediction is as good as the timing can tell."""
        return self.measured_band_ms[0] <= self.band_ms[1] and self.band_ms[0] <= self.measured_band_ms[1]

    def describe(self) -> str:
        verdict = "agree within the timing's spread" if self.agrees else "disagree beyond the timing's spread"
        return (f"check: {self.steps} steps drawn from the traffic through the captured plan: "
                f"measured mean {self.measured_ms:.3f} ms (p10..p90 {self.measured_band_ms[0]:.3f}.."
                f"{self.measured_band_ms[1]:.3f}), predicted {self.predicted_ms:.3f} ms "
                f"({self.band_ms[0]:.3f}..{self.band_ms[1]:.3f}): {verdict}; "
                f"graph memory measured {self.measured_bytes / (1 << 20):.3f} MiB, "
                f"predicted {self.predicted_bytes / (1 << 20):.3f} MiB")

    def as_dict(self) -> dict:
        return {"steps": self.steps, "measured_ms": self.measured_ms, "predicted_ms": self.predicted_ms,
                "band_ms": list(self.band_ms), "measured_band_ms": list(self.measured_band_ms),
                "agrees": self.agrees,
                "measured_bytes": self.measured_bytes, "predicted_bytes": self.predicted_bytes}


def sample(traffic: Traffic, steps: int, seed: int) -> list[int]:
    """`steps` batch sizes drawn from the traffic's distribution, in a seeded order."""
    sizes = list(traffic)
    weights = torch.tensor([traffic[b] for b in sizes], dtype=torch.float64)
    drawn = torch.multinomial(weights, steps, replacement=True, generator=torch.Generator().manual_seed(seed))
    return [sizes[i] for i in drawn.tolist()]


def _cover(plan: tuple[int, ...], batch: int) -> int | None:
    return next((s for s in plan if s >= batch), None)


def predict(figures: list[SizeFigures], plan: tuple[int, ...], batches: list[int]) -> tuple[float, float, float]:
    """Mean step of `batches` through `plan` by the cost model: from medians, p10s and p90s."""
    by_size = {f.batch: f for f in figures}
    picked = []
    for b in batches:
        c = _cover(plan, b)
        f = by_size[c] if c is not None else by_size[b]
        picked.append((f.graph_ms, f.graph_p10, f.graph_p90) if c is not None else
                      (f.eager_ms, f.eager_p10, f.eager_p90))
    n = len(picked)
    return tuple(sum(p[i] for p in picked) / n for i in range(3))  # type: ignore[return-value]


def check(model: Qwen2ForCausalLM, figures: list[SizeFigures], plan: tuple[int, ...],
          predicted_bytes: int, traffic: Traffic, steps: int, position: int, seed: int = 0) -> Check:
    """Capture `plan` on `model` and time `steps` sampled steps through it (see the module).
    The cache must hold max(plan, traffic) rows and `position` + 1 slots."""
    device = model.lm_head.weight.device
    batches = sample(traffic, steps, seed)
    graphs = GraphBackend(model, plan, lint=False)  # the measurement linted this step already
    captured = graphs.prepare(plan[-1])
    eager = EagerBackend(model)

    def run(batch: int, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        (graphs if _cover(plan, batch) is not None else eager).step(tokens, positions)

    timer = StepTimer(device)
    with torch.inference_mode():
        inputs = {b: (torch.zeros(b, 1, dtype=torch.long, device=device),
                      torch.full((b,), position, dtype=torch.long, device=device)) for b in set(batches)}
        for batch in sorted(inputs):  # warm: a size's first eager step pays for itself
            run(batch, *inputs[batch])
        for batch in batches:
            with timer.step():
                run(batch, *inputs[batch])
    per_size: dict[int, list[float]] = {}
    for batch, ms in zip(batches, timer.samples_ms()):
        per_size.setdefault(batch, []).append(ms)
    # each size's median, weighted by its steps: the statistic the prediction is made of
    stats = [(len(ms), Stats.of(ms)) for ms in per_size.values()]
    measured, m_low, m_high = (sum(n * getattr(s, q) for n, s in stats) / steps for q in ("median", "p10", "p90"))
    predicted, low, high = predict(figures, plan, batches)
    return Check(steps, measured, predicted, (low, high), (m_low, m_high), captured.memory_bytes, predicted_bytes)
