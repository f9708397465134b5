"""What each rank of a tensor-parallel run measured, brought together on every rank.

A tensor-parallel step is as slow as its slowest rank: every all-reduce waits for the last one
to arrive. So the step time reported is, step by step, the slowest rank's; the spread between
ranks and the share of the step spent in collectives say where that time went.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt.measure import collective_share as shares
from graphrt.measure.collective_share import NAMESPACE, Measure
from graphrt.measure.launches import is_kernel_event
from graphrt.measure.profiling import profiler_session
from graphrt.measure.stats import Stats


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures for one mode."""

    rank: int
    step_ms: tuple[float, ...]  # the timed steps, in order
    ops: int | None  # launches per step: kernels on CUDA, aten ops on the CPU
    collective_share: float | None  # of one profiled step, in collectives (0..1): graphrt.measure.collective_share
    tokens: tuple[tuple[int, ...], ...]  # what it generated [B][1 + steps]
    collective_share_of: Measure = "cpu"  # GPU time (NCCL kernels) or CPU time: collective_share.OF

    @property
    def stats(self) -> Stats:
        return Stats.of(list(self.step_ms))


def gather(mine: RankFigures) -> list[RankFigures]:
    """Every rank's figures, by rank (a collective: every rank calls it, outside any step)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def slowest_per_step(step_ms: list[float]) -> list[float]:
    """Step by step, the slowest rank's time (a collective: every rank calls it with its own)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, list(step_ms))
    return [max(steps) for steps in zip(*everyone)]


def slowest(ranks: list[RankFigures]) -> Stats:
    """Statistics of the slowest rank's time at each step."""
    return Stats.of([max(steps) for steps in zip(*(r.step_ms for r in ranks))])


def spread_ms(ranks: list[RankFigures]) -> float:
    """How far apart the ranks' median steps are: the slowest median minus the fastest."""
    medians = [r.stats.median for r in ranks]
    return max(medians) - min(medians)


class _CollectiveClock(TorchDispatchMode):
    """Runs every op unchanged and adds up the wall time of the functional collectives."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != NAMESPACE:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds += time.perf_counter() - start
        return out


def collective_share(fn: Callable[[], Any], device: torch.device, countable_on_cpu: bool = True) -> float | None:
    """The share of one call of `fn` spent in collectives, as graphrt.measure.collective_share defines it
    (GPU time in NCCL kernels on CUDA, CPU time on the CPU); None where it cannot be told.

    On CUDA, from the kernels torch.profiler records: their names and their GPU start and end
    (correlation ids play no part, so this holds in any profiler session of the process). On the
    CPU, the wall time in functional collectives (issuing them and waiting for them) under a
    dispatch mode: its small cost per op falls on the whole call only, so the share is, if
    anything, understated. Compiled code refuses the mode (`countable_on_cpu` False).
    """
    if device.type == "cuda":
        return _cuda_share(fn, device)
    if not countable_on_cpu:
        return None
    clock = _CollectiveClock()
    start = time.perf_counter()
    with clock:
        fn()
    return shares.share(clock.seconds, time.perf_counter() - start)


def _cuda_share(fn: Callable[[], Any], device: torch.device) -> float | None:
    torch.cuda.synchronize(device)  # no earlier kernel runs inside the session
    with profiler_session(device) as session:
        fn()
        torch.cuda.synchronize(device)
    # a FunctionEvent's time range is in µs, on one clock for CPU and GPU events
    spent = shares.kernel_time((e.name, round(e.time_range.start * 1e3), round(e.time_range.end * 1e3))
                               for e in session.profile.events() if is_kernel_event(e))
    return None if spent is None else shares.share(*spent)
