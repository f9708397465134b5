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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from graphrt.measure.launch_names import launch_kind
from graphrt.trace.analysis.markers import GRAPHRT, PROFILER, Step, choose_steps, group_label, step_mode
from graphrt.trace.analysis.names import PROFILER_STEP, group_name
from graphrt.trace.read.columns import ABSENT, Table
from graphrt.trace.read.events import ApiCalls, Ranges, Trace

NONE = -1  # no range, in the index arrays below


class Launched(IntEnum):
    """What an API call launches (graphrt.measure.launch_names.launch_kind), as `call_kinds` codes it."""

    NOTHING = 0
    KERNEL = 1
    GRAPH = 2


_LAUNCHES = {None: Launched.NOTHING, "kernel": Launched.KERNEL, "graph": Launched.GRAPH}


def call_kinds(calls: ApiCalls) -> np.ndarray:
    """Per call, what it launches: a `Launched` code, one byte a call (int8), worked out once per
    distinct name. (A list of kinds would hold 8 bytes a call: 21 MB in a trace of 2.7 M calls.)"""
    names = calls.strings("name")
    code = {name: _LAUNCHES[launch_kind(name)] for name in set(names)}
    return np.fromiter(map(code.__getitem__, names), dtype=np.int8, count=len(names))


def _threads(spans: Table) -> list[np.ndarray]:
    """The rows on each thread, by start; of two with the same start, longer first. The columns
    are sorted as they are, so a table of millions of rows is copied twice at most (its order,
    and one column at a time)."""
    pids, tids, starts, ends = (spans.ints(c) for c in ("pid", "tid", "start_ns", "end_ns"))
    order = np.lexsort((np.negative(ends), starts, tids, pids))
    if not len(order):
        return []
    breaks = np.zeros(len(order) - 1, dtype=bool)  # where the next row is on another thread
    for column in (pids, tids):
        on = column[order]
        breaks |= on[1:] != on[:-1]
        del on
    return np.split(order, np.flatnonzero(breaks) + 1)


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


class Members(Sequence[np.ndarray]):
    """Per range, the items that belong to it, by index: `members[r]` is an int64 array (a view
    of one array for all ranges, so a trace of millions of items holds 8 bytes per membership)."""

    def __init__(self, flat: np.ndarray, bounds: np.ndarray) -> None:
        self.flat, self.bounds = flat, bounds  # range r's items are flat[bounds[r]:bounds[r + 1]]

    @classmethod
    def of(cls, parent: np.ndarray, items: np.ndarray, homes: np.ndarray,
           extra: tuple[np.ndarray, np.ndarray]) -> Members:
        """Each item counts for its innermost range (its home, or NONE) and every range around
        it, in the order of `items`; then `extra` (ranges, items), in its order.

        Each membership is one int64, (range, the item's place in that order), sorted: a trace
        of millions of items holds 16 bytes per membership at most while they are made."""
        ranges, extra_items = extra
        places = len(items) + len(extra_items) + 1
        levels = [ranges * places + len(items) + np.arange(len(extra_items))]
        at, place = homes, np.arange(len(items))
        while len(at):  # a level of nesting at a time: the items' homes, their parents, ...
            live = at != NONE
            at, place = at[live], place[live]
            levels.append(at * places + place)
            at = parent[at]
        keys = joined(levels)
        del levels
        keys.sort()
        bounds = np.searchsorted(keys, np.arange(len(parent) + 1) * places)
        keys %= places
        return cls(np.concatenate([items, extra_items])[keys], bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, r):  # type: ignore[override]: an int gives a range's items
        return self.flat[self.bounds[r]:self.bounds[r + 1]]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and [m.tolist() for m in self] == [list(m) for m in other]


def joined(parts: Iterable[np.ndarray]) -> np.ndarray:
    """Integer arrays one after another (an empty one for none)."""
    return np.concatenate([np.zeros(0, np.int64), *parts])


def _optional(values: np.ndarray) -> list[int | None]:
    return [None if v == NONE else v for v in values.tolist()]


