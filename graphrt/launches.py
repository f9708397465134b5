"""How much work one decode step launches: kernels on CUDA, aten ops on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.autograd import DeviceType

from graphrt.opcount import op_names

# Host-side calls that put work on the GPU; `cudaGraphLaunch` puts a whole graph there at once.
# ROCm's HIP names read the same way (a ROCm torch.profiler trace says hipGraphLaunch).
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
# Any other launch: cudaLaunchKernel(ExC), cudaLaunchCooperativeKernel, cudaLaunchHostFunc, the
# driver's cuLaunchKernel(Ex), HIP's hipLaunchKernel, hipModuleLaunchKernel,
# hipExtModuleLaunchKernel, ...
KERNEL_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "hipLaunch", "hipModuleLaunch", "hipExtModuleLaunch",
                          "hipExtLaunch")


def launch_kind(api_name: str) -> str | None:
    """"graph" for cudaGraphLaunch* (and HIP's), "kernel" for the other launch APIs, None for the
    rest.

    The one definition of a launch call, for `graphrt run`'s count and `graphrt analyze`'s."""
    if api_name.startswith(GRAPH_LAUNCH_APIS):
        return "graph"
    if api_name.startswith(KERNEL_LAUNCH_PREFIXES):
        return "kernel"
    return None


@dataclass(frozen=True)
class StepLaunches:
    ops: int | None  # CUDA: kernels that ran on the GPU; CPU: aten ops that did work (views
    # excluded), or None where ops cannot be counted (compiled code refuses a dispatch mode)
    kernel_launches: int | None = None  # CUDA: cudaLaunchKernel-like calls from the host
    graph_launches: int | None = None  # CUDA: cudaGraphLaunch calls from the host

    @property
    def host_launches(self) -> int | None:
        """Launch calls the CPU made for the step: what CUDA Graph replay removes."""
        if self.kernel_launches is None:
            return None
        return self.kernel_launches + self.graph_launches


def count_step(fn: Callable[[], Any], device: torch.device,
               countable_on_cpu: bool = True) -> tuple[Any, StepLaunches]:
    """Runs `fn()` once and counts what it launched; returns its result and the count."""
    if device.type == "cuda":  # pragma: no mutate block (CUDA only)
        return _count_cuda_step(fn)
    if not countable_on_cpu:
        return fn(), StepLaunches(ops=None)
    result = []
    names = op_names(lambda: result.append(fn()))
    return result[0], StepLaunches(ops=len(names))


def _count_cuda_step(fn: Callable[[], Any]) -> tuple[Any, StepLaunches]:  # pragma: no mutate block (CUDA only)
    """Kernels that ran on the GPU and the host's launch calls, from torch.profiler."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        result = fn()
        torch.cuda.synchronize()
    events = prof.events()
    # GPU-side events are kernels, copies, sets, and the GPU spans of user annotations
    # (record_function ranges, `## Call CompiledFxGraph ##` under torch.compile): only kernels count
    kernels = [e for e in events if e.device_type == DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)
               and not e.name.startswith(("Memcpy", "Memset"))]
    calls = [launch_kind(e.name) for e in events if e.device_type == DeviceType.CPU]
    return result, StepLaunches(ops=len(kernels), kernel_launches=calls.count("kernel"),
                                graph_launches=calls.count("graph"))
