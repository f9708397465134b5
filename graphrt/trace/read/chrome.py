"""Read a torch.profiler Chrome trace (`prof.export_chrome_trace(path)`, JSON, maybe gzipped)
into a `Trace`.

Only complete events (`"ph": "X"`, a start `ts` and a `dur`, both in microseconds) carry what
graphrt uses; by category (`cat`):

- `user_annotation`: a `record_function` range on a CPU thread -> `Range`;
- `python_function` (a trace recorded with stack): a model runner's step function
  (graphrt.trace.analysis.markers.is_runner_function), a step marker where an engine wrote no
  annotation -> `Range` in the `python` domain; a module's call (`nn.Module: Qwen2MLP_3`, with
  `with_modules`) -> `Trace.frames`; the other frames are not kept;
- `cpu_op`: an aten operator on a CPU thread -> `CpuOp` (on a CPU build of torch, the only
  record of the work a step did);
- `cuda_runtime` / `cuda_driver`: `cudaLaunchKernel`, `cudaGraphLaunch`, ... -> `ApiCall` (with
  `args.kernel`, the kernel's name, where ROCm's HIP calls give it);
- `kernel`: a kernel on the GPU -> `Kernel`, linked to its launching call by `args.correlation`;
  a replayed graph node's carries `args["graph node id"]` (0 for a kernel launched on its own),
  and with newer kinetos `args["graph id"]` beside it (`_graph_node`).

`gpu_user_annotation` events are the same `record_function` ranges drawn again on the GPU's
timeline; they are not read, or every range would count twice.

The file is read as a stream (graphrt.trace.read.json_stream): a batch of events at a time is decoded
into `_Event`s holding only these fields, whose figures go into the trace's columns; no event
outlives its batch.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import msgspec

from graphrt.errors import GraphrtError
from graphrt.trace.analysis.markers import PYTHON_DOMAIN, is_runner_function
from graphrt.trace.read.events import Progress, Trace, link_launches
from graphrt.trace.read.json_stream import EXPECTED_FIELDS, GZIP_MAGIC, LACKS_A_FIELD, stream_events

__all__ = ["GZIP_MAGIC", "read_chrome_trace"]

RANGE_CATEGORIES = frozenset({"user_annotation"})
PYTHON_CATEGORIES = frozenset({"python_function"})
MODULE_FRAME = "nn.Module: "  # a module's call, as torch.profiler names it with_modules
OP_CATEGORIES = frozenset({"cpu_op"})
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
KERNEL_CATEGORIES = frozenset({"kernel"})

Number = int | float | str  # what a file may hold where a number belongs


class _Args(msgspec.Struct, gc=False):
    correlation: Number | None = None
    device: Number | None = None
    stream: Number | None = None
    graph_node: Number | None = msgspec.field(name="graph node id", default=None)
    graph: Number | None = msgspec.field(name="graph id", default=None)
    kernel: str | None = None


class _Event(msgspec.Struct, gc=False):
    """The fields of a Chrome-trace event graphrt reads; msgspec skips the others unread."""

    ph: str
    name: str | None = None
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: Number | None = None
    tid: Number | None = None
    args: _Args | None = None


def _ns(microseconds: Any) -> int:
    """Microseconds (an int or a float, as the file has them) to integer nanoseconds.

    Timestamps are microseconds since the epoch (~1.7e15): times 1000 they pass 2**53, where a
    float is exact only to 256 ns, so whole microseconds are scaled as integers and only the
    fraction goes through float arithmetic."""
    if isinstance(microseconds, int):
        return microseconds * 1000
    value = float(microseconds)
    whole = math.floor(value)
    return whole * 1000 + round((value - whole) * 1000)


def _id(value: Any) -> int:
    """Chrome traces allow a pid/tid to be a number or a label; labels get a stable number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return zlib.crc32(str(value).encode())


def _thread(value: Any) -> int:
    return value if type(value) is int else _id(value)


