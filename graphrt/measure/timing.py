"""Step timers and the statistics graphrt reports: median and spread, never a single sample."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch


def percentile(sorted_samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    if not sorted_samples:
        raise ValueError("no samples")
    k = (len(sorted_samples) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (k - lo)


@dataclass(frozen=True)
class Stats:
    """A distribution of step times, in milliseconds."""

    median: float
    p10: float
    p90: float
    mean: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> "Stats":
        s = sorted(samples)
        return cls(median=percentile(s, 50), p10=percentile(s, 10), p90=percentile(s, 90),
                   mean=sum(s) / len(s), n=len(s))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far apart the typical steps are."""
        return (self.p90 - self.p10) / self.median if self.median else 0.0


class StepTimer:
    """Times each `with timer.step():` block.

    On CUDA with events recorded on the current stream, read after one synchronize at the end:
    the GPU time between the start and the end of each step, with no sync inside the loop to
    hide launch overhead. On the CPU, where every op is synchronous, with `perf_counter`.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"  # pragma: no mutate (CUDA only)
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # pragma: no mutate (CUDA only)
        self._cpu_ms: list[float] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        if self.cuda:  # pragma: no mutate block (CUDA only: mutation runs on the CPU)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu_ms.append((time.perf_counter() - t0) * 1e3)

    def samples_ms(self) -> list[float]:
        if self.cuda:  # pragma: no mutate block (CUDA only)
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self._events]
        return list(self._cpu_ms)
