"""One step as the host and the device saw it: its launch calls, and the work they put on the
GPU in order, each piece with the ranges it was issued in.

    timelines = step_timelines(trace)        # one per step range, by start
    timelines[0].work[0].stack              # ("(Qwen2ForCausalLM)", "model (Qwen2Model)", ...)

The work of a step is its kernels (those whose launch call was made inside the step) or, in a
trace without kernels (torch.profiler on a CPU), its top-level CPU ops. A piece of work's `stack`
is the ranges open inside the step when it was issued (the launch call's start, or the op's),
outermost first; `home` is the innermost of them by index into `Trace.ranges` (so two calls of
the same module are told apart), None when it was issued in no range inside the step. Under
graph replay every kernel's stack is empty: it was issued by the one `cudaGraphLaunch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from graphrt.measure.launch_names import launch_kind
from graphrt.trace.analysis.membership import NONE, Launched, Membership
from graphrt.trace.read.columns import ABSENT, Table
from graphrt.trace.read.events import Trace

WHOLE_TRACE = "whole trace"


class Launch(NamedTuple):
    """A launch call the host made in the step."""

    name: str
    kind: str  # "kernel" or "graph" (graphrt.measure.launches.launch_kind)
    start_ns: int
    end_ns: int


class Work(NamedTuple):
    """A kernel, or a top-level CPU op where the trace has no kernels."""

    name: str
    start_ns: int
    end_ns: int
    launch: int | None  # index into StepTimeline.launches of the call that launched it
    stack: tuple[str, ...]
    home: int | None
    node: int | None = None  # the graph node a replayed kernel came from (Kernel.graph_node_id)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Launches(Table[Launch]):
    row, int_fields, str_fields = Launch, ("start_ns", "end_ns"), ("name", "kind")


class WorkItems(Table[Work]):
    """A step's work as columns (a step of a big trace holds hundreds of thousands of kernels);
    `stack` holds each item's tuple of range names, one tuple shared by the items of a home."""

    row, int_fields, str_fields = Work, ("start_ns", "end_ns", "launch", "home", "node"), ("name", "stack")
    optional = frozenset({"launch", "home", "node"})


@dataclass(frozen=True)
class StepTimeline:
    """`work` and `launches` may be given as lists: they become tables."""

    name: str
    group: str  # graphrt.trace.analysis.markers.Step.group
    start_ns: int  # the step range, on the host
    end_ns: int
    unit: str  # "kernel" or "op": what `work` holds
    work: WorkItems  # by start
    launches: Launches  # by start

    def __post_init__(self) -> None:
        for name, table in (("work", WorkItems), ("launches", Launches)):
            if not isinstance(getattr(self, name), table):
                object.__setattr__(self, name, table.of(getattr(self, name)))

    @property
    def names(self) -> list[str]:
        return list(self.work.strings("name"))


class _Stacks:
    """The names of the ranges from a step (exclusive) down to each home, outermost first, and
    the home as a Work holds it; worked out once per home."""

    def __init__(self, trace: Trace, att: Membership, step: int | None) -> None:
        self.names, self.parent, self.step = trace.ranges.strings("name"), att.parent, step
        self.found: dict[int, tuple[tuple[str, ...], int | None]] = {}

    def __call__(self, home: int) -> tuple[tuple[str, ...], int | None]:
        if (found := self.found.get(home)) is not None:
            return found
        names: list[str] = []
        r: int | None = None if home == NONE else home
        while r is not None and r != self.step:
            names.append(self.names[r])
            r = self.parent[r]
        if r != self.step:  # issued outside the step: no stack inside it
            return self.found.setdefault(home, ((), None))
        return self.found.setdefault(home, (tuple(reversed(names)), home if home not in (NONE, self.step) else None))


def _work(trace: Trace, att: Membership, r: int | None, kernels: np.ndarray, ops: np.ndarray,
          local: np.ndarray) -> tuple[str, WorkItems]:
    """(the unit, the step's work by start): its kernels, or its top-level ops in a trace without
    kernels; `local`: the trace's launch calls of the step, in the order of its launches."""
    stacks = _Stacks(trace, att, r)
    work = WorkItems()
    if len(trace.kernels):
        unit, table, rows = "kernel", trace.kernels, kernels
        homes, nodes = att.kernel_home[rows], table.ints("graph_node_id")[rows]
        launch = table.ints("launch")[rows]
        at = np.searchsorted(local, launch)  # the launch's index among the step's, where it is one of them
        found = at < len(local)
        found[found] = local[at[found]] == launch[found]
        launched = np.where(found, at, ABSENT)
    else:
        unit, table, rows = "op", trace.cpu_ops, ops
        homes = att.op_home[np.searchsorted(att.top_ops, rows)]
        launched = nodes = np.full(len(rows), ABSENT)
    starts, ends = table.ints("start_ns")[rows], table.ints("end_ns")[rows]
    by_start = np.lexsort((ends, starts))  # stable: ties in the order of `rows`
    names = table.strings("name")
    found_stacks = [stacks(home) for home in homes[by_start].tolist()]
    work.extend(name=[names[i] for i in rows[by_start].tolist()], start_ns=starts[by_start], end_ns=ends[by_start],
                launch=launched[by_start], stack=[stack for stack, _ in found_stacks],
                home=np.array([ABSENT if home is None else home for _, home in found_stacks], dtype=np.int64),
                node=nodes[by_start])
    return unit, work


def _timeline(trace: Trace, att: Membership, r: int | None, group: str = WHOLE_TRACE) -> StepTimeline:
    """The step range `r`'s timeline, in `group`; for r None, the whole trace's."""
    calls = trace.api_calls
    if r is None:
        launch_calls = np.flatnonzero(att.launch_kinds != Launched.NOTHING)
        kernels = np.flatnonzero(trace.kernels.ints("launch") != ABSENT)
        ops = att.top_ops
        tables = [t for t in (trace.kernels, trace.cpu_ops, calls) if len(t)]
        name = WHOLE_TRACE
        start = min((int(t.ints("start_ns").min()) for t in tables), default=0)
        end = max((int(t.ints("end_ns").max()) for t in tables), default=0)
    else:
        launch_calls, kernels, ops = att.launches[r], att.kernels[r], att.ops[r]
        name, start, end = trace.ranges[r].name, trace.ranges[r].start_ns, trace.ranges[r].end_ns
    launch_calls = np.sort(launch_calls)  # a reader lists the calls in start order
    call_names = calls.strings("name")
    launches = Launches()
    launches.extend(name=[call_names[i] for i in launch_calls.tolist()],
                    kind=[launch_kind(call_names[i]) for i in launch_calls.tolist()],
                    start_ns=calls.ints("start_ns")[launch_calls], end_ns=calls.ints("end_ns")[launch_calls])
    unit, work = _work(trace, att, r, kernels, ops, launch_calls)
    return StepTimeline(name, group, start, end, unit, work, launches)


def whole_trace(trace: Trace, att: Membership | None = None) -> StepTimeline:
    """The whole trace as one timeline, for a trace without steps: every kernel that matches a
    launch call (every top-level op, without kernels), each with its full stack of ranges."""
    return _timeline(trace, att or Membership.of(trace), None)


def step_timelines(trace: Trace, att: Membership | None = None) -> list[StepTimeline]:
    """Every step of the trace, by start."""
    att = att or Membership.of(trace)
    return [_timeline(trace, att, s.range, s.group) for s in att.steps]
