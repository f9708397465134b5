"""Record decode steps in this process: warm up outside the recording, then record the steps.

    config, model, device, _ = execute.load(spec)
    recorded = record_modes(spec, config, model, window=lambda mode: torch_window(device, path))

For each mode of the spec: capture (graph mode), prefill and the warmup steps run first, none of
it recorded; then `window(mode)` is entered, the remaining decode steps run, and it is left. The
window is what a profiler records:

- `nsys_window`: an NVTX range `record` around the steps (Nsight Systems starts recording when
  it opens, on a machine without CUDA) and, on CUDA, cudaProfilerStart/Stop around that (what
  nsys waits for there). The process is started by `nsys profile` (see graphrt.trace.record.make_traces).
- `torch_window`: torch.profiler around the steps, with every graphrt NVTX range mirrored as a
  `record_function` range of the same name, so the Chrome trace holds the ranges an Nsight
  Systems timeline would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphrt.backends.base import Backend
from graphrt.backends.choices import expand_modes
from graphrt.backends.factory import make_backend
from graphrt.backends.graph import GraphBackend
from graphrt.errors import GraphrtError
from graphrt.graphs import CudaGraph, TapeGraph
from graphrt.graphs.annotate import NO_NODE_IDS, profiler_node_ids
from graphrt.measure import nvtx
from graphrt.measure.launches import StepLaunches
from graphrt.measure.profiling import Session, profiler_session
from graphrt.model.config import ModelConfig
from graphrt.model.decoder import Qwen2ForCausalLM, greedy
from graphrt.run.decode import count_launches, decode, random_prompt
from graphrt.run.spec import RunSpec

RECORD_RANGE = "record"  # graphrt.trace.record.nsys_profile.CAPTURE_RANGE names it too

# A recording window for a mode; what it yields is the profiler session it opened, if any.
Window = Callable[[str], contextlib.AbstractContextManager[Session | None]]


@dataclass
class RecordedMode:
    """What one mode did; the recorded steps themselves are in the profiler's file."""

    mode: str
    warmup_steps: int  # decode steps run before the recording (prefill comes before them)
    recorded_steps: int
    # StepLaunches.ops of one step, as `graphrt run` counts them, after the recorded steps; None
    # on CUDA, where the trace has the counts: under Nsight Systems torch.profiler cannot count
    # (one CUPTI subscriber: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), and under
    # torch.profiler a count would need a second session (graphrt.measure.profiling)
    ops_per_step: int | None
    kernel_launches: int | None = None  # CUDA only: launch calls of that step
    graph_launches: int | None = None
    prepare_s: float = 0.0  # graph capture time
    # the recording process's torch.profiler session that recorded the steps (1: its first, the
    # only one whose graph kernels CUPTI 13.0 links to their launches); None under Nsight Systems
    profiler_session: int | None = None
    notes: list[str] = field(default_factory=list)
    # TapeGraph captures, by the name of the step that replays them (`replay[bs=1]`): per
    # entry, its op as torch.profiler names it and the ranges open when it was captured
    # (TapeGraph.op_ranges), so analyze can attribute the replay's ops exactly.
    captured_ops: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    # CUDA graph captures, by the same step names: per graph node, by its toolsId in decimal (the
    # `graph node id` a profiler gives its replayed kernel), the ranges open at its capture
    # (CudaGraph.node_ranges), where the machine records graph-node annotations.
    node_ranges: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def profiler_op_name(overload: str) -> str:
    """`aten.addmm.default` -> `aten::addmm`: an op as torch.profiler names it."""
    namespace, _, rest = overload.partition(".")
    return f"{namespace}::{rest.partition('.')[0]}"


def _captured_ops(backend: Backend) -> dict[str, list[tuple[str, list[str]]]]:
    if not isinstance(backend, GraphBackend):
        return {}
    return {f"replay[bs={bs}]": [(profiler_op_name(op), list(g.op_ranges[i])) for i, op in g.replay_op_names()]
            for bs, (g, _) in backend.graphs.items() if isinstance(g, TapeGraph)}


