"""What graphrt's own NVTX ranges cost an eager decode step, with no profiler attached.

    overhead = measure_nvtx_overhead(model, batch=1, prompt_len=16, steps=120)
    overhead.describe()  # 'NVTX ranges on vs off: median eager step 31.20 ms vs 30.95 ms: +0.8% ...'

"On" is what `graphrt run` does by default (a range around every module call and every step);
"off" is `--no-nvtx` (no module ranges, step ranges switched off). The two are measured in one process on
one model, interleaved in blocks of a few steps (on/off, then off/on, ...) so that drift in the
machine's load falls on both alike, and compared by their medians.

Every step decodes at the same position: a step's cost depends on shapes, not on the values in
the cache (attention reads the whole static cache), so the cache need only hold the prompt and
one more token however many steps are timed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphrt.backends.eager import EagerBackend
from graphrt.measure import nvtx
from graphrt.measure.stats import Stats
from graphrt.model.decoder import Qwen2ForCausalLM, greedy
from graphrt.run.decode import random_prompt

BLOCK = 4  # steps per block; the side that goes first alternates from block pair to pair
MIN_STEPS = 2 * BLOCK


@dataclass(frozen=True)
class NvtxOverhead:
    on_ms: Stats  # eager step with NVTX ranges on every module and step
    off_ms: Stats  # the same step with graphrt's ranges switched off
    ranges: int  # ranges one step pushes when on: one per module call, one for the step

    @property
    def overhead(self) -> float:
        """Relative cost of the ranges: median on / median off - 1."""
        return self.on_ms.median / self.off_ms.median - 1

    @property
    def per_range_us(self) -> float:
        """The difference of the medians spread over the ranges of one step."""
        return (self.on_ms.median - self.off_ms.median) * 1e3 / self.ranges

    def describe(self) -> str:
        on, off = self.on_ms, self.off_ms
        return (f"NVTX ranges on vs off: median eager step {on.median:.3f} ms vs {off.median:.3f} ms: "
                f"{self.overhead:+.1%} ({self.per_range_us:+.2f} µs per range, {self.ranges} "
                f"ranges per step; {on.n} steps each, interleaved; spread p10-p90 "
                f"{on.spread:.0%} on, {off.spread:.0%} off)")

    def to_dict(self) -> dict[str, Any]:
        return {"on_ms": asdict(self.on_ms), "off_ms": asdict(self.off_ms), "ranges": self.ranges,
                "overhead": self.overhead, "per_range_us": self.per_range_us}


def _step_ms(step, device: torch.device) -> float:
    """Wall time of one step, the device drained on both sides (on CUDA the host's launch
    overhead is only part of a step; the step as a user waits for it is the honest figure)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def measure_nvtx_overhead(model: Qwen2ForCausalLM, batch: int, prompt_len: int, steps: int = 120,
                          seed: int = 0) -> NvtxOverhead:
    """Time `steps` eager decode steps with graphrt's NVTX ranges on and as many with them off.

    Sets up the model's KV cache for `batch` x `prompt_len + 1` (replacing any cache it had).
    Restores the NVTX switch as it was. ValueError if the model already carries graphrt's module ranges.
    """
    if steps < MIN_STEPS:
        raise ValueError(f"steps must be at least {MIN_STEPS}, got {steps}")
    device = model.lm_head.weight.device
    model.setup_cache(batch, prompt_len + 1)
    backend = EagerBackend(model)
    prompt = random_prompt(batch, prompt_len, model.config.vocab_size, seed).to(device)
    samples: dict[bool, list[float]] = {True: [], False: []}
    previous = nvtx.enabled()
    try:
        with torch.inference_mode():
            token = greedy(backend.prefill(prompt)[:, -1])  # [B, 1]
            positions = torch.full((batch,), prompt_len, dtype=torch.long, device=device)

            def step() -> None:
                backend.step(token, positions)

            nvtx.set_enabled(True)
            with nvtx.attach(model), nvtx.record_to([]) as events:
                step()
            ranges = sum(kind == "push" for kind, _ in events)
            # blocks of steps, on and off in turn; the first pair warms both up and is not kept
            for pair in range(-(-steps // BLOCK) + 1):
                for on in (True, False) if pair % 2 == 0 else (False, True):
                    nvtx.set_enabled(on)
                    with nvtx.attach(model):
                        times = [_step_ms(step, device) for _ in range(BLOCK)]
                    if pair:
                        samples[on] += times
    finally:
        nvtx.set_enabled(previous)
    return NvtxOverhead(on_ms=Stats.of(samples[True][:steps]), off_ms=Stats.of(samples[False][:steps]),
                        ranges=ranges)
