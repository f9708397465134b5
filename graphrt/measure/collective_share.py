"""The share of a tensor-parallel step spent in collectives: one definition, for `graphrt run
--tp` (one profiled step per rank and mode) and `graphrt analyze` (each recorded step of a rank).

On CUDA a collective is its NCCL kernel, and the share is GPU time: the union of the step's NCCL
kernels' intervals over the step's GPU time, from its first kernel's start to its last kernel's
end. It is the same whether the step ran eagerly or as a replayed graph, as a replay runs the
very kernels the capture recorded; the CPU time around a replay (one `cudaGraphLaunch`) says
nothing of them. An NCCL kernel runs until every rank has arrived, so time a rank waits for a
slower one counts as the collective's.

On the CPU (gloo: no kernels) a collective runs as it is issued, and the share is CPU time:
the time spent issuing and waiting for collectives over the step's CPU time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

from graphrt.measure.intervals import busy_of

# NCCL's kernels: `ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)` (NCCL 2.x before 2.19),
# `ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)` (2.19 on),
# `ncclDevKernel_Generic`; a demangled signature may start with its return type.
_NCCL_KERNEL = re.compile(r"(?:void )?nccl(?:Dev)?Kernel_")

# the namespace of the functional collectives a step issues (all_reduce, wait_tensor, ...)
NAMESPACE = "_c10d_functional"

Measure = Literal["gpu", "cpu"]
# what a share is of, said in text and JSON alike
OF: dict[Measure, str] = {
    "gpu": "GPU time in NCCL kernels over the step's GPU time (first kernel start to last kernel end)",
    "cpu": "CPU time in collectives over the step's CPU time",
}


def measure_on(device_type: str) -> Measure:
    """What a share on a device of this type is of."""
    return "gpu" if device_type == "cuda" else "cpu"


def is_collective_kernel(name: str) -> bool:
    """A GPU kernel that is a collective: one of NCCL's."""
    return _NCCL_KERNEL.match(name) is not None


def kernel_time(kernels: Iterable[tuple[str, int, int]]) -> tuple[int, int] | None:
    """(GPU time in NCCL kernels, the step's GPU time) of one step's kernels, each
    (name, start, end) on one clock; None for a step without kernels (nothing to tell)."""
    kernels = list(kernels)
    if not kernels:
        return None
    names, starts, ends = zip(*kernels)
    return kernel_time_of(names, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))


def kernel_time_of(names: Sequence[str], starts: np.ndarray, ends: np.ndarray) -> tuple[int, int] | None:
    """`kernel_time` of the kernels (names[i], starts[i], ends[i])."""
    if not len(names):
        return None
    collective = np.fromiter(map(is_collective_kernel, names), dtype=bool, count=len(names))
    return busy_of(starts[collective], ends[collective]), int(ends.max() - starts.min())


def share(collective_ns: float, step_ns: float) -> float | None:
    """The share of a step in collectives (0..1); None for a step of no time."""
    return collective_ns / step_ns if step_ns > 0 else None
