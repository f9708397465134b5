"""Per batch size: the eager step, the replayed step, the graph's memory and capture time.

The sizes of a grid are measured on one model and one KV cache. First every size runs one eager
step, so that no size's figures pay for what a process does once (the cuBLAS handle, lazily
loaded kernels, attention's set-up) and none depends on the order of measuring. Then every
size's graph is captured largest first into one pool (`GraphBackend.prepare`, as a server
captures its list), which gives each graph's increment to a pool larger graphs filled and its
capture time; then each size decodes eagerly and through its graph (`run.decode`: the steps after
warmup, each from an idle device, `DRAINED`), in two rounds, eager first then replayed first, so
that a machine that slows down in between weighs on both modes alike (as `graphrt bench`
interleaves its modes).
On CUDA each size but the largest is also captured alone into a fresh pool, for what it costs
as the first (largest) graph of a plan; a tape keeps its own tensors whatever the pool, so there
the two are one figure (graphrt.bench.optimize states the model). Sizes between grid points are interpolated linearly and say so.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace

import torch

from graphrt.backends.base import Backend
from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.errors import GraphrtError
from graphrt.graphs import graph_kind
from graphrt.measure.nvtx import nvtx_range
from graphrt.measure.stats import Stats
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.run.decode import decode, random_prompt


# Every step the plan times (these per-size figures, and the check's sample through the captured
# plan, graphrt.bench.plan_check) starts on an idle device: a step the check runs after queued
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
    if device.type == "cuda":  # pragma: no mutate (CUDA only)
        torch.cuda.empty_cache()


def _alone(model: Qwen2ForCausalLM, sizes: tuple[int, ...]) -> dict[int, tuple[int, float]]:
    """CUDA: each size but the largest captured alone into a fresh pool: (bytes, seconds)."""
    device = model.lm_head.weight.device
    if graph_kind(device) != "cuda":
        return {}
    found = {}
    for bs in sizes[:-1]:  # pragma: no mutate block (CUDA only)
        report = GraphBackend(model, (bs,), lint=False).prepare(bs)
        found[bs] = (report.memory_bytes, report.capture_seconds[bs])
        _free(device)
    return found


def _interleaved(eager: Backend, graphs: Backend, prompt: torch.Tensor, steps: int,
                 warmup: int) -> tuple[Stats, Stats]:
    """Each mode's step times over two rounds (eager, replayed; replayed, eager), each round
    `warmup` untimed steps and half of `steps` - `warmup` timed ones, rounded up."""
    per_round = max(1, (steps - warmup + 1) // 2)
    samples: dict[Backend, list[float]] = {eager: [], graphs: []}
    for order in ((eager, graphs), (graphs, eager)):
        for backend in order:
            samples[backend] += decode(backend, prompt, warmup + per_round, warmup, keep_logits=False,
                                       drained=DRAINED).step_ms
    return Stats.of(samples[eager]), Stats.of(samples[graphs])


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
            prompt_len: int, seed: int = 0,
            on_measure: Callable[[int, int, str], None] | None = None) -> dict[int, SizeFigures]:
    """Figures of every size in `sizes` (ascending), measured on `model`. `on_measure(done,
    total, label)` hears of each part as it starts: each size's first step, the captures, then
    each size's timing."""
    total = 2 * len(sizes) + 1
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
    figures = {}
    for done, bs in enumerate(sizes, len(sizes) + 1):
        say(done, total, f"batch {bs}")
        e, g = _interleaved(eager, graphs, prompt[:bs], steps, warmup)
        shared = (prepared.buckets[bs]["pool_bytes"], prepared.capture_seconds[bs])
        first = alone.get(bs, shared)
        figures[bs] = SizeFigures(bs, e.median, e.p10, e.p90, g.median, g.p10, g.p90,
                                  *shared, *first, measured=True)
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
        lo = max(p for p in points if p < b)
        hi = min(p for p in points if p > b)
        t = (b - lo) / (hi - lo)
        a, z = asdict(measured[lo]), asdict(measured[hi])
        mixed = {f.name: a[f.name] + t * (z[f.name] - a[f.name]) for f in fields(SizeFigures)
                 if f.name not in ("batch", "measured")}
        for name in ("graph_bytes", "first_graph_bytes"):
            mixed[name] = round(mixed[name])
        out.append(SizeFigures(batch=b, measured=False, **mixed))
    return out


def to_records(figures: list[SizeFigures]) -> list[dict]:
    return [asdict(f) for f in figures]


def from_records(records: list[dict], source: str) -> dict[int, SizeFigures]:
    """The measured sizes of an earlier plan's `per_size`; a malformed entry is refused."""
    names = {f.name for f in fields(SizeFigures)}
    found = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or set(record) != names:
            raise GraphrtError(f"{source}: per_size[{i}]: expected the fields {', '.join(sorted(names))}")
        figure = SizeFigures(**record)
        if figure.measured:
            found[figure.batch] = replace(figure)
    if not found:
        raise GraphrtError(f"{source}: per_size holds no measured size")
    return found
