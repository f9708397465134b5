"""What graphrt adds to transformers' own decode step (`--impl hf`): its eager step against
transformers' forward called alone, on the same model, cache and inputs.

    python scripts/bench_hf_step.py --model qwen2-0.5b                # a preset, random weights
    python scripts/bench_hf_step.py --tiny mistral --block 200        # a tiny seeded checkpoint made here

Three variants of one decode step at one position, timed in one process in interleaved blocks
(each round runs a block of every variant, in an order rotated round by round, so drift in the
machine falls on all of them alike):

- `transformers`: the transformers model's forward alone, `model(input_ids=..., position_ids=...,
  cache=..., use_cache=True, logits_to_keep=1)` on its StaticCache;
- `graphrt eager`: graphrt's EagerBackend step on the same model, NVTX off;
- `graphrt eager + NVTX`: the same with a range on every module and on the step, as a run attaches
  them (`graphrt.measure.nvtx.attach`).

Before each step every layer's cache counter is put back to the same position (untimed), so
every sample is the same step. Times: CUDA events with the device drained before each step, or
`perf_counter` on a CPU (one torch thread). Prints each variant's median, p10 and p90 over all
its samples, its median over transformers' and that ratio's range over the rounds, and whether
graphrt's eager step is within 5 % of transformers' forward, or that the rounds cannot tell.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from graphrt.backends.eager import EagerBackend
from graphrt.errors import GraphrtError
from graphrt.measure import nvtx
from graphrt.measure.stats import Stats
from graphrt.measure.timing import StepTimer
from graphrt.model.hf_causal import HFCausalLM
from graphrt.model.resolve import resolve
from graphrt.model.weights import load_model
from graphrt.run.machine import resolve_device, resolve_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoint import make_checkpoint  # noqa: E402

WITHIN = 0.05  # the claim: graphrt's eager step is within 5 % of transformers' forward alone
VARIANTS = ("transformers", "graphrt eager", "graphrt eager + NVTX")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


def _steps(model: HFCausalLM, tokens: torch.Tensor, positions: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Each variant's step: tokens [B, 1], positions [B] -> logits [B, V]."""
    backend = EagerBackend(model)

    def transformers_alone() -> torch.Tensor:
        out = model.hf(input_ids=tokens, position_ids=positions[:, None], cache=model.cache,
                       use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def graphrt_eager() -> torch.Tensor:
        return backend.step(tokens, positions)

    return {VARIANTS[0]: transformers_alone, VARIANTS[1]: graphrt_eager, VARIANTS[2]: graphrt_eager}


def _block(model: HFCausalLM, variant: str, step: Callable[[], torch.Tensor], position: int, n: int,
           device: torch.device) -> list[float]:
    """`n` samples (ms) of one variant's step, each at `position`; NVTX on for the NVTX variant only."""
    ranged = variant == VARIANTS[2]
    nvtx.set_enabled(ranged)
    handle = nvtx.attach(model) if ranged else None
    timer = StepTimer(device, drained=True)
    try:
        for _ in range(n):
            model.seek(position)
            with timer.step():
                step()
    finally:
        if handle is not None:
            handle.remove()
        nvtx.set_enabled(True)
    return timer.samples_ms()


def bench(model: HFCausalLM, batch: int, prompt_len: int, rounds: int, block: int, seed: int) -> dict[str, list[list[float]]]:
    """Samples per variant, per round (ms), after one untimed block of each."""
    device = model.device
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(model.config.vocab_size, (batch, prompt_len), generator=generator).to(device)
    with torch.inference_mode():
        model.prefill(prompt)
        tokens = prompt[:, -1:].contiguous()
        positions = torch.full((batch,), prompt_len, device=device)
        steps = _steps(model, tokens, positions)
        model.seek(prompt_len)
        first = steps[VARIANTS[0]]()
        model.seek(prompt_len)
        if not torch.equal(first, steps[VARIANTS[1]]()):
            raise GraphrtError("graphrt's eager step and transformers' forward gave different logits: "
                               "they are not the same step, and their times do not compare")
        for variant, step in steps.items():  # warmup
            _block(model, variant, step, prompt_len, block, device)
        samples: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for variant in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                samples[variant].append(_block(model, variant, steps[variant], prompt_len, block, device))
    return samples


def report(samples: dict[str, list[list[float]]]) -> list[str]:
    """One line per variant and the verdict on graphrt's eager step (module docstring)."""
    base = Stats.of([s for block in samples[VARIANTS[0]] for s in block])
    lines = []
    for variant, blocks in samples.items():
        stats = Stats.of([s for block in blocks for s in block])
        per_round = [Stats.of(b).median / Stats.of(t).median for b, t in zip(blocks, samples[VARIANTS[0]])]
        lines.append(f"{variant:>21}: median {stats.median:.3f} ms (p10 {stats.p10:.3f}, p90 {stats.p90:.3f}), "
                     f"{stats.median / base.median:.3f}x transformers' (rounds {min(per_round):.3f}-{max(per_round):.3f})")
    for variant in VARIANTS[1:]:
        ratios = [Stats.of(b).median / Stats.of(t).median for b, t in zip(samples[variant], samples[VARIANTS[0]])]
        if max(ratios) <= 1 + WITHIN:
            verdict = "within 5 % in every round"
        elif min(ratios) > 1 + WITHIN:
            verdict = "MORE than 5 % slower in every round"
        else:
            verdict = "cannot tell: some rounds within 5 %, some not"
        lines.append(f"{variant} vs transformers' forward: {verdict}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a preset or a checkpoint directory, run on transformers' forward")
    source.add_argument("--tiny", metavar="MODEL_TYPE", help="a tiny seeded checkpoint of this transformers "
                        "model type, made in a temporary directory (scripts/hf_checkpoint.py)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch", type=_positive, default=1)
    parser.add_argument("--prompt-len", type=_positive, default=16)
    parser.add_argument("--rounds", type=_positive, default=5)
    parser.add_argument("--block", type=_positive, default=20, help="steps per variant per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            name = args.model or str(make_checkpoint(args.tiny, Path(scratch) / args.tiny, args.seed))
            config, checkpoint = resolve(name, "hf")
            device = resolve_device(args.device)
            dtype = resolve_dtype("auto", device)
            model = load_model(config, device, dtype, checkpoint, args.seed)
            model.setup_cache(args.batch, args.prompt_len + 1)
            samples = bench(model, args.batch, args.prompt_len, args.rounds, args.block, args.seed)
    except (GraphrtError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.model or 'tiny ' + args.tiny} · transformers' {model.architecture} · {device.type} · {str(dtype).removeprefix('torch.')} · "
          f"batch {args.batch} · position {args.prompt_len} · {args.rounds} rounds of {args.block} steps per variant")
    print("\n".join(report(samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
