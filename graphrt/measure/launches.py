"""How much work one decode step launches: kernels on CUDA, aten ops on the CPU."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import DeviceType

from graphrt.measure.launch_names import launch_kind
from graphrt.measure.nvtx import nvtx_range
from graphrt.measure.opcount import op_names
from graphrt.measure.profiling import profiler_session

# Host-side calls that put work on the GPU; `cudaGraphLaunch` puts a whole graph there at once.
# ROCm's HIP names read the same way (a ROCm torch.profiler trace says hipGraphLaunch).
# Copies and fills: the runtime's, the driver's (cuMemcpyHtoDAsync_v2, ...) and HIP's
COPY_API_PREFIXES = ("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset", "hipMemcpy", "hipMemset")
COUNT_RANGE = "count[{}]"  # the range each counted step runs in


def is_kernel_event(event: Any) -> bool:
    """A torch.profiler event (`profile.events()`) that is a kernel the GPU ran: not a copy or a
    fill, nor the GPU span of a user annotation (a record_function range, or
    `## Call CompiledFxGraph ##` under torch.compile)."""
    return (event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
            and not event.name.startswith(("Memcpy", "Memset")))


def is_copy_call(api_name: str) -> bool:
    """A host call that puts a copy or a fill on the GPU (cudaMemcpyAsync, cudaMemsetAsync, the
    driver's cuMemcpyHtoDAsync, HIP's hipMemcpyAsync, ...): work, but no kernel launch."""
    return api_name.startswith(COPY_API_PREFIXES)


@dataclass(frozen=True)
class StepLaunches:
    ops: int | None  # CUDA: kernels that ran on the GPU; CPU: aten ops that did work (views
    # excluded), or None where ops cannot be counted (compiled code refuses a dispatch mode)
    kernel_launches: int | None = None  # CUDA: cudaLaunchKernel-like calls from the host
    graph_launches: int | None = None  # CUDA: cudaGraphLaunch calls from the host
    # CUDA: cudaMemcpy*/cudaMemset* calls from the host (a graph step's copy-in among them):
    # work on the GPU that is neither a kernel launch nor a graph launch
    copies: int | None = None
    # the process's torch.profiler session that counted it (graphrt.measure.profiling), None where no
    # profiler did (the CPU counts dispatched ops)
    profiler_session: int | None = None

    @property
    def host_launches(self) -> int | None:
        """Launch calls the CPU made for the step: what CUDA Graph replay removes."""
        if self.kernel_launches is None:
            return None
        return self.kernel_launches + self.graph_launches


@dataclass(frozen=True)
class CountedStep:
    """One step to count: its name (the `count[NAME]` range it runs in) and how to run it once."""

    name: str
    run: Callable[[], Any]
    countable_on_cpu: bool = True  # False: compiled code, which refuses a dispatch mode


def count_steps(steps: Sequence[CountedStep], device: torch.device) -> dict[str, StepLaunches]:
    """Runs each step once, in order, each in an NVTX range `count[NAME]`; what each launched, by name.

    On CUDA every step runs inside ONE torch.profiler session, in a record_function range of the
    same name with the GPU drained on both sides, and the session's events are split by range.
    One session, because CUPTI 13.0 mis-links graph launches in every session after a process's
    first (graphrt.measure.profiling): however many modes use graphs, their replays are profiled in the
    same session, the process's first where nothing opened one before. Call it after all timing:
    the session leaves CUPTI attached, taxing every later launch.
    """
    if device.type == "cuda":
        return _count_cuda_steps(steps, device)
    counted = {}
    for step in steps:
        with nvtx_range(COUNT_RANGE.format(step.name)):
            counted[step.name] = (StepLaunches(ops=len(op_names(step.run))) if step.countable_on_cpu
                                  else _run_uncounted(step.run))
    return counted


def _run_uncounted(run: Callable[[], Any]) -> StepLaunches:
    run()
    return StepLaunches(ops=None)


def _count_cuda_steps(steps: Sequence[CountedStep], device: torch.device) -> dict[str, StepLaunches]:
    """Kernels that ran on the GPU and the host's launch and copy calls, per step, from one
    torch.profiler session.

    A step's host calls are the CPU events inside its range; its GPU events are those that start
    after its range opened and before the next one did: the GPU is idle when a range opens and
    drained before it closes, so no kernel of one step starts inside another's window. The split
    is by time, not by correlation id, so it holds even where the ids are wrong.
    """
    with profiler_session(device) as session:
        for step in steps:
            name = COUNT_RANGE.format(step.name)
            torch.cuda.synchronize()
            with nvtx_range(name), torch.profiler.record_function(name):
                step.run()
                torch.cuda.synchronize()
    events = session.profile.events()
    names = [COUNT_RANGE.format(step.name) for step in steps]
    ranges = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                    if e.device_type == DeviceType.CPU and e.name in names)
    starts = [start for start, _, _ in ranges]
    kernels: dict[str, int] = dict.fromkeys(names, 0)
    calls: dict[str, list[str]] = {name: [] for name in names}
    for e in events:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0:
            continue
        start, end, name = ranges[i]
        if is_kernel_event(e):
            kernels[name] += 1
        elif e.device_type == DeviceType.CPU and e.time_range.end <= end:
            calls[name].append(e.name)
    return {step.name: StepLaunches(
        ops=kernels[name], kernel_launches=sum(launch_kind(c) == "kernel" for c in calls[name]),
        graph_launches=sum(launch_kind(c) == "graph" for c in calls[name]),
        copies=sum(map(is_copy_call, calls[name])), profiler_session=session.number)
        for step, name in zip(steps, names)}