def _graph_node(args: _Args) -> int | None:
    """The graph node a replayed kernel came from, as its toolsId (exec graph id << 32 | node id),
    which the capture's node ranges are keyed by; None for a kernel launched on its own. Older
    kinetos write the whole toolsId as `graph node id`; newer ones its lower 32 bits, with the
    exec graph's id apart as `graph id`, so the two are put together again (a whole toolsId with
    its `graph id` beside it reads the same)."""
    node = int(args.graph_node or 0)
    if not node:
        return None
    graph = int(args.graph or 0)
    return (graph << 32) | (node & 0xFFFF_FFFF) if graph else node


_NO_ARGS = _Args()


def _add(trace: Trace, e: _Event, names: dict[str, str]) -> None:
    """One complete event into the trace's columns (kernels with no launch yet)."""
    cat, ts, dur = e.cat, e.ts, e.dur
    start = ts * 1000 if type(ts) is int else _ns(ts if ts is not None else _missing("ts"))
    end = start + (dur * 1000 if type(dur) is int else _ns(dur or 0))
    if cat in PYTHON_CATEGORIES:
        if e.name is None:
            return
        if e.name.startswith(MODULE_FRAME):
            trace.frames.append(names.setdefault(e.name, e.name), start, end, _thread(e.pid), _thread(e.tid),
                                PYTHON_DOMAIN)
        elif is_runner_function(e.name):
            trace.ranges.append(names.setdefault(e.name, e.name), start, end, _thread(e.pid), _thread(e.tid),
                                PYTHON_DOMAIN)
        return
    if cat in OP_CATEGORIES or cat in RANGE_CATEGORIES or cat in API_CATEGORIES or cat in KERNEL_CATEGORIES:
        name = names.setdefault(e.name, e.name) if e.name is not None else _missing("name")
    else:
        return
    pid, tid = _thread(e.pid), _thread(e.tid)
    args = e.args or _NO_ARGS
    if cat in OP_CATEGORIES:
        trace.cpu_ops.append(name, start, end, pid, tid)
    elif cat in RANGE_CATEGORIES:
        trace.ranges.append(name, start, end, pid, tid, "")
    elif cat in API_CATEGORIES:
        if args.correlation is not None:
            kernel = names.setdefault(args.kernel, args.kernel) if args.kernel else ""
            trace.api_calls.append(name, start, end, pid, tid, int(args.correlation), kernel)
    else:
        trace.kernels.append(name, start, end, int(args.device or 0),
                             None if args.stream is None else int(args.stream),
                             -1 if args.correlation is None else int(args.correlation), None, None,
                             _graph_node(args))


def _missing(field: str) -> str:
    raise KeyError(field)


def read_chrome_trace(path: str | Path, progress: Progress | None = None) -> Trace:
    """Read a Chrome-trace JSON written by torch.profiler, plain or gzipped, as a stream.
    `progress(bytes of the file read, events so far)` is called as it goes. Raises GraphrtError
    if it is not one, naming the byte or the event where it breaks."""
    path = Path(path)
    trace = Trace(source=str(path), kind="chrome")
    names: dict[str, str] = {}  # each distinct name once
    found: dict[str, Any] = {}
    for first, batch in stream_events(path, _Event, progress, found):
        for n, e in enumerate(batch):
            if e.ph != "X":
                continue
            try:
                _add(trace, e, names)
            except (KeyError, TypeError, ValueError) as error:
                raise GraphrtError(f"{path}: {LACKS_A_FIELD} (traceEvents[{first + n}]: {error!r}); "
                                   f"{EXPECTED_FIELDS}") from None
    document = found["document"]  # what the file holds besides its events
    if isinstance(document, dict):
        if document.get("schemaVersion") is not None:
            trace.meta["schema"] = str(document["schemaVersion"])
        distributed = document.get("distributedInfo")
        for field in ("rank", "world_size"):  # which rank of a distributed run wrote it
            if isinstance(distributed, dict) and isinstance(distributed.get(field), int):
                trace.meta[field] = str(distributed[field])
    for table in (trace.ranges, trace.cpu_ops, trace.api_calls, trace.kernels, trace.frames):
        table.sorted_by_start()
    calls = trace.api_calls
    trace.kernels.set_ints("launch", link_launches(
        calls.ints("correlation_id")[:, None], calls.ints("start_ns"),
        trace.kernels.ints("correlation_id")[:, None], trace.kernels.ints("start_ns")))
    return trace
