"""One in-memory shape for every trace graphrt reads, whatever wrote it.

Both readers (Nsight Systems SQLite exports and torch.profiler Chrome traces) produce a `Trace`;
the analysis only ever sees these classes. All times are integer nanoseconds on the trace's own
clock; CPU-side things (ranges, API calls, CPU ops) carry the process and thread they ran on.

A trace holds its items as columns (`Table`): a trace of millions of events takes tens of bytes
an event, not a Python object each. Reading a row (`trace.kernels[i]`) gives the item's
dataclass, made then.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
Progress = Callable[[int, int], None]  # a reader's (bytes of the file read, events read so far)


@dataclass(frozen=True, slots=True)
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


# ---------------------------------------------------------------------------------------------
# Columns: a trace of millions of events holds no Python object per event


ABSENT = -(1 << 63)  # an optional integer (Kernel.stream, .launch, ...) that is None


class Table(Sequence[T]):
    """Items of one kind as columns: one `array('q')` per integer field, one list of interned
    strings per text field (each distinct name held once, 8 bytes a row). A row read by index or
    iteration is made then (the dataclass `row`), so code written against lists of items reads
    a table unchanged; hot loops read the columns (`ints`, `strings`).

    A reader fills a table by `append`ing one row's fields at a time, then sorts it by start
    (`sorted_by_start`)."""

    row: type[T]
    int_fields: tuple[str, ...]
    str_fields: tuple[str, ...]
    optional: frozenset[str] = frozenset()  # int fields that may be None (stored as ABSENT)

    def __init__(self) -> None:
        self._ints = {f: array("q") for f in self.int_fields}
        self._strs: dict[str, list[str]] = {f: [] for f in self.str_fields}
        self._order = [getattr(self, "_ints" if f in self._ints else "_strs")[f]
                       for f in (fl.name for fl in fields(self.row))]
        self._absent = [fl.name in self.optional for fl in fields(self.row)]

    @classmethod
    def of(cls, rows: Iterable[T]) -> "Table[T]":
        table = cls()
        for row in rows:
            table.append(*(getattr(row, fl.name) for fl in fields(cls.row)))
        return table

    def append(self, *values: Any) -> None:
        """One row, its fields in the dataclass's order."""
        for column, value, optional in zip(self._order, values, self._absent):
            column.append(ABSENT if optional and value is None else value)

    def extend(self, **columns: Sequence[Any] | np.ndarray) -> None:
        """Many rows at once: every field's values, one sequence (or integer array) a field."""
        assert columns.keys() == set(self.int_fields) | set(self.str_fields), columns.keys()
        for name, values in columns.items():
            if name in self._strs:
                self._strs[name].extend(values)  # type: ignore[arg-type]
            elif isinstance(values, np.ndarray):
                self._ints[name].frombytes(values.astype(np.int64).tobytes())
            else:
                self._ints[name].extend(ABSENT if v is None else v for v in values)

    def ints(self, name: str) -> np.ndarray:
        """An integer column as int64, sharing the column's memory (read it, do not keep it
        across an `append`)."""
        return np.frombuffer(self._ints[name], dtype=np.int64)

    def set_ints(self, name: str, values: np.ndarray) -> None:
        """Fill an integer column, one value a row (ABSENT for None)."""
        column = self._ints[name]
        del column[:]
        column.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())

    def strings(self, name: str) -> list[str]:
        return self._strs[name]

    def __len__(self) -> int:
        return len(self._order[0])

    def __getitem__(self, i):  # type: ignore[override]: an int gives a row; a slice, rows
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.row(*(None if optional and column[i] == ABSENT else column[i]
                          for column, optional in zip(self._order, self._absent)))

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def sorted_by_start(self) -> np.ndarray:
        """Order the rows by start, rows that start together in the order they were added (as a
        stable sort of the rows would); returns the order (new row i was row order[i])."""
        order = np.argsort(self.ints("start_ns"), kind="stable")
        if np.all(order[1:] > order[:-1]):
            return order
        for name in self._ints:
            self.set_ints(name, self.ints(name)[order])
        for column in self._strs.values():
            column[:] = [column[i] for i in order.tolist()]
        return order


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

    Vectorised: each key is numbered densely, the calls sorted by (key number, index), and each
    kernel looks for the last call of its key among those that began by its start."""
    n = len(call_starts)
    if n == 0 or len(kernel_starts) == 0:
        return np.full(len(kernel_starts), ABSENT, dtype=np.int64)
    _, dense = np.unique(np.concatenate([call_keys, kernel_keys]), axis=0, return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)
    call_key, kernel_key = dense[:n], dense[n:]
    by_key = np.argsort(call_key, kind="stable")  # by key, then by index (start order)
    composite = call_key[by_key] * (n + 1) + by_key
    begun = np.searchsorted(call_starts, kernel_starts, side="right")  # calls that began by then
    j = np.searchsorted(composite, kernel_key * (n + 1) + begun, side="left") - 1
    found = (j >= 0) & (call_key[by_key[np.maximum(j, 0)]] == kernel_key)
    return np.where(found, by_key[np.maximum(j, 0)], ABSENT)
