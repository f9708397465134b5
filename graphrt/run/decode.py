"""Greedy decoding through a backend: eager prefill, then timed decode steps."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from graphrt.backends.base import Backend, PrepareReport
from graphrt.measure.launches import CountedStep, StepLaunches, count_steps
from graphrt.measure.nvtx import nvtx_range
from graphrt.measure.stats import Stats
from graphrt.measure.timing import StepTimer
from graphrt.model.decoder import greedy

# Logits are kept for the equivalence check up to this many bytes per mode; they stay on the
# device until the last step, so keeping them adds no host sync to the timed loop.
LOGITS_BUDGET_BYTES = 256 << 20


@dataclass
class Generation:
    """One mode's decode of one prompt batch."""

    mode: str
    tokens: torch.Tensor  # [B, 1 + steps] on the CPU: prefill's token, then one per decode step
    step_ms: list[float]  # the timed steps, after warmup
    # CPU wall time spent issuing each timed step, with no sync: on CUDA what the host pays to
    # launch the step's work; on the CPU, where ops run as they are issued, the step itself
    host_ms: list[float] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # per step [B, V] fp32, CPU
    launches: StepLaunches | None = None  # counted after the timing, by count_launches
    prepare: PrepareReport = field(default_factory=PrepareReport)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.step_ms)


def random_prompt(batch: int, length: int, vocab_size: int, seed: int) -> torch.Tensor:
    """Token ids [batch, length], a different prompt per row, the same for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=gen)


def pad_rows(rows: list[list[int]] | tuple[tuple[int, ...], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of any lengths -> ids [B, max length], right-padded with id 0, and lengths [B].

    The pad never reaches a real token: prefill's causal mask keeps it after each row's own
    tokens, and decoding starts at the row's length, overwriting it before any query sees it.
    """
    lengths = torch.tensor([len(row) for row in rows])
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, lengths


def decode(backend: Backend, prompt: torch.Tensor, steps: int, warmup: int = 1,
           keep_logits: bool = True, start: int | None = None,
           lengths: torch.Tensor | None = None, drained: bool = False) -> Generation:
    """Prefill `prompt` [B, T] eagerly, then `steps` greedy decode steps through `backend`.

    The first `warmup` steps (at least one) run and generate tokens like the others but are
    not timed. Nothing here counts launches: a profiler session leaves CUPTI attached and taxes
    every later launch, so counting comes after the timing (`count_launches`).

    `start` is the position of the first decode step (default T). A later start leaves cache
    slots T..start-1 as they are, so each step attends over `start` or more cached tokens
    without paying for a prefill that long: a step's cost depends on shapes, not on values.

    `lengths` [B] are the rows' own prompt lengths when `prompt` is right-padded (`pad_rows`):
    each row continues from its last real token and decodes from its own position.

    `drained`: each timed step starts on an idle device (`StepTimer`), as a step whose tokens a
    server reads before the next does.
    """
    model = backend.model
    device = model.lm_head.weight.device
    prompt = prompt.to(device)
    batch, length = prompt.shape
    if start is not None and start < length:
        raise ValueError(f"start {start} is before the end of the prompt ({length} tokens)")
    if start is not None and lengths is not None:
        raise ValueError("start and lengths exclude each other: one sets every row's position")
    with torch.inference_mode():
        with nvtx_range("prefill"):
            logits = backend.prefill(prompt)  # [B, T, V]
        if lengths is None:
            positions = torch.full((batch,), length if start is None else start, dtype=torch.long,
                                   device=device)
            model.seek(length if start is None else start)
            token = greedy(logits[:, -1])
        else:
            positions = lengths.to(device=device, dtype=torch.long, copy=True)
            model.seek(int(lengths.max()))  # a cache with one write position: its rows are of one length
            token = greedy(logits[torch.arange(batch, device=device), positions - 1])
        generated, kept, host_ms = [token], [], []
        keep_steps = LOGITS_BUDGET_BYTES // (batch * model.config.vocab_size * 4) if keep_logits else 0
        timer = StepTimer(device, drained)
        for i in range(steps):
            if i < warmup:
                logits = backend.step(token, positions)
            else:
                with timer.step():
                    issued = time.perf_counter()
                    logits = backend.step(token, positions)
                    host_ms.append((time.perf_counter() - issued) * 1e3)
            if i < keep_steps:
                kept.append(logits.to(torch.float32, copy=True))  # a graph overwrites its output
            token = greedy(logits)
            positions += 1
            generated.append(token)
        step_ms = timer.samples_ms()  # synchronizes on CUDA
        tokens = torch.cat(generated, dim=1).cpu()
    return Generation(backend.name, tokens, step_ms, host_ms, [t.cpu() for t in kept])


def first_step_inputs(gen: Generation, position: int, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs of `gen`'s first decode step, again: prefill's token [B, 1] and `position` [B],
    for one more step run to count or profile it. Call it inside `torch.inference_mode()`: made
    there and contiguous, like the decode loop's, they pass Dynamo's guards on both, where
    anything else would compile a compiled step afresh and measure a warm-up."""
    tokens = gen.tokens[:, :1].to(device, memory_format=torch.contiguous_format, copy=True)
    positions = torch.full((tokens.shape[0],), position, dtype=torch.long, device=device)
    return tokens, positions


def count_launches(counted: Sequence[tuple[Backend, Generation]], position: int) -> dict[str, StepLaunches]:
    """What one decode step of each backend launches, by backend name, counted on one more step
    each, all in one profiler session on CUDA (graphrt.measure.launches.count_steps).

    Call it once the timing is over (the profiler it opens on CUDA stays attached). It re-runs
    each generation's first decode step (prefill's token at `position`, where that step ran): the
    cache slot it writes was written by the decode already, and a step's work depends on shapes only.
    The step's inputs come from `first_step_inputs`. One unprofiled step of each backend runs
    first, so whatever a step does once (a lazy init, a cudagraph tree's bookkeeping) stays out of
    the count.
    """
    steps = []
    with torch.inference_mode():
        for backend, gen in counted:
            device = backend.model.lm_head.weight.device
            tokens, positions = first_step_inputs(gen, position, device)
            backend.model.seek(position)  # each step below writes at most two slots on from it
            backend.step(tokens, positions)
            steps.append(CountedStep(backend.name, functools.partial(backend.step, tokens, positions),
                                     backend.countable_on_cpu))
        return count_steps(steps, device) if steps else {}