@dataclass
class Membership:
    """Which items belong to each range (by index into the trace's lists), nested ranges included."""

    parent: list[int | None]  # per range: the innermost range around it on its thread
    launch_kinds: np.ndarray  # per API call: what it launches (a Launched code, call_kinds)
    kernels: Members  # per range: kernels launched inside it
    launches: Members  # per range: launch API calls made inside it
    ops: Members  # per range: top-level CPU ops run inside it
    kernel_home: np.ndarray  # per kernel: the innermost range its launch call was made in (NONE: none)
    top_ops: np.ndarray  # the CPU ops no other op called, by index into Trace.cpu_ops, ascending
    op_home: np.ndarray  # per top-level op (of top_ops): the innermost range it ran in (NONE: none)
    steps: list[Step] = field(default_factory=list)  # the steps, by start (graphrt.trace.analysis.markers)

    @classmethod
    def of(cls, trace: Trace) -> Membership:
        ranges, calls, ops = trace.ranges, trace.api_calls, trace.cpu_ops
        parent = parent_of_each(ranges)
        kinds = call_kinds(calls)
        launches = np.flatnonzero(kinds != Launched.NOTHING)
        linked = trace.kernels.ints("launch")
        # only a launch call's home is asked for (a kernel's launch is one): others lie in no list
        homed = np.union1d(launches, linked[linked != ABSENT])
        homes = innermost_open(ranges, parent, calls, homed)  # homes[i]: call homed[i]'s

        def home(rows: np.ndarray) -> np.ndarray:
            return homes[np.searchsorted(homed, rows)]

        kernel_home = np.full(len(linked), NONE, dtype=np.int64)
        kernel_home[linked != ABSENT] = home(linked[linked != ABSENT])
        top_ops = top_level(ops)
        op_home = innermost_open(ranges, parent, ops, top_ops)
        elsewhere = _profiler_steps_elsewhere(trace, launches, top_ops)
        membership = cls(
            parent=_optional(parent), launch_kinds=kinds,
            kernels=Members.of(parent, np.arange(len(kernel_home)), kernel_home, elsewhere["kernels"]),
            launches=Members.of(parent, launches, home(launches), elsewhere["launches"]),
            ops=Members.of(parent, top_ops, op_home, elsewhere["ops"]),
            kernel_home=kernel_home, top_ops=top_ops, op_home=op_home)
        membership.steps = membership._steps(ranges)
        return membership

    def _steps(self, ranges: Ranges) -> list[Step]:
        """The ranges that are steps (graphrt.trace.analysis.markers.choose_steps), each with the
        way it ran, told by the launch calls inside it, and its group."""
        names, recorded = ranges.strings("name"), bool(self.launch_kinds.any())
        steps = []
        for r, marker in choose_steps(names, self.parent,
                                      list(zip(ranges.ints("pid").tolist(), ranges.ints("tid").tolist())),
                                      ranges.ints("start_ns").tolist(), ranges.ints("end_ns").tolist()):
            mine = self.launch_kinds[self.launches[r]]
            mode = step_mode(len(mine), int((mine == Launched.GRAPH).sum()), recorded, marker)
            own = marker.engine in (GRAPHRT, PROFILER)
            steps.append(Step(r, marker, mode, group_name(names[r]) if own else group_label(marker, mode)))
        return steps



def _profiler_steps_elsewhere(trace: Trace, launches: np.ndarray,
                              top_ops: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """torch.profiler's `ProfilerStep#N` is an iteration of the whole process: the launch calls
    and ops its other threads (autograd's backward thread, say) made while it was open belong to
    it too, and the kernels those calls launched. Per kind of item ("launches", "kernels",
    "ops"), what this adds as (ranges, items): a ProfilerStep range beside each such item."""
    calls, ops, ranges = trace.api_calls, trace.cpu_ops, trace.ranges
    call_starts, call_pids, call_tids = calls.ints("start_ns"), calls.ints("pid"), calls.ints("tid")
    is_launch = np.zeros(len(calls), dtype=bool)
    is_launch[launches] = True
    launch_of = trace.kernels.ints("launch")
    by_launch = np.argsort(launch_of, kind="stable")  # kernels grouped by their call, in order
    launched_sorted = launch_of[by_launch]
    op_starts = ops.ints("start_ns")[top_ops]
    op_pids, op_tids = ops.ints("pid")[top_ops], ops.ints("tid")[top_ops]
    added: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"launches": [], "kernels": [], "ops": []}
    for r, name in enumerate(ranges.strings("name")):
        if not name.startswith(PROFILER_STEP):
            continue
        rng = ranges[r]
        lo, hi = np.searchsorted(call_starts, rng.start_ns, side="left"), np.searchsorted(call_starts, rng.end_ns, side="right")
        elsewhere = np.arange(lo, hi)[(call_pids[lo:hi] == rng.pid) & (call_tids[lo:hi] != rng.tid)]
        firsts = np.searchsorted(launched_sorted, elsewhere, side="left")
        lasts = np.searchsorted(launched_sorted, elsewhere, side="right")
        lo, hi = np.searchsorted(op_starts, rng.start_ns, side="left"), np.searchsorted(op_starts, rng.end_ns, side="right")
        for kind, items in (("launches", elsewhere[is_launch[elsewhere]]),
                            ("kernels", joined(by_launch[a:b] for a, b in zip(firsts.tolist(), lasts.tolist()))),
                            ("ops", top_ops[lo:hi][(op_pids[lo:hi] == rng.pid) & (op_tids[lo:hi] != rng.tid)])):
            added[kind].append((np.full(len(items), r, dtype=np.int64), items))
    return {kind: (joined(r for r, _ in pairs), joined(items for _, items in pairs)) for kind, pairs in added.items()}
