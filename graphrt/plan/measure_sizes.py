"""Per batch size: the eager step, the replayed step, the graph's memory and capture time.

The sizes of a grid are measured on one model and one KV cache. First every size runs one eager
step, so that no size's figures pay for what a process does once (the cuBLAS handle, lazily
loaded kernels, attention's set-up) and none depends on the order of measuring. Then every
size's graph is captured largest first into one pool (`GraphBackend.prepare`, as a server
captures its list), which gives each graph's increment to a pool larger graphs filled and its
capture time. Then the steps are timed in interleaved rounds (graphrt.plan.size_rounds: every
size and mode a few steps a round, each a decode through `run.decode` after warmup, each step
from an idle device, `DRAINED`), so that a stretch a busy machine loses falls on one round, and
its outliers are left out by name.

On CUDA each size but the largest is also captured alone into a fresh pool, for what it costs
as the first (largest) graph of a plan; a tape keeps its own tensors whatever the pool, so there
the two are one figure (graphrt.plan.optimize states the model). Sizes between grid points are
interpolated linearly and say so.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace

import torch

from graphrt.backends.base import Backend
from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.plan import size_rounds
from graphrt.errors import GraphrtError
from graphrt.graphs import graph_kind
from graphrt.measure.nvtx import nvtx_range
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.run.decode import decode, random_prompt


# Every step the plan times (these per-size figures, and the check's sample through the captured
# plan, graphrt.plan.check) starts on an idle device: a step the check runs after queued
# replays is then timed as the same step was here, its launch cost included either way.
DRAINED = True
FIRST_STEP = "first_step[bs={}]"  # the range around each size's first step, before any is measured


@dataclass(frozen=True)
class SizeFigures:
    batch: int
    eager_ms: float  # median eager step
    eager_p10: float
    eager_p90: float
    graph_ms: float  # median replayed step
    graph_p10: float
    graph_p90: float
    graph_bytes: int  # what the graph adds to a pool larger graphs filled
    capture_s: float  # its capture, after larger ones
    first_graph_bytes: int  # ... into an empty pool, as a plan's largest graph
    first_capture_s: float
    measured: bool  # False: interpolated between the measured sizes around it
    # measured sizes: each round's median step, and the steps left out as outliers, per mode
    # (graphrt.plan.size_rounds); empty where interpolated, or read from a plan made before rounds
    eager_rounds_ms: tuple[float, ...] = ()
    graph_rounds_ms: tuple[float, ...] = ()
    eager_outliers_ms: tuple[float, ...] = ()
    graph_outliers_ms: tuple[float, ...] = ()

    @property
    def has_rounds(self) -> bool:
        return bool(self.eager_rounds_ms and self.graph_rounds_ms)


ROUND_FIELDS = ("eager_rounds_ms", "graph_rounds_ms", "eager_outliers_ms", "graph_outliers_ms")


def grid(top: int, spec: str, keep: Iterable[int] = ()) -> tuple[int, ...]:
    """The sizes to measure for candidates 1..`top`: `all`; `auto` (1..8, then every multiple of
    8, and the sizes in `keep`: the traffic's largest batch and the sizes lists run it as); or
    a comma list. 1
    and `top` are always in, so every size lies between two measured ones."""
    if spec == "all":
        return tuple(range(1, top + 1))
    if spec == "auto":
        chosen = {*range(1, min(8, top) + 1), *range(8, top + 1, 8), *keep}
    else:
        try:
            chosen = {int(part) for part in spec.split(",")}
        except ValueError:
            raise GraphrtError(f"--grid {spec!r}: expected all, auto or comma-separated batch sizes") from None
        if any(b <= 0 for b in chosen):
            raise GraphrtError(f"--grid {spec!r}: batch sizes are positive integers")
    return tuple(sorted(b for b in chosen | {1, top} if b <= top))


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _alone(model: Qwen2ForCausalLM, sizes: tuple[int, ...]) -> dict[int, tuple[int, float]]:
    """CUDA: each size but the largest captured alone into a fresh pool: (bytes, seconds)."""
    device = model.lm_head.weight.device
    if graph_kind(device) != "cuda":
        return {}
    found = {}
    for bs in sizes[:-1]:
        report = GraphBackend(model, (bs,), lint=False).prepare(bs)
        found[bs] = (report.memory_bytes, report.capture_seconds[bs])
        _free(device)
    return found


def per_round(steps: int, warmup: int, rounds: int) -> int:
    """Timed steps per size, mode and round: `steps` - `warmup` over the rounds, rounded up."""
    return max(1, -(-(steps - warmup) // rounds))


def _first_steps(model: Qwen2ForCausalLM, sizes: tuple[int, ...], position: int,
                 say: Callable[[int, int, str], None], total: int) -> None:
    """One eager step of every size, each in a `first_step[bs=N]` range: what the process does
    once for a shape happens here, before any size is measured. The cache slot it writes is
    written again by every decode after it."""
    device = model.lm_head.weight.device
    eager = EagerBackend(model)
    with torch.inference_mode():
        for done, bs in enumerate(sizes):
            say(done, total, f"first step of batch {bs}")
            with nvtx_range(FIRST_STEP.format(bs)):
                eager.step(torch.zeros(bs, 1, dtype=torch.long, device=device),
                           torch.full((bs,), position, dtype=torch.long, device=device))


def measure(model: Qwen2ForCausalLM, sizes: tuple[int, ...], steps: int, warmup: int,
            prompt_len: int, seed: int = 0, rounds: int = size_rounds.ROUNDS,
            on_measure: Callable[[int, int, str], None] | None = None) -> dict[int, SizeFigures]:
    """Figures of every size in `sizes` (ascending), measured on `model` in `rounds` rounds
    (and up to as many extra ones). `on_measure(done, total, label)` hears of each part as it
    starts: each size's first step, the captures, then each round (the total counts every extra
    round that may run)."""
    total = len(sizes) + 1 + 2 * rounds
    say = on_measure or (lambda done, total, label: None)
    device = model.lm_head.weight.device
    model.setup_cache(sizes[-1], prompt_len + steps)
    _first_steps(model, sizes, prompt_len, say, total)
    say(len(sizes), total, f"capturing {len(sizes)} graphs")
    alone = _alone(model, sizes)
    graphs = GraphBackend(model, sizes)
    prepared = graphs.prepare(sizes[-1])
    eager = EagerBackend(model)
    prompt = random_prompt(sizes[-1], prompt_len, model.config.vocab_size, seed)
    backends: dict[str, Backend] = {"eager": eager, "graph": graphs}

    def time_block(bs: int, mode: str, timed: int) -> list[float]:
        return decode(backends[mode], prompt[:bs], warmup + timed, warmup, keep_logits=False,
                      drained=DRAINED).step_ms

    timed = size_rounds.run_rounds(sizes, time_block, rounds, per_round(steps, warmup, rounds),
                                   lambda index, label: say(len(sizes) + 1 + index, total, label))
    figures = {}
    for bs in sizes:
        e, g = timed[bs, "eager"], timed[bs, "graph"]
        shared = (prepared.buckets[bs]["pool_bytes"], prepared.capture_seconds[bs])
        first = alone.get(bs, shared)
        figures[bs] = SizeFigures(bs, e.median, e.p10, e.p90, g.median, g.p10, g.p90, *shared, *first,
                                  measured=True, eager_rounds_ms=e.round_medians, graph_rounds_ms=g.round_medians,
                                  eager_outliers_ms=e.outliers, graph_outliers_ms=g.outliers)
    del graphs
    _free(device)
    return figures


def interpolate(measured: dict[int, SizeFigures], top: int) -> list[SizeFigures]:
    """Every size 1..`top`: the measured ones as they are, the others linear between the
    measured sizes around them (memory rounded to bytes)."""
    points = sorted(measured)
    if points[0] != 1 or points[-1] < top:
        raise GraphrtError(f"the measurements cover batch {points[0]}..{points[-1]}; "
                           f"the plan needs 1..{top}")
    out = []
    for b in range(1, top + 1):
        if b in measured:
            out.append(measured[b])
            continue
        lo, hi, t = between(points, b)
        a, z = asdict(measured[lo]), asdict(measured[hi])
        mixed = {f.name: a[f.name] + t * (z[f.name] - a[f.name]) for f in fields(SizeFigures)
                 if f.name not in ("batch", "measured", *ROUND_FIELDS)}
        for name in ("graph_bytes", "first_graph_bytes"):
            mixed[name] = round(mixed[name])
        out.append(SizeFigures(batch=b, measured=False, **mixed))
    return out


def between(points: list[int], b: int) -> tuple[int, int, float]:
    """The measured sizes on either side of `b` (not itself measured, inside `points`, sorted)
    and how far along from the lower to the upper it lies (0..1)."""
    lo = max(p for p in points if p < b)
    hi = min(p for p in points if p > b)
    return lo, hi, (b - lo) / (hi - lo)


def to_records(figures: list[SizeFigures]) -> list[dict]:
    return [asdict(f) for f in figures]


def from_records(records: list[dict], source: str) -> dict[int, SizeFigures]:
    """The measured sizes of an earlier plan's `per_size` (one made before rounds has no round
    fields: its figures' uncertainty is then unknown); a malformed entry is refused."""
    names = {f.name for f in fields(SizeFigures)}
    found = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not names - set(ROUND_FIELDS) <= set(record) <= names:
            raise GraphrtError(f"{source}: per_size[{i}]: expected the fields {', '.join(sorted(names))}")
        figure = SizeFigures(**{**record, **{k: tuple(record.get(k, ())) for k in ROUND_FIELDS}})
        if figure.measured:
            found[figure.batch] = replace(figure)
    if not found:
        raise GraphrtError(f"{source}: per_size holds no measured size")
    return found
