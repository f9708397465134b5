"""Read a torch.profiler Chrome trace (`prof.export_chrome_trace(path)`, JSON, maybe gzipped)
into a `Trace`.

Only complete events (`"ph": "X"`, a start `ts` and a `dur`, both in microseconds) carry what
graphrt uses; by category (`cat`):

- `user_annotation`: a `record_function` range on a CPU thread -> `Range`;
- `cpu_op`: an aten operator on a CPU thread -> `CpuOp` (on a CPU build of torch, the only
  record of the work a step did);
- `cuda_runtime` / `cuda_driver`: `cudaLaunchKernel`, `cudaGraphLaunch`, ... -> `ApiCall`;
- `kernel`: a kernel on the GPU -> `Kernel`, linked to its launching call by `args.correlation`;
  a replayed graph node's carries `args["graph node id"]` (0 for a kernel launched on its own),
  and with newer kinetos `args["graph id"]` beside it (`_graph_node`).

`gpu_user_annotation` events are the same `record_function` ranges drawn again on the GPU's
timeline; they are not read, or every range would count twice.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError
from graphrt.trace.model import ApiCall, CpuOp, Kernel, Range, Trace, calls_by_key, launch_index

GZIP_MAGIC = b"\x1f\x8b"

RANGE_CATEGORIES = frozenset({"user_annotation"})
OP_CATEGORIES = frozenset({"cpu_op"})
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
KERNEL_CATEGORIES = frozenset({"kernel"})


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


def _load_events(path: Path) -> tuple[list[dict], Any]:
    """(the event list, the file's `schemaVersion` or None); GraphrtError if not a Chrome trace."""
    try:
        raw = path.read_bytes()
        if raw.startswith(GZIP_MAGIC):
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON ({e})") from None
    # the format allows a bare list of events or an object holding them in traceEvents
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list) or any(not isinstance(e, dict) or "ph" not in e for e in events):
        raise GraphrtError(f"{path}: JSON but not a Chrome trace; expected a list of events "
                           "with a 'ph' field, or an object holding one in 'traceEvents'")
    return events, data.get("schemaVersion") if isinstance(data, dict) else None


def _graph_node(args: dict[str, Any]) -> int | None:
    """The graph node a replayed kernel came from, as its toolsId (exec graph id << 32 | node id),
    which the capture's node ranges are keyed by; None for a kernel launched on its own. Older
    kinetos write the whole toolsId as `graph node id`; newer ones its lower 32 bits, with the
    exec graph's id apart as `graph id`, so the two are put together again (a whole toolsId with
    its `graph id` beside it reads the same)."""
    node = int(args.get("graph node id") or 0)
    if not node:
        return None
    graph = int(args.get("graph id") or 0)
    return (graph << 32) | (node & 0xFFFF_FFFF) if graph else node


def read_chrome_trace(path: str | Path) -> Trace:
    """Read a Chrome-trace JSON written by torch.profiler. Raises GraphrtError if it is not one."""
    path = Path(path)
    events, schema = _load_events(path)
    trace = Trace(source=str(path), kind="chrome")
    if schema is not None:
        trace.meta["schema"] = str(schema)
    try:
        kernel_events = []
        for e in events:
            if e["ph"] != "X":
                continue
            cat = e.get("cat")
            start = _ns(e["ts"])
            end = start + _ns(e.get("dur", 0))
            args = e.get("args") or {}
            if cat in RANGE_CATEGORIES:
                trace.ranges.append(Range(e["name"], start, end, _id(e.get("pid")), _id(e.get("tid"))))
            elif cat in OP_CATEGORIES:
                trace.cpu_ops.append(CpuOp(e["name"], start, end, _id(e.get("pid")), _id(e.get("tid"))))
            elif cat in API_CATEGORIES and "correlation" in args:
                trace.api_calls.append(ApiCall(e["name"], start, end, _id(e.get("pid")),
                                               _id(e.get("tid")), int(args["correlation"])))
            elif cat in KERNEL_CATEGORIES:
                kernel_events.append((e["name"], start, end, args))

        for items in (trace.ranges, trace.cpu_ops, trace.api_calls):
            items.sort(key=lambda item: item.start_ns)
        by_correlation = calls_by_key(trace.api_calls, lambda c: c.correlation_id)
        for name, start, end, args in sorted(kernel_events, key=lambda k: k[1]):
            correlation = int(args.get("correlation", -1))
            trace.kernels.append(Kernel(
                name, start, end, device=int(args.get("device", 0)),
                stream=int(args["stream"]) if "stream" in args else None, correlation_id=correlation,
                launch=launch_index(trace.api_calls, by_correlation, correlation, start),
                graph_node_id=_graph_node(args)))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GraphrtError(f"{path}: a Chrome-trace event lacks a usable field ({e!r}); expected "
                           "name, ts and dur on every complete ('X') event") from None
    return trace
