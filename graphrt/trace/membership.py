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
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from graphrt.launches import launch_kind
from graphrt.trace.model import Trace
from graphrt.trace.names import PROFILER_STEP


class _Span(Protocol):
    start_ns: int
    end_ns: int
    pid: int
    tid: int


def _by_thread(spans: Sequence[_Span]) -> dict[tuple[int, int], list[int]]:
    """Indices of the spans on each thread, by start; of two with the same start, longer first."""
    threads: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(spans):
        threads[(s.pid, s.tid)].append(i)
    for order in threads.values():
        order.sort(key=lambda i: (spans[i].start_ns, -spans[i].end_ns))
    return threads


def _parents(spans: Sequence[_Span]) -> list[int | None]:
    """For each span, the innermost other span on its thread that contains it (or None)."""
    parent: list[int | None] = [None] * len(spans)
    for order in _by_thread(spans).values():
        stack: list[int] = []  # open spans, outermost first
        for i in order:
            while stack and spans[stack[-1]].end_ns < spans[i].end_ns:
                stack.pop()
            parent[i] = stack[-1] if stack else None
            stack.append(i)
    return parent


class _Locator:
    """Finds the innermost span open on a thread at a time."""

    def __init__(self, spans: Sequence[_Span], parent: list[int | None]):
        self._spans, self._parent = spans, parent
        self._order = _by_thread(spans)
        self._starts = {key: [spans[i].start_ns for i in order] for key, order in self._order.items()}

    def innermost(self, pid: int, tid: int, t: int) -> int | None:
        order = self._order.get((pid, tid))
        if not order:
            return None
        j = bisect.bisect_right(self._starts[(pid, tid)], t) - 1
        # the last span to start by t, or else the nearest of its ancestors still open at t
        r = order[j] if j >= 0 else None
        while r is not None and self._spans[r].end_ns < t:
            r = self._parent[r]
        return r


def _spread(parent: list[int | None], homes: Iterable[tuple[int, int | None]]) -> list[list[int]]:
    """For each range, the items that belong to it or to a range inside it.

    `homes` gives (item, innermost range or None); an item counts for that range and every
    range around it."""
    per_range: list[list[int]] = [[] for _ in parent]
    for item, r in homes:
        while r is not None:
            per_range[r].append(item)
            r = parent[r]
    return per_range


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

    @classmethod
    def of(cls, trace: Trace) -> Membership:
        ranges, calls, ops = trace.ranges, trace.api_calls, trace.cpu_ops
        parent = _parents(ranges)
        locate = _Locator(ranges, parent).innermost
        call_home = [locate(c.pid, c.tid, c.start_ns) for c in calls]
        kernel_home = [call_home[k.launch] if k.launch is not None else None for k in trace.kernels]
        top_ops = [i for i, p in enumerate(_parents(ops)) if p is None]
        op_home = {i: locate(ops[i].pid, ops[i].tid, ops[i].start_ns) for i in top_ops}
        membership = cls(
            parent=parent,
            kernels=_spread(parent, enumerate(kernel_home)),
            launches=_spread(parent, ((i, call_home[i]) for i, c in enumerate(calls) if launch_kind(c.name))),
            ops=_spread(parent, op_home.items()),
            kernel_home=kernel_home, top_ops=top_ops, op_home=op_home)
        membership._widen_profiler_steps(trace)
        return membership

    def _widen_profiler_steps(self, trace: Trace) -> None:
        """torch.profiler's `ProfilerStep#N` is an iteration of the whole process: the launch
        calls and ops its other threads (autograd's backward thread, say) made while it was open
        belong to it too, and the kernels those calls launched."""
        calls, ops = trace.api_calls, trace.cpu_ops
        call_starts = [c.start_ns for c in calls]
        launched: dict[int, list[int]] = defaultdict(list)  # call -> the kernels it launched
        for i, k in enumerate(trace.kernels):
            if k.launch is not None:
                launched[k.launch].append(i)
        for r, rng in enumerate(trace.ranges):
            if not rng.name.startswith(PROFILER_STEP):
                continue
            lo, hi = bisect.bisect_left(call_starts, rng.start_ns), bisect.bisect_right(call_starts, rng.end_ns)
            elsewhere = {i for i in range(lo, hi) if calls[i].pid == rng.pid and calls[i].tid != rng.tid}
            self.launches[r] += sorted(i for i in elsewhere if launch_kind(calls[i].name))
            self.kernels[r] += [k for call in sorted(elsewhere) for k in launched.get(call, ())]
            self.ops[r] += [i for i in self.top_ops if ops[i].pid == rng.pid and ops[i].tid != rng.tid
                            and rng.start_ns <= ops[i].start_ns <= rng.end_ns]
