"""One in-memory shape for every trace graphrt reads, whatever wrote it.

Both readers (Nsight Systems SQLite exports and torch.profiler Chrome traces) produce a `Trace`;
the analysis only ever sees these classes. All times are integer nanoseconds on the trace's own
clock; CPU-side things (ranges, API calls, CPU ops) carry the process and thread they ran on.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Hashable


@dataclass(frozen=True)
class Range:
    """An annotated span of CPU time on one thread: an NVTX push/pop or start/end range, or a
    torch.profiler `record_function` annotation. `domain` is the NVTX domain ("" for the
    default domain and for profiler annotations)."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    domain: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class ApiCall:
    """One CUDA runtime API call on the CPU; `name` without its version suffix
    (`cudaLaunchKernel`, not `cudaLaunchKernel_v7000`)."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    correlation_id: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Kernel:
    """One kernel execution on a GPU.

    `launch` is the index in `Trace.api_calls` of the runtime call that launched it (a
    `cudaLaunchKernel*` or, for a replayed graph node, the `cudaGraphLaunch`), or None when the
    trace holds no such call. Each reader fills it by its own format's correlation rule.
    `graph_node_id` is the graph node it was replayed from, as CUPTI numbers it (the node's
    toolsId: exec graph id << 32 | node id), None for a kernel launched on its own.
    """

    name: str
    start_ns: int
    end_ns: int
    device: int
    stream: int | None
    correlation_id: int
    launch: int | None = None
    graph_id: int | None = None
    graph_node_id: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class CpuOp:
    """An operator the profiler saw on the CPU (torch.profiler's `cpu_op`: `aten::mm`, ...).
    Operators nest: `aten::linear` calls `aten::addmm`."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int


@dataclass
class Trace:
    """Everything one trace file holds that graphrt uses; each list in start order (the
    readers sort them).

    `kind` is "nsys" or "chrome"; `source` the file it was read from; `meta` what the file says
    about its maker (e.g. {"nsys_version": "2022.4.2.1", "schema": "3.0.0"}).
    """

    source: str
    kind: str
    ranges: list[Range] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    api_calls: list[ApiCall] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


def calls_by_key(api_calls: Sequence[ApiCall], key: Callable[[ApiCall], Hashable]) -> dict[Hashable, list[int]]:
    """The indices of `api_calls` (ordered by start) under each correlation key, in order."""
    by_key: dict[Hashable, list[int]] = defaultdict(list)
    for i, call in enumerate(api_calls):
        by_key[key(call)].append(i)
    return by_key


def launch_index(api_calls: Sequence[ApiCall], by_key: Mapping[Hashable, Sequence[int]], key: Hashable,
                 kernel_start_ns: int) -> int | None:
    """The index of the call that launched a kernel, found by its correlation `key` (`calls_by_key`).

    A key can repeat (ids restart per process and per profiler session, and runtime and driver
    calls share them), so of the calls with that key the one is taken that began last before the
    kernel started: a kernel cannot start before the call that launched it began. None where
    every call with the key began after it (a cut trace can hold the other half of a collision).
    """
    candidates = by_key.get(key, ())
    j = bisect.bisect_right(candidates, kernel_start_ns, key=lambda i: api_calls[i].start_ns) - 1
    return candidates[j] if j >= 0 else None
