"""Two facts the device check measures that no graphrt command reports, into one JSON file.

- What a replay launches besides its graph. `CUDAGraph.replay()` can launch kernels of its own
  before the `cudaGraphLaunch` (pytorch#143572: `fillFunctor` from the replay prologue): profile
  replays alone and count the kernels that a `cudaGraphLaunch` did not launch.
- What a finished torch.profiler session costs later steps. Kineto leaves CUPTI attached after a
  session (pytorch#144455), which taxes every launch after it: time eager and graph steps, run
  one profiler session, time them again.

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
from graphrt.engine import decode, random_prompt
from graphrt.io import write_json
from graphrt.launches import launch_kind
from graphrt.runner import RunSpec, load
from graphrt.trace.chrome import read_chrome_trace
from graphrt.trace.record import profiler_activities

REPLAYS = 10


def replay_extras(graph: GraphBackend, device: torch.device) -> dict:
    """Per replay of the batch-1 graph: launch calls by kind, and the kernels not in the graph."""
    captured, _ = graph.graphs[1]
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(activities=profiler_activities(device)) as prof:
            for _ in range(REPLAYS):
                captured.replay()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        path = Path(tmp) / "replays.json"
        prof.export_chrome_trace(str(path))
        trace = read_chrome_trace(path)
    calls = Counter(launch_kind(c.name) for c in trace.api_calls)
    outside = Counter(k.name for k in trace.kernels
                      if k.launch is None or launch_kind(trace.api_calls[k.launch].name) != "graph")
    return {
        "replays": REPLAYS,
        "graph_launches_per_replay": calls["graph"] / REPLAYS,
        "kernel_launches_per_replay": calls["kernel"] / REPLAYS,
        "kernels_per_replay": len(trace.kernels) / REPLAYS,
        "kernels_outside_the_graph_per_replay": sum(outside.values()) / REPLAYS,
        "kernels_outside_the_graph": {name: n / REPLAYS for name, n in outside.most_common()},
    }


def profiler_tax(backends: list, prompt: torch.Tensor, steps: int, device: torch.device) -> dict:
    """Median step of each backend before and after one torch.profiler session in between."""
    def medians() -> dict[str, float]:
        return {b.name: decode(b, prompt, steps, warmup=4, keep_logits=False).stats.median for b in backends}

    medians()  # a round to settle clocks, caches and the allocator, not kept
    before = medians()
    with torch.profiler.profile(activities=profiler_activities(device)), torch.inference_mode():
        decode(backends[0], prompt, 2, warmup=1, keep_logits=False)
    after = medians()
    return {name: {"before_ms": before[name], "after_ms": after[name],
                   "slowdown": after[name] / before[name] - 1} for name in before}


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
    facts = {"model": config.name, "device": str(device), "graph_kind": graph.kind,
             "replay": replay_extras(graph, device)}
    # last: the session it opens taxes everything after it
    facts["profiler_tax"] = profiler_tax([EagerBackend(model), graph], prompt, args.steps, device)
    write_json(args.out, facts)
    print(f"replay extras: {facts['replay']}")
    print(f"profiler tax: {facts['profiler_tax']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
