"""One in-memory shape for every trace graphrt reads, whatever wrote it.

Both readers (Nsight Systems SQLite exports and torch.profiler Chrome traces) produce a `Trace`;
the analysis only ever sees these classes. All times are integer nanoseconds on the trace's own
clock; CPU-side things (ranges, API calls, CPU ops) carry the process and thread they ran on.

A trace holds its items as columns (graphrt.trace.read.columns.Table): a trace of millions of
events takes tens of bytes an event, not a Python object each. Reading a row (`trace.kernels[i]`)
gives the item's dataclass, made then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphrt.trace.read.columns import ABSENT, Table

Progress = Callable[[int, int], None]  # a reader's (bytes of the file read, events read so far)
PYTHON_DOMAIN = "python"  # the Range.domain of a python function kept as a step marker


@dataclass(frozen=True, slots=True)
class Range:
    """An annotated span of CPU time on one thread: an NVTX push/pop or start/end range, or a
    torch.profiler `record_function` annotation. `domain` is the NVTX domain ("" for the
    default domain and for profiler annotations; PYTHON_DOMAIN for a runner's step function)."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    domain: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One CUDA runtime API call on the CPU; `name` without its version suffix
    (`cudaLaunchKernel`, not `cudaLaunchKernel_v7000`). `kernel`: the kernel a launch call
    launches, where the trace names it (ROCm's runtime events do; CUDA's do not: "")."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    correlation_id: int
    kernel: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class CpuOp:
    """An operator the profiler saw on the CPU (torch.profiler's `cpu_op`: `aten::mm`, ...).
    Operators nest: `aten::linear` calls `aten::addmm`."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int


class Ranges(Table[Range]):
    row, int_fields, str_fields = Range, ("start_ns", "end_ns", "pid", "tid"), ("name", "domain")


class ApiCalls(Table[ApiCall]):
    row, int_fields, str_fields = ApiCall, ("start_ns", "end_ns", "pid", "tid", "correlation_id"), ("name", "kernel")


class Kernels(Table[Kernel]):
    row, str_fields = Kernel, ("name",)
    int_fields = ("start_ns", "end_ns", "device", "stream", "correlation_id", "launch", "graph_id", "graph_node_id")
    optional = frozenset({"stream", "launch", "graph_id", "graph_node_id"})


class CpuOps(Table[CpuOp]):
    row, int_fields, str_fields = CpuOp, ("start_ns", "end_ns", "pid", "tid"), ("name",)


_TABLES = {"ranges": Ranges, "kernels": Kernels, "api_calls": ApiCalls, "cpu_ops": CpuOps, "frames": Ranges}


@dataclass
class Trace:
    """Everything one trace file holds that graphrt uses; each table in start order (the
    readers sort them). Lists of items given here become tables.

    `kind` is "nsys" or "chrome"; `source` the file it was read from; `meta` what the file says
    about its maker (e.g. {"nsys_version": "2022.4.2.1", "schema": "3.0.0"}). `frames`: the
    module calls a torch.profiler trace recorded with stack and modules shows as python frames
    (`nn.Module: Qwen2MLP_3`), apart from `ranges`: they say which module launched what while a
    graph was captured (graphrt.trace.analysis.engine_capture).
    """

    source: str
    kind: str
    ranges: Ranges = field(default_factory=Ranges)
    kernels: Kernels = field(default_factory=Kernels)
    api_calls: ApiCalls = field(default_factory=ApiCalls)
    cpu_ops: CpuOps = field(default_factory=CpuOps)
    meta: dict[str, str] = field(default_factory=dict)
    frames: Ranges = field(default_factory=Ranges)

    def __post_init__(self) -> None:
        for name, table in _TABLES.items():
            if not isinstance(getattr(self, name), table):
                setattr(self, name, table.of(getattr(self, name)))

    @property
    def events(self) -> int:
        return len(self.ranges) + len(self.kernels) + len(self.api_calls) + len(self.cpu_ops)


def link_launches(call_keys: np.ndarray, call_starts: np.ndarray, kernel_keys: np.ndarray,
                  kernel_starts: np.ndarray) -> np.ndarray:
    """Per kernel, the index of the call that launched it (ABSENT where none), found by its
    correlation key. Calls are in start order; keys are rows of int64 (one column per part of
    the key: (correlation,) or (pid, correlation)), shapes (calls, parts) and (kernels, parts).

    A key can repeat (ids restart per process and per profiler session, and runtime and driver
    calls share them), so of the calls with that key the one is taken that began last before the
    kernel started: a kernel cannot start before the call that launched it began. ABSENT where
    every call with the key began after it (a cut trace can hold the other half of a collision).

    Vectorised, in a few arrays the size of the calls (a trace can hold millions): the calls are
    sorted by (key, index), each key numbered among the calls' keys, and each kernel looks for
    the last call of its key among those that began by its start."""
    n = len(call_starts)
    if n == 0 or len(kernel_starts) == 0:
        return np.full(len(kernel_starts), ABSENT, dtype=np.int64)
    if call_keys.shape[1] == 1:
        call_key, kernel_key = call_keys[:, 0], kernel_keys[:, 0]
    else:  # one number for each distinct key of several parts
        dense = _dense(np.concatenate([call_keys, kernel_keys]))
        call_key, kernel_key = dense[:n], dense[n:]
    by_key = np.argsort(call_key, kind="stable")  # by key, then by index (start order)
    composite = call_key[by_key]  # the keys in order, then in place: see below
    first = np.minimum(np.searchsorted(composite, kernel_key), n - 1)  # the kernel's key's first call
    known = composite[first] == kernel_key
    # (the key's number among the calls' keys, the call's index) as one int64, ascending
    new_key = composite[1:] != composite[:-1]
    composite[0] = 0
    np.cumsum(new_key, out=composite[1:])
    del new_key
    kernel_number = composite[first]
    composite *= n + 1
    composite += by_key
    begun = np.searchsorted(call_starts, kernel_starts, side="right")  # calls that began by then
    j = np.maximum(np.searchsorted(composite, kernel_number * (n + 1) + begun) - 1, 0)
    found = known & (composite[j] // (n + 1) == kernel_number) & (by_key[j] < begun)
    return np.where(found, by_key[j], ABSENT)


def _dense(keys: np.ndarray) -> np.ndarray:
    """Each row's number among the distinct rows of `keys`, in their sorted order (0, 1, ...)."""
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    dense = np.empty(len(keys), dtype=np.int64)
    dense[order] = np.cumsum(np.concatenate([[False], np.any(ordered[1:] != ordered[:-1], axis=1)]))
    return dense
