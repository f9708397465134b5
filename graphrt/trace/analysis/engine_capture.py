"""Which module and op launched each replayed kernel, carried over from an engine's capture trace.

A serving engine can trace its graph captures apart from its serving (vLLM's
`capture_torch_profiler_dir`, SGLang's capture traces): while a graph is captured Python still
runs, so the trace holds each launch call with the modules (`nn.Module: Qwen2MLP_3` frames) and
the CPU op open around it, and on ROCm each launch call names its kernel (`args.kernel`). The
graph replays those kernels in capture order, so the replayed kernel names are aligned with the
captured ones (graphrt.trace.analysis.attribution.carry_over, as for graphrt's own replays) and
each matched kernel takes the stack its twin was launched in. What does not match is
unattributed, never guessed; a capture whose calls name no kernel (CUDA's) attributes nothing.

    groups = captures(trace)                 # a capture trace's graphs, by capture marker
    found = attribute(timeline, groups)      # a replayed step's kernels, attributed

A capture's launches are those its thread made between `cudaStreamBeginCapture` (or HIP's) and
the matching end; where an engine marked the capture (`capture_32_DECODE`, `capture_8192_PIECEWISE`:
size and mode), the graphs inside one marker are one group (a piecewise step's pieces), else
each graph is a group of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphrt.trace.analysis.attribution import Attribution, carry_over
from graphrt.trace.analysis.membership import NONE, Launched, call_kinds, innermost_open, parent_of_each
from graphrt.trace.analysis.names import group_name
from graphrt.trace.analysis.timeline import StepTimeline
from graphrt.trace.read.chrome_events import MODULE_FRAME
from graphrt.trace.read.events import Trace

CAPTURE_MARKER = re.compile(r"capture_(\d+)_(\w+)")  # vLLM's capture_32_FULL, SGLang's capture_32_DECODE
_BEGIN, _END = "StreamBeginCapture", "StreamEndCapture"  # cuda…, hip…, cu…
_LAYER = re.compile(r".*Layer_\d+")  # a decoder layer's module frame: Qwen3DecoderLayer_3
OP = "op: "  # an op's entry in a stack, after the module frames


@dataclass(frozen=True)
class CapturedLaunch:
    """One launch call made while a graph was captured: its kernel, the stack it was made in (the
    module frames open, outermost first, then the outermost CPU op as `op: NAME`), and the call
    it lies in: two identical kernels of one module call are told apart only by its op."""

    kernel: str
    stack: tuple[str, ...]
    call: tuple[int, int | None]  # (innermost module frame, outermost op): which call it lies in
    graph: int  # which graph of its group (a piece), from 0


@dataclass(frozen=True)
class CaptureGroup:
    """The graphs one capture marker holds (or one unmarked graph) and their launches in order."""

    name: str  # the marker (`capture_32_DECODE`), or `graph N` for an unmarked one
    source: str  # the trace file
    graphs: int
    launches: list[CapturedLaunch]

    @property
    def named(self) -> bool:
        """Whether the calls name their kernels (a ROCm trace's do)."""
        return any(launch.kernel for launch in self.launches)


def _windows(trace: Trace) -> list[tuple[int, int, int, int]]:
    """(pid, tid, start, end) of each stream capture, by start."""
    calls, out = trace.api_calls, []
    names = calls.strings("name")
    marks = {n for n in set(names) if n.endswith(_BEGIN) or n.endswith(_END)}
    rows = [i for i, name in enumerate(names) if name in marks] if marks else []
    open_: dict[tuple[int, int], int] = {}
    for i, start, pid, tid in zip(rows, *(calls.ints(c)[rows].tolist() for c in ("start_ns", "pid", "tid"))):
        if names[i].endswith(_BEGIN):
            open_[(pid, tid)] = start
        elif (pid, tid) in open_:
            out.append((pid, tid, open_.pop((pid, tid)), start))
    return sorted(out, key=lambda w: w[2])


def _climb(parent: np.ndarray, r: int) -> list[int]:
    """`r` and every span around it, innermost first (none for NONE)."""
    out = []
    while r != NONE:
        out.append(r)
        r = int(parent[r])
    return out


def captures(trace: Trace) -> list[CaptureGroup]:
    """Every graph the trace captured, grouped by the capture marker around it."""
    windows = _windows(trace)
    if not windows:
        return []
    calls, frames, ops = trace.api_calls, trace.frames, trace.cpu_ops
    launched = np.flatnonzero(call_kinds(calls) == Launched.KERNEL)
    frame_parent, op_parent = parent_of_each(frames), parent_of_each(ops)
    frame_at, op_at = (innermost_open(frames, frame_parent, calls, launched),
                       innermost_open(ops, op_parent, calls, launched))
    frame_names, op_names, kernels = frames.strings("name"), ops.strings("name"), calls.strings("kernel")
    starts, threads = calls.ints("start_ns")[launched], list(zip(calls.ints("pid")[launched].tolist(),
                                                                  calls.ints("tid")[launched].tolist()))
    marks = [trace.ranges[r] for r, name in enumerate(trace.ranges.strings("name")) if CAPTURE_MARKER.fullmatch(name)]
    held: dict[str, list[tuple[int, int, int, int]]] = {}
    for n, w in enumerate(windows):
        around = [m.name for m in marks if (m.pid, m.tid) == w[:2] and m.start_ns <= w[2] <= m.end_ns]
        held.setdefault(around[0] if around else f"graph {n}", []).append(w)
    groups = []
    for name, graphs in held.items():
        captured = []
        for g, (pid, tid, begin, end) in enumerate(graphs):
            for i in np.flatnonzero((starts >= begin) & (starts <= end)).tolist():
                if threads[i] != (pid, tid):
                    continue
                modules = [frame_names[r].removeprefix(MODULE_FRAME) for r in reversed(_climb(frame_parent, int(frame_at[i])))]
                outer_op = _climb(op_parent, int(op_at[i]))[-1:]  # the outermost op open, if any
                stack = (*modules, *(OP + op_names[r] for r in outer_op))
                call = (int(frame_at[i]), outer_op[0] if outer_op else None)
                captured.append(CapturedLaunch(kernels[int(launched[i])], stack, call, g))
        groups.append(CaptureGroup(name, trace.source, len(graphs), captured))
    return groups


@dataclass(frozen=True)
class CaptureAttribution:
    """A replayed step's graph kernels (`work`: indices into its timeline's work, in order),
    attributed from one capture group, and the graph of the group each matched kernel came from."""

    step: StepTimeline
    group: CaptureGroup
    work: list[int]
    attribution: Attribution
    pieces: list[int | None]  # per work item: the captured graph (piece) its twin lies in

    def layers(self, piece: int) -> tuple[str, str] | None:
        """The first and last decoder layer the piece's matched kernels were launched in, where
        the capture's module frames name layers (None where they do not)."""
        found = [name for stack, p in zip(self.attribution.stacks, self.pieces) if p == piece and stack
                 for name in stack if _LAYER.fullmatch(name)]
        return (found[0], found[-1]) if found else None


def attribute(step: StepTimeline, groups: list[CaptureGroup]) -> CaptureAttribution | None:
    """The step's replayed kernels (those a graph launch ran) attributed from the group of
    `groups` they match best, by kernel name (of groups that match alike, the first captured); None
    for a step that replayed nothing, or where no group's calls name their kernels."""
    work = [i for i, w in enumerate(step.work) if w.launch is not None and step.launches[w.launch].kind == "graph"]
    named = [g for g in groups if g.named]
    if not work or not named:
        return None
    target = [step.work[i].name for i in work]
    best = None
    for group in named:
        found = carry_over([launch.kernel for launch in group.launches], [launch.stack for launch in group.launches],
                           [launch.call for launch in group.launches], target)
        if best is None or found.attributed > best[1].attributed:
            best = (group, found)
    group, found = best
    return CaptureAttribution(step, group, work, found,
                              [None if src is None else group.launches[src].graph for src in found.sources])


def _module(stack: tuple[str, ...] | None) -> str:
    """The innermost module of a stack, by class (`RowParallelLinear_7` -> RowParallelLinear)."""
    if stack is None:
        return UNATTRIBUTED
    modules = [name for name in stack if not name.startswith(OP)]
    return re.sub(r"_\d+$", "", modules[-1]) if modules else NO_MODULE


def _op(stack: tuple[str, ...] | None) -> str:
    if stack is None:
        return UNATTRIBUTED
    ops = [name.removeprefix(OP) for name in stack if name.startswith(OP)]
    return group_name(ops[0]) if ops else NO_OP


UNATTRIBUTED, NO_MODULE, NO_OP = "(unattributed)", "(no module)", "(no op)"
KEYS = {"op": _op, "module": _module}


@dataclass(frozen=True)
class Total:
    """The replayed kernels of one op or module, per step (the mean over the steps)."""

    key: str
    kernels: float
    gpu_ns: float


def totals(found: list[CaptureAttribution], by: str) -> list[Total]:
    """Per op (`by="op"`: the outermost CPU op at capture) or per module (its innermost module's
    class), the replayed kernels and their GPU time per step, most GPU time first."""
    key = KEYS[by]
    kernels: dict[str, int] = {}
    gpu: dict[str, int] = {}
    for f in found:
        for i, stack in zip(f.work, f.attribution.stacks):
            k = key(stack)
            kernels[k] = kernels.get(k, 0) + 1
            gpu[k] = gpu.get(k, 0) + f.step.work[i].duration_ns
    n = len(found)
    return sorted((Total(k, kernels[k] / n, gpu[k] / n) for k in kernels), key=lambda t: (-t.gpu_ns, t.key))
