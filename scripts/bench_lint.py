"""What the graph backend's lint of the decode step costs, against one eager step.

    python scripts/bench_lint.py                      # qwen2-0.5b, batch 1, cache 48, CPU
    python scripts/bench_lint.py --model tiny --repeats 20

Wall time and the process's CPU time, median over the repeats (one torch thread, so CPU time
is what an otherwise idle core would take). The first lint of a process is not counted: the
first dispatch mode entered imports torch's compiler stack (about 1.6 s, once per process,
which the graph backend's own tape capture would pay anyway).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from graphrt.backends.graph import lint_decode
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cache", type=int, default=48, help="KV-cache positions")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model(PRESETS[args.model], torch.device("cpu"), torch.float32, seed=0)
    model.setup_cache(args.batch, args.cache)
    tokens = torch.zeros(args.batch, 1, dtype=torch.long)
    positions = torch.full((args.batch,), args.cache // 2)
    with torch.inference_mode():
        ops = lint_decode(model, args.batch).ops
        steps = [timed(lambda: model.decode_step(tokens, positions)) for _ in range(args.repeats)]
        lints = [timed(lambda: lint_decode(model, args.batch)) for _ in range(args.repeats)]
    for name, runs in (("eager step", steps), ("lint", lints)):
        wall, cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
        print(f"{name:>10}: wall {wall:.3f} s (min {min(r[0] for r in runs):.3f}, max "
              f"{max(r[0] for r in runs):.3f}), cpu {cpu:.3f} s  [median of {args.repeats}]")
    print(f"{args.model} batch {args.batch}: {ops} ops per capture, 2 captures")


if __name__ == "__main__":
    main()