def _node_ranges(backend: Backend) -> tuple[dict[str, dict[str, list[str]]], list[str]]:
    """Each CUDA graph's node ranges by step name, and a note for each reason some are missing."""
    if not isinstance(backend, GraphBackend):
        return {}, []
    cuda = {bs: g for bs, (g, _) in backend.graphs.items() if isinstance(g, CudaGraph)}
    ranges = {f"replay[bs={bs}]": {str(node): list(stack) for node, stack in g.node_ranges.items()}
              for bs, g in cuda.items() if g.node_ranges}
    missing = dict.fromkeys(g.node_ranges_missing for g in cuda.values() if g.node_ranges_missing)
    if ranges and profiler_node_ids() == NO_NODE_IDS:
        missing[NO_NODE_IDS] = None
    return ranges, [f"{why}; replayed kernels can only be attributed by aligning them with an eager step"
                    for why in missing]


@contextlib.contextmanager
def nsys_window(device: torch.device) -> Iterator[None]:
    """What `nsys profile` records (see graphrt.trace.record.nsys_profile.profile_command).

    On CUDA the GPU is drained on both sides, so no warmup kernel runs inside the capture and
    every recorded step's kernels finish before cudaProfilerStop ends it.
    """
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.profiler.start()
    try:
        with nvtx.nvtx_range(RECORD_RANGE):
            yield
            if cuda:
                torch.cuda.synchronize(device)
    finally:
        if cuda:
            torch.cuda.profiler.stop()


@contextlib.contextmanager
def torch_window(device: torch.device, path: Path) -> Iterator[Session]:
    """torch.profiler (CPU, and CUDA on a CUDA device) around the block; its Chrome trace is
    written to `path` when the block ends."""
    with profiler_session(device) as session:
        # each graphrt range also a record_function of its name, so the trace holds the ranges
        with nvtx.mirror_ranges(lambda stack: torch.profiler.record_function(stack[-1])), \
                nvtx.nvtx_range(RECORD_RANGE):
            yield session
    session.profile.export_chrome_trace(str(path))


def _record_one(backend: Backend, prompt: torch.Tensor, spec: RunSpec,
                window: contextlib.AbstractContextManager, count: bool) -> RecordedMode:
    prepared = backend.prepare(spec.batch)
    # prefill and the warmup steps, outside the recording
    warm = decode(backend, prompt, steps=spec.warmup, warmup=spec.warmup, keep_logits=False)
    device = backend.model.lm_head.weight.device
    token = warm.tokens[:, -1:].to(device)  # [B, 1]
    positions = torch.full((spec.batch,), spec.prompt_len + spec.warmup, dtype=torch.long,
                           device=device)
    recorded = spec.steps - spec.warmup
    with torch.inference_mode(), window as session:
        for _ in range(recorded):
            token = greedy(backend.step(token, positions))
            positions += 1
    launches = count_launches([(backend, warm)], spec.prompt_len)[backend.name] if count else StepLaunches(ops=None)
    node_ranges, missing = _node_ranges(backend)
    return RecordedMode(backend.name, spec.warmup, recorded, launches.ops,
                        launches.kernel_launches, launches.graph_launches,
                        prepared.seconds, session and session.number, [*prepared.notes, *missing],
                        _captured_ops(backend), node_ranges)


def record_modes(spec: RunSpec, config: ModelConfig, model: Qwen2ForCausalLM,
                 window: Window, count: bool = True) -> list[RecordedMode]:
    """Each mode of `spec` on `model` (NVTX ranges on every module), its steps after the warmup
    recorded inside `window(mode)`, then (if `count`) one step's launches counted apart.
    GraphrtError up front if NVTX would record nothing."""
    if warning := nvtx.check_recording():
        raise GraphrtError(warning)
    # graph captures annotate their nodes where they can, so a replay can be attributed exactly
    backends = [make_backend(m, model, spec.buckets, spec.lint, annotate=True) for m in expand_modes(spec.mode)]
    model.setup_cache(max(b.cache_rows(spec.batch) for b in backends), spec.seq_len)
    prompt = random_prompt(spec.batch, spec.prompt_len, config.vocab_size, spec.seed)
    previous = nvtx.set_enabled(True)
    try:
        with nvtx.attach(model):
            return [_record_one(b, prompt, spec, window(b.name), count) for b in backends]
    finally:
        nvtx.set_enabled(previous)
