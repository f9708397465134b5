"""Read a torch.profiler Chrome trace (`prof.export_chrome_trace(path)`, JSON, maybe gzipped)
into a `Trace`.

Only complete events (`"ph": "X"`, a start `ts` and a `dur`, both in microseconds) carry what
graphrt uses; by category (`cat`):

- `user_annotation`: a `record_function` range on a CPU thread -> `Range`;
- `python_function` (a trace recorded with stack): a model runner's step function
  (`chrome_events.is_runner_function`), a step marker where an engine wrote no
  annotation -> `Range` in the `python` domain; a module's call (`nn.Module: Qwen2MLP_3`, with
  `with_modules`) -> `Trace.frames`; the other frames are not kept;
- `cpu_op`: an aten operator on a CPU thread -> `CpuOp` (on a CPU build of torch, the only
  record of the work a step did);
- `cuda_runtime` / `cuda_driver`: `cudaLaunchKernel`, `cudaGraphLaunch`, ... -> `ApiCall` (with
  `args.kernel`, the kernel's name, where ROCm's HIP calls give it);
- `kernel`: a kernel on the GPU -> `Kernel`, linked to its launching call by `args.correlation`;
  a replayed graph node's carries `args["graph node id"]` (0 for a kernel launched on its own),
  and with newer kinetos `args["graph id"]` beside it (`chrome_events.graph_node`).

`gpu_user_annotation` events are the same `record_function` ranges drawn again on the GPU's
timeline; they are not read, or every range would count twice.

The file is read as a stream (graphrt.trace.read.json_stream): a batch of events at a time is decoded
into `Event`s holding only these fields (graphrt.trace.read.chrome_events), whose figures go into
the trace's columns a batch at once (graphrt.trace.read.chrome_batch, a value of an unusual shape
by its rule alone); no event outlives its batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError, cut
from graphrt.trace.read.chrome_batch import Refused, add_batch
from graphrt.trace.read.chrome_events import Event, Into, UnusableField
from graphrt.trace.read.events import Progress, Trace, link_launches
from graphrt.trace.read.json_stream import EXPECTED_FIELDS, GZIP_MAGIC, LACKS_A_FIELD, stream_events

__all__ = ["GZIP_MAGIC", "read_chrome_trace"]


def read_chrome_trace(path: str | Path, progress: Progress | None = None) -> Trace:
    """Read a Chrome-trace JSON written by torch.profiler, plain or gzipped, as a stream.
    `progress(bytes of the file read, events so far)` is called as it goes. Raises GraphrtError
    if it is not one, naming the byte or the event where it breaks."""
    path = Path(path)
    trace = Trace(source=str(path), kind="chrome")
    names: dict[str, str] = {}  # each distinct name once
    kinds: dict[str | None, Into] = {}  # where each python function goes, by name
    found: dict[str, Any] = {}
    for first, batch in stream_events(path, Event, progress, found):
        try:
            add_batch(trace, batch, names, kinds)
        except Refused as refused:
            where, name = f"traceEvents[{first + refused.row}]", batch[refused.row].name
            if isinstance(refused.error, UnusableField):  # it says what it expected
                named = "" if name is None else f" `{cut(name, 60)}`"
                raise GraphrtError(f"{path}: {LACKS_A_FIELD} ({where}{named}: {refused.error})") from None
            raise GraphrtError(f"{path}: {LACKS_A_FIELD} ({where}: {refused.error!r}); {EXPECTED_FIELDS}") from None
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
