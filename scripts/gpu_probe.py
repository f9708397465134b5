"""Three facts the device check measures that no graphrt command reports, into one JSON file.

- What a replay launches besides its graph. `CUDAGraph.replay()` can launch kernels of its own
  before the `cudaGraphLaunch` (pytorch#143572: `fillFunctor` from the replay prologue): profile
  replays alone and count the kernels that a `cudaGraphLaunch` did not launch.
- Whether CUPTI links replayed kernels to their launch in a process's second profiler session.
  CUPTI 13.0 gives `cudaGraphLaunch` and its kernels wrong correlation ids in every session after
  the first (fixed in CUDA 13.1 Update 1; kineto #1165): profile 10 replays in session 1 and 10 in
  session 2, and compare kernels per replay and the share of kernels linked to a launch.
- What a finished torch.profiler session costs later steps. Kineto leaves CUPTI attached after a
  session (pytorch#144455), which taxes every launch after it: time eager and graph steps before
  any session opens, then after both.

The order is the point: timing "before", session 1, session 2, timing "after". Each measurement
records how many sessions the process had opened when it was taken, so the JSON shows it.

usage: python scripts/gpu_probe.py --model qwen2-0.5b --device cuda --steps 100 --out probe.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.io import write_json
from graphrt.measure.launches import launch_kind
from graphrt.measure.profiling import profiler_session, sessions_opened
from graphrt.run.decode import decode, random_prompt
from graphrt.run.execute import load
from graphrt.run.spec import RunSpec
from graphrt.trace.read.chrome import read_chrome_trace

REPLAYS = 10


def profiled_replays(graph: GraphBackend, device: torch.device) -> dict:
    """Per replay of the batch-1 graph, in one new profiler session: launch calls by kind, the
    kernels, the share of them linked to a launch call, and the kernels not in the graph."""
    captured, _ = graph.graphs[1]
    with tempfile.TemporaryDirectory() as tmp:
        with profiler_session(device) as session:
            for _ in range(REPLAYS):
                captured.replay()
            if device.type == "cuda":  # pragma: no mutate (CUDA only)
                torch.cuda.synchronize(device)
        path = Path(tmp) / "replays.json"
        session.profile.export_chrome_trace(str(path))
        trace = read_chrome_trace(path)
    calls = Counter(launch_kind(c.name) for c in trace.api_calls)
    outside = Counter(k.name for k in trace.kernels
                      if k.launch is None or launch_kind(trace.api_calls[k.launch].name) != "graph")
    linked = sum(k.launch is not None for k in trace.kernels)
    return {
        "profiler_session": session.number,
        "replays": REPLAYS,
        "graph_launches_per_replay": calls["graph"] / REPLAYS,
        "kernel_launches_per_replay": calls["kernel"] / REPLAYS,
        "kernels_per_replay": len(trace.kernels) / REPLAYS,
        "linked_share": linked / len(trace.kernels) if trace.kernels else None,
        "kernels_outside_the_graph_per_replay": sum(outside.values()) / REPLAYS,
        "kernels_outside_the_graph": {name: n / REPLAYS for name, n in outside.most_common()},
    }


def step_medians(backends: list, prompt: torch.Tensor, steps: int) -> dict:
    """Median step of each backend, and how many profiler sessions the process had opened."""
    return {"sessions_opened": sessions_opened(),
            "median_ms": {b.name: decode(b, prompt, steps, warmup=4, keep_logits=False).stats.median
                          for b in backends}}


def profiler_tax(before: dict, after: dict) -> dict:
    """Each backend's median step before any profiler session and after them."""
    return {name: {"before_ms": ms, "after_ms": after["median_ms"][name],
                   "slowdown": after["median_ms"][name] / ms - 1}
            for name, ms in before["median_ms"].items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-0.5b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    spec = RunSpec(model=args.model, device=args.device, dtype=args.dtype, steps=args.steps)
    config, model, device, _ = load(spec)
    graph = GraphBackend(model, lint=False)  # the lint is checked by the CUDA tests and the runs
    model.setup_cache(graph.cache_rows(1), spec.prompt_len + args.steps)
    graph.prepare(1)
    prompt = random_prompt(1, spec.prompt_len, config.vocab_size, spec.seed)
    backends = [EagerBackend(model), graph]
    step_medians(backends, prompt, args.steps)  # a round to settle clocks, caches and the allocator
    before = step_medians(backends, prompt, args.steps)  # before any session: nothing attached yet
    first, second = profiled_replays(graph, device), profiled_replays(graph, device)
    after = step_medians(backends, prompt, args.steps)
    facts = {"model": config.name, "device": str(device), "graph_kind": graph.kind,
             "replay": first, "second_session": second,
             "timing": {"before": before, "after": after},
             "profiler_tax": profiler_tax(before, after)}
    write_json(args.out, facts)
    print(f"replays in session 1: {first}")
    print(f"replays in session 2: {second}")
    print(f"profiler tax: {facts['profiler_tax']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
