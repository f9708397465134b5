"""Step timers: CUDA events on a GPU, with no sync inside the loop; `perf_counter` on a CPU.
What is reported of their samples is graphrt.measure.stats's."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class StepTimer:
    """Times each `with timer.step():` block.

    On CUDA with events recorded on the current stream, read after one synchronize at the end:
    the GPU time between the start and the end of each step, with no sync inside the loop to
    hide launch overhead. On the CPU, where every op is synchronous, with `perf_counter`.

    `drained`: on CUDA, the device finishes what was queued before each step starts, so every
    step is timed from an idle GPU, its launch cost included whatever ran before it (behind
    queued work, a step's start event fires late and its host's launching hides in the queue).
    The sync is outside the timed window. A no-op on the CPU.
    """

    def __init__(self, device: torch.device, drained: bool = False):
        self.cuda = device.type == "cuda"
        self.drained = drained
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu_ms: list[float] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.drained:
                torch.cuda.synchronize()
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu_ms.append((time.perf_counter() - t0) * 1e3)

    def samples_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self._events]
        return list(self._cpu_ms)
