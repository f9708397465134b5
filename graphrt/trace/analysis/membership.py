"""Which launch calls, kernels and CPU ops belong to each range of a trace.

How things are tied together (all on the CPU side, per thread):

- Ranges on one thread nest (NVTX push/pop, `record_function`); each range's parent is the
  innermost other range on its thread that contains it.
- A CUDA API call belongs to the innermost range open on its thread when the call began, and so
  to every range around that one. A kernel belongs where the call that launched it (joined by
  correlation id, see `Kernel.launch`) belongs: NVTX ranges are CPU time, so a kernel that runs
  on the GPU long after its range closed still counts for the range that launched it. Under CUDA
  graph replay every replayed kernel shares the `cudaGraphLaunch`'s correlation id, so all of
  them land in the range around `replay()`.
- A CPU op (torch.profiler `cpu_op`) belongs to the innermost range open when it began; only
  top-level ops (not called by another op) are counted, so `aten::linear` is one op, not three.
- torch.profiler's `ProfilerStep#N` is an iteration of the whole process: the calls and ops its
  other threads made while it was open belong to it too.

Everything here reads the trace's columns with numpy, in time linear in the events (after sorts):
a trace of millions of events is placed in a few seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from graphrt.measure.launch_names import launch_kind
from graphrt.trace.analysis.markers import GRAPHRT, PROFILER, Step, choose_steps, group_label, step_mode
from graphrt.trace.analysis.names import PROFILER_STEP, group_name
from graphrt.trace.read.events import ABSENT, ApiCalls, Ranges, Table, Trace

NONE = -1  # no range, in the index arrays below


def call_kinds(calls: ApiCalls) -> list[str | None]:
    """Per call, graphrt.measure.launch_names.launch_kind of its name (worked out once per name)."""
    kinds: dict[str, str | None] = {}
    return [kinds[n] if n in kinds else kinds.setdefault(n, launch_kind(n)) for n in calls.strings("name")]


def _threads(spans: Table, rows: np.ndarray | None = None) -> list[np.ndarray]:
    """The rows (all, or `rows`) on each thread, by start; of two with the same start, longer first."""
    rows = np.arange(len(spans)) if rows is None else rows
    pids, tids = spans.ints("pid")[rows], spans.ints("tid")[rows]
    order = rows[np.lexsort((-spans.ints("end_ns")[rows], spans.ints("start_ns")[rows], tids, pids))]
    p, t = spans.ints("pid")[order], spans.ints("tid")[order]
    breaks = np.flatnonzero((p[1:] != p[:-1]) | (t[1:] != t[:-1])) + 1
    return np.split(order, breaks) if len(order) else []


def parent_of_each(spans: Table) -> np.ndarray:
    """For each span, the innermost other span on its thread that contains it (NONE if none)."""
    parent = np.full(len(spans), NONE, dtype=np.int64)
    ends = spans.ints("end_ns")
    for order in _threads(spans):
        stack: list[int] = []  # open spans, outermost first
        for i in order.tolist():
            while stack and ends[stack[-1]] < ends[i]:
                stack.pop()
            parent[i] = stack[-1] if stack else NONE
            stack.append(i)
    return parent


def top_level(spans: Table) -> np.ndarray:
    """The spans no other span on their thread contains, in index order. In start order (longer
    first), a span is contained exactly when an earlier one on its thread ends no sooner."""
    ends = spans.ints("end_ns")
    top = []
    for order in _threads(spans):
        e = ends[order]
        reach = np.maximum.accumulate(e)  # the latest end so far, this span's included
        top.append(order[np.concatenate([[True], e[1:] > reach[:-1]])])
    return np.sort(np.concatenate(top)) if top else np.zeros(0, dtype=np.int64)


def innermost_open(ranges: Table, parent: np.ndarray, items: Table, rows: np.ndarray) -> np.ndarray:
    """Per item of `rows`, the innermost range open on its thread when it began (NONE if none)."""
    found = np.full(len(rows), NONE, dtype=np.int64)
    if not len(ranges) or not len(rows):
        return found
    starts, ends = ranges.ints("start_ns"), ranges.ints("end_ns")
    item_pid, item_tid, item_t = (items.ints(c)[rows] for c in ("pid", "tid", "start_ns"))
    for order in _threads(ranges):
        pid, tid = ranges.ints("pid")[order[0]], ranges.ints("tid")[order[0]]
        on = np.flatnonzero((item_pid == pid) & (item_tid == tid))
        t = item_t[on]
        j = np.searchsorted(starts[order], t, side="right") - 1
        # the last range to start by t, or else the nearest of its ancestors still open at t
        r = np.where(j >= 0, order[np.maximum(j, 0)], NONE)
        while (climb := (r != NONE) & (ends[np.maximum(r, 0)] < t)).any():
            r[climb] = parent[r[climb]]
        found[on] = r
    return found


def _spread(parent: np.ndarray, items: Iterable[int], homes: Iterable[int]) -> list[list[int]]:
    """For each range, the items that belong to it or to a range inside it: an item counts for
    its innermost range (its home, or NONE) and every range around it."""
    per_range: list[list[int]] = [[] for _ in range(len(parent))]
    up = parent.tolist()
    for item, r in zip(items, homes):
        while r != NONE:
            per_range[r].append(item)
            r = up[r]
    return per_range


def _optional(values: np.ndarray) -> list[int | None]:
    return [None if v == NONE else v for v in values.tolist()]


@dataclass
class Membership:
    """Which items belong to each range (by index into the trace's lists), nested ranges included."""

    parent: list[int | None]  # per range: the innermost range around it on its thread
    kernels: list[list[int]]  # per range: kernels launched inside it
    launches: list[list[int]]  # per range: launch API calls made inside it
    ops: list[list[int]]  # per range: top-level CPU ops run inside it
    kernel_home: list[int | None]  # per kernel: the innermost range its launch call was made in
    top_ops: list[int]  # the CPU ops no other op called, by index into Trace.cpu_ops
    op_home: dict[int, int | None]  # per top-level op: the innermost range it ran in
    steps: list[Step] = field(default_factory=list)  # the steps, by start (graphrt.trace.analysis.markers)

    @classmethod
    def of(cls, trace: Trace) -> Membership:
        ranges, calls, ops = trace.ranges, trace.api_calls, trace.cpu_ops
        parent = parent_of_each(ranges)
        kinds = call_kinds(calls)
        launches = np.flatnonzero(np.array([k is not None for k in kinds], dtype=bool))
        call_home = np.full(len(calls), NONE, dtype=np.int64)
        linked = trace.kernels.ints("launch")
        # only a launch call's home is asked for (a kernel's launch is one): others lie in no list
        homed = np.union1d(launches, linked[linked != ABSENT])
        call_home[homed] = innermost_open(ranges, parent, calls, homed)
        kernel_home = np.full(len(linked), NONE, dtype=np.int64)
        kernel_home[linked != ABSENT] = call_home[linked[linked != ABSENT]]
        top_ops = top_level(ops)
        op_home = innermost_open(ranges, parent, ops, top_ops)
        membership = cls(
            parent=_optional(parent),
            kernels=_spread(parent, range(len(kernel_home)), kernel_home.tolist()),
            launches=_spread(parent, launches.tolist(), call_home[launches].tolist()),
            ops=_spread(parent, top_ops.tolist(), op_home.tolist()),
            kernel_home=_optional(kernel_home), top_ops=top_ops.tolist(),
            op_home=dict(zip(top_ops.tolist(), _optional(op_home))))
        membership._widen_profiler_steps(trace, launches, top_ops)
        membership.steps = membership._steps(ranges, kinds)
        return membership

    def _steps(self, ranges: Ranges, kinds: list[str | None]) -> list[Step]:
        """The ranges that are steps (graphrt.trace.analysis.markers.choose_steps), each with the
        way it ran, told by the graph launches inside it (`kinds`: each call's launch kind), and
        its group."""
        names, recorded = ranges.strings("name"), "kernel" in kinds or "graph" in kinds
        steps = []
        for r, marker in choose_steps(names, self.parent,
                                      list(zip(ranges.ints("pid").tolist(), ranges.ints("tid").tolist())),
                                      ranges.ints("start_ns").tolist(), ranges.ints("end_ns").tolist()):
            mode = step_mode(sum(kinds[i] == "graph" for i in self.launches[r]), recorded, marker)
            own = marker.engine in (GRAPHRT, PROFILER)
            steps.append(Step(r, marker, mode, group_name(names[r]) if own else group_label(marker, mode)))
        return steps

    def _widen_profiler_steps(self, trace: Trace, launches: np.ndarray, top_ops: np.ndarray) -> None:
        """torch.profiler's `ProfilerStep#N` is an iteration of the whole process: the launch
        calls and ops its other threads (autograd's backward thread, say) made while it was open
        belong to it too, and the kernels those calls launched."""
        calls, ops, ranges = trace.api_calls, trace.cpu_ops, trace.ranges
        call_starts, call_pids, call_tids = calls.ints("start_ns"), calls.ints("pid"), calls.ints("tid")
        is_launch = np.zeros(len(calls), dtype=bool)
        is_launch[launches] = True
        launch_of = trace.kernels.ints("launch")
        by_launch = np.argsort(launch_of, kind="stable")  # kernels grouped by their call, in order
        launched_sorted = launch_of[by_launch]
        op_starts = ops.ints("start_ns")[top_ops]
        op_pids, op_tids = ops.ints("pid")[top_ops], ops.ints("tid")[top_ops]
        for r, name in enumerate(ranges.strings("name")):
            if not name.startswith(PROFILER_STEP):
                continue
            rng = ranges[r]
            lo, hi = np.searchsorted(call_starts, rng.start_ns, side="left"), np.searchsorted(call_starts, rng.end_ns, side="right")
            elsewhere = np.arange(lo, hi)[(call_pids[lo:hi] == rng.pid) & (call_tids[lo:hi] != rng.tid)]
            self.launches[r] += elsewhere[is_launch[elsewhere]].tolist()
            firsts = np.searchsorted(launched_sorted, elsewhere, side="left")
            lasts = np.searchsorted(launched_sorted, elsewhere, side="right")
            self.kernels[r] += [k for a, b in zip(firsts.tolist(), lasts.tolist()) for k in by_launch[a:b].tolist()]
            lo, hi = np.searchsorted(op_starts, rng.start_ns, side="left"), np.searchsorted(op_starts, rng.end_ns, side="right")
            on = (op_pids[lo:hi] == rng.pid) & (op_tids[lo:hi] != rng.tid)
            self.ops[r] += top_ops[lo:hi][on].tolist()
