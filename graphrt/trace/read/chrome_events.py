"""What graphrt reads of one torch.profiler Chrome-trace event, and the rules that make it a row
of a trace's tables (graphrt.trace.read.chrome says which category becomes which).

`Event` names the fields graphrt reads; msgspec skips the others unread. The rules here are each
for one value (`span`, `whole`, `thread`, `graph_node`): graphrt.trace.read.chrome_batch puts a
batch's events into a trace's columns with numpy, and takes a value of an unusual shape through
its rule alone, which reads it or refuses it saying what was expected.
"""

from __future__ import annotations

import math
import zlib
from enum import IntEnum, unique
from typing import Any

import msgspec

from graphrt.engines.registry import ENGINES
from graphrt.trace.read.columns import ABSENT

MODULE_FRAME = "nn.Module: "  # a module's call, as torch.profiler names it with_modules


@unique
class Into(IntEnum):
    """Where a complete event goes, one number per table (a column of these is a numpy int8)."""

    NONE = 0  # no table: a category graphrt does not read, or a python function it does not keep
    RANGE = 1  # Trace.ranges: a record_function's range, or a model runner's step function
    PYTHON = 2  # a python function: which table (FRAME, RANGE or NONE) its name says (python_kind)
    OP = 3  # Trace.cpu_ops
    API = 4  # Trace.api_calls
    KERNEL = 5  # Trace.kernels
    FRAME = 6  # Trace.frames: a module's call


# the table each category of complete event goes into
TABLE_OF = {"user_annotation": Into.RANGE, "python_function": Into.PYTHON, "cpu_op": Into.OP,
            "cuda_runtime": Into.API, "cuda_driver": Into.API, "kernel": Into.KERNEL}
_RUNNER_FUNCTIONS = tuple(engine.runner_function for engine in ENGINES if engine.runner_function is not None)

Number = int | float | str  # what a file may hold where a number belongs


class Args(msgspec.Struct, gc=False):
    correlation: Number | None = None
    device: Number | None = None
    stream: Number | None = None
    graph_node: Number | None = msgspec.field(name="graph node id", default=None)
    graph: Number | None = msgspec.field(name="graph id", default=None)
    kernel: str | None = None


class Event(msgspec.Struct, gc=False):
    """The fields of a Chrome-trace event graphrt reads."""

    ph: str
    name: str | None = None
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: Number | None = None
    tid: Number | None = None
    args: Args | None = None


NO_ARGS = Args()


def ns(microseconds: Any) -> int:
    """Microseconds (an int or a float, as the file has them) to integer nanoseconds.

    Timestamps are microseconds since the epoch (~1.7e15): times 1000 they pass 2**53, where a
    float is exact only to 256 ns, so whole microseconds are scaled as integers and only the
    fraction goes through float arithmetic."""
    if isinstance(microseconds, int):
        return microseconds * 1000
    value = float(microseconds)
    whole = math.floor(value)
    return whole * 1000 + round((value - whole) * 1000)


INT64 = 2**63  # every figure is a column of int64: a number from here up (or down) fits none


class UnusableField(ValueError):
    """A field an event has, with a value graphrt cannot use; the message says what was expected."""


def whole(value: Any, field: str, expected: str) -> int:
    """A field that holds a whole number (an int, an integral float, or one spelt as a string),
    as an int that fits int64; UnusableField naming the field, its value and `expected` where it
    is none (a fraction would be cut to some other id, a number past 64 bits fits no column)."""
    try:
        n = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError, OverflowError):
        n = None
    if n is None or not -INT64 <= n < INT64:
        raise UnusableField(f"{field} {shown(value)} is not a whole number that fits 64 bits: expected {expected}")
    return n


def stated(n: int, field: str, what: str) -> int:
    """`n`, read for a column that may hold the field unstated; refused where it is -2**63, the
    column's mark of a value not stated (columns.ABSENT), as it would be read as none."""
    if n == ABSENT:
        raise UnusableField(f"{field} {n} is no {what}: expected one above -2**63")
    return n


def shown(value: Any) -> str:
    """A field's value for a line of text: cut where long (an int of thousands of digits is
    not even made a string: Python refuses past 4,300)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}(a {value.bit_length():,}-bit number)"
    text = repr(value)
    return text if len(text) <= 24 else text[:23] + "…"


def thread(value: Any, field: str = "tid") -> int:
    """A pid or tid as an integer: the file's number, or for a label (Chrome traces allow one) a
    stable number made from it; UnusableField for a number that is not a whole one within 64 bits."""
    if type(value) is int and -INT64 <= value < INT64:
        return value
    if isinstance(value, str):
        try:
            n = int(value)
        except ValueError:
            return zlib.crc32(value.encode())
        return whole(n, field, "a process or thread id, or a label")
    return whole(value, field, "a process or thread id, or a label")


GRAPH_ID_BOUND = 2**31  # a toolsId holds the exec graph's id above the node's 32 bits, in 64


def graph_node(args: Args) -> int | None:
    """The graph node a replayed kernel came from, as its toolsId (exec graph id << 32 | node id),
    which the capture's node ranges are keyed by; None for a kernel launched on its own. Older
    kinetos write the whole toolsId as `graph node id`; newer ones its lower 32 bits, with the
    exec graph's id apart as `graph id`, so the two are put together again (a whole toolsId with
    its `graph id` beside it reads the same)."""
    node = whole(args.graph_node or 0, "args.graph node id", "a graph node's id")
    if not node:
        return None
    stated(node, "graph node id", "node's id")  # ABSENT marks a kernel from no graph
    graph = whole(args.graph or 0, "args.graph id", "an exec graph's id")
    if abs(graph) >= GRAPH_ID_BOUND:
        raise UnusableField(f"graph id {graph} does not fit a toolsId: expected one below 2**31")
    return (graph << 32) | (node & 0xFFFF_FFFF) if graph else node


def is_runner_function(name: str) -> bool:
    """A python function (torch.profiler with stack) that is a model runner's step, such as
    vLLM's `…/gpu_model_runner.py(N): execute_model` (each engine's module says which). The
    reader keeps these as ranges, which graphrt.trace.analysis.markers reads as step markers."""
    return any(runner(name) for runner in _RUNNER_FUNCTIONS)


def python_kind(name: str) -> Into:
    """Where a python function goes: FRAME (a module's call), RANGE (a runner's step) or NONE."""
    return Into.FRAME if name.startswith(MODULE_FRAME) else Into.RANGE if is_runner_function(name) else Into.NONE


def span(ts: Any, dur: Any) -> tuple[int, int]:
    """A complete event's (start, end) in nanoseconds, from its `ts` and `dur` (none: 0) in
    microseconds. KeyError("ts") where it has no start; UnusableField for a negative duration (a
    profiler's end is never before its start, on one clock) or an end past 64 bits."""
    start = ns(ts if ts is not None else _missing("ts"))
    length = ns(dur or 0)
    if length < 0:
        raise UnusableField(f"dur {shown(dur)} is negative: expected a duration of 0 µs or more")
    if not -INT64 <= start <= start + length < INT64:
        raise UnusableField(f"ts {shown(ts)} and dur {shown(dur)} µs end past 64 bits of nanoseconds: expected a "
                            "time on a profiler's clock")
    return start, start + length


def _missing(field: str) -> Any:
    raise KeyError(field)
