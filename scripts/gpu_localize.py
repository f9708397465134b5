"""The localizer on one planted bug, as the device check runs it: a weight rebound after capture.

A middle layer's `mlp.down_proj.weight` is rebound to a new tensor before decode step 1 (a weight
reload that assigns instead of copying): eager reads the new weight, the captured graph keeps
reading the old one. `graphrt.testing.localize` must name that Linear at step 1; the same step
without the bug must localize to no difference (no false report under the graph's tolerance).
Prints one line of what the localizer said and writes both verdicts to a JSON file; exits 1
when either is wrong.

usage: python scripts/gpu_localize.py --model qwen2-0.5b --device cuda --dtype bfloat16 --out localize.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

from graphrt.io import write_json
from graphrt.run.execute import load
from graphrt.run.spec import RunSpec
from graphrt.testing import localize

STEPS, BATCH, START = 3, 2, 8  # decode steps compared, rows, the first step's position


def decode_states(model: nn.Module, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs of STEPS decode steps: tokens [B, 1], positions [B], from position START."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    return [(torch.randint(0, vocab, (BATCH, 1), generator=gen).to(device),
             torch.full((BATCH,), START + i, device=device)) for i in range(STEPS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    _, model, device, dtype = load(RunSpec(model=args.model, device=args.device, dtype=args.dtype,
                                           batch=BATCH, prompt_len=START, steps=STEPS))
    model.setup_cache(BATCH, START + STEPS)
    layer = len(model.model.layers) // 2
    proj = model.model.layers[layer].mlp.down_proj
    planted = f"model.layers.{layer}.mlp.down_proj (Linear)"
    weights = [proj.weight, nn.Parameter(proj.weight.detach() * 1.5, requires_grad=False)]

    def rebind(step: int) -> None:
        proj.weight = weights[min(step, 1)]

    states = decode_states(model, device)
    start = time.perf_counter()
    with torch.inference_mode():
        clean = localize(model.decode_step, states)
        bug = localize(model.decode_step, states, before_step=rebind)
    seconds = time.perf_counter() - start
    named = bug.difference is not None and (bug.difference.module, bug.difference.step) == (planted, 1)
    write_json(args.out, {
        "model": args.model, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "steps": STEPS, "batch": BATCH, "planted": {"bug": "weight rebound before step 1", "module": planted},
        "clean": clean.as_dict(), "rebound": bug.as_dict(), "named_the_planted_module": named,
        "clean_found_nothing": clean.verdict == "none", "seconds": seconds})
    verdict = "ok" if named and clean.verdict == "none" else "WRONG"
    print(f"gpu_localize ({verdict}, {seconds:.1f} s): planted {planted} rebound before step 1; "
          f"{bug.describe()} | clean: {clean.describe()}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
