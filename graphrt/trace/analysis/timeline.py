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

from graphrt.measure.launch_names import launch_kind
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.read.events import Range, Trace

WHOLE_TRACE = "whole trace"


@dataclass(frozen=True)
class Launch:
    """A launch call the host made in the step."""

    name: str
    kind: str  # "kernel" or "graph" (graphrt.measure.launches.launch_kind)
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Work:
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


@dataclass(frozen=True)
class StepTimeline:
    name: str
    group: str  # graphrt.trace.analysis.markers.Step.group
    start_ns: int  # the step range, on the host
    end_ns: int
    unit: str  # "kernel" or "op": what `work` holds
    work: list[Work]  # by start
    launches: list[Launch]  # by start

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.work]


def _stack(trace: Trace, att: Membership, home: int | None,
           step: int | None) -> tuple[tuple[str, ...], int | None]:
    """The names of the ranges from the step (exclusive) down to `home`, outermost first."""
    names: list[str] = []
    r = home
    while r is not None and r != step:
        names.append(trace.ranges[r].name)
        r = att.parent[r]
    if r != step:  # issued outside the step: no stack inside it
        return (), None
    return tuple(reversed(names)), (home if home != step else None)


def _timeline(trace: Trace, att: Membership, r: int | None, group: str = WHOLE_TRACE) -> StepTimeline:
    """The step range `r`'s timeline, in `group`; for r None, the whole trace's."""
    if r is None:
        launches_of = [i for i, c in enumerate(trace.api_calls) if launch_kind(c.name)]
        kernels_of = [i for i, k in enumerate(trace.kernels) if k.launch is not None]
        ops_of = att.top_ops
        items = [*trace.kernels, *trace.cpu_ops, *trace.api_calls]
        start = min((x.start_ns for x in items), default=0)
        rng = Range(WHOLE_TRACE, start, max((x.end_ns for x in items), default=0), 0, 0)
    else:
        launches_of, kernels_of, ops_of, rng = att.launches[r], att.kernels[r], att.ops[r], trace.ranges[r]
    calls = sorted(launches_of)  # a reader lists the calls in start order
    local = {call: n for n, call in enumerate(calls)}
    launches = [Launch(c.name, launch_kind(c.name), c.start_ns, c.end_ns)  # type: ignore[arg-type]: launch calls only
                for c in (trace.api_calls[i] for i in calls)]
    work: list[Work] = []
    if trace.kernels:
        unit = "kernel"
        for i in kernels_of:
            k = trace.kernels[i]
            stack, home = _stack(trace, att, att.kernel_home[i], r)
            work.append(Work(k.name, k.start_ns, k.end_ns, local.get(k.launch), stack, home, k.graph_node_id))
    else:
        unit = "op"
        for i in ops_of:
            op = trace.cpu_ops[i]
            stack, home = _stack(trace, att, att.op_home[i], r)
            work.append(Work(op.name, op.start_ns, op.end_ns, None, stack, home))
    work.sort(key=lambda w: (w.start_ns, w.end_ns))
    return StepTimeline(rng.name, group, rng.start_ns, rng.end_ns, unit, work, launches)


def whole_trace(trace: Trace, att: Membership | None = None) -> StepTimeline:
    """The whole trace as one timeline, for a trace without steps: every kernel that matches a
    launch call (every top-level op, without kernels), each with its full stack of ranges."""
    return _timeline(trace, att or Membership.of(trace), None)


def step_timelines(trace: Trace, att: Membership | None = None) -> list[StepTimeline]:
    """Every step of the trace, by start."""
    att = att or Membership.of(trace)
    return [_timeline(trace, att, s.range, s.group) for s in att.steps]
