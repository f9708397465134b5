"""What belongs to each range, on random traces: Membership (numpy, over whole columns) against
the rules as the module docstring states them, read item by item here.

A trace below has properly nested ranges on three threads (bracket sequences, every time distinct),
and calls, kernels and ops at random times on either thread, some at a range's very start or end.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from graphrt.measure.launch_names import launch_kind
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.read.events import ApiCall, CpuOp, Kernel, Range, Trace

THREADS = [(1, 1), (1, 2), (2, 2)]  # two apart by tid alone, two by pid alone
CALL_NAMES = ["cudaLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync", "cuLaunchKernel"]


@st.composite
def nested_ranges(draw, thread: tuple[int, int]) -> list[Range]:
    """Ranges that nest: opened and closed as brackets, at the even times 2, 4, 6, ..."""
    ranges, open_at, t = [], [], 0
    for opens in draw(st.lists(st.booleans(), max_size=16)):
        t += 2
        if opens or not open_at:
            open_at.append(t)
        else:
            ranges.append(Range(f"r{len(ranges)}", open_at.pop(), t, *thread))
    while open_at:
        t += 2
        ranges.append(Range(f"r{len(ranges)}", open_at.pop(), t, *thread))
    return ranges


TIMES = st.integers(0, 40)  # even times fall on a range's start or end, odd ones inside
THREAD = st.sampled_from(THREADS)


@st.composite
def traces(draw) -> Trace:
    ranges = [r for thread in THREADS for r in draw(nested_ranges(thread))]
    calls = [ApiCall(draw(st.sampled_from(CALL_NAMES)), t, t + 1, *draw(THREAD), n)
             for n, t in enumerate(draw(st.lists(TIMES, max_size=12)))]
    kernels = [Kernel(f"k{n}", 50 + n, 51 + n, 0, 7, c) for n, c in enumerate(draw(st.lists(
        st.integers(-1, len(calls) - 1), max_size=12)))]  # correlation -1: launched by no call
    ops = [CpuOp(f"op{n}", t, t + draw(st.integers(0, 6)), *draw(THREAD))
           for n, t in enumerate(draw(st.lists(TIMES, max_size=12)))]
    return Trace("t", "chrome", ranges=ranges, api_calls=calls, kernels=kernels, cpu_ops=ops)


def _around(trace: Trace, thread: tuple[int, int], t: int) -> list[int]:
    """The ranges open on `thread` at time t, a range's start and end included."""
    return [r for r, rng in enumerate(trace.ranges)
            if (rng.pid, rng.tid) == thread and rng.start_ns <= t <= rng.end_ns]


def _members(trace: Trace, items: list[tuple[int, tuple[int, int], int]]) -> list[list[int]]:
    """Per range, the items (index, thread, time) that began while it was open, in their order."""
    members: list[list[int]] = [[] for _ in trace.ranges]
    for index, thread, t in items:
        for r in _around(trace, thread, t):
            members[r].append(index)
    return members


def _contains(outer: CpuOp | Range, inner: CpuOp | Range) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_each_item_belongs_to_every_range_open_on_its_thread_when_it_began(trace):
    att = Membership.of(trace)
    calls = list(trace.api_calls)
    by_start = sorted(range(len(trace.ranges)), key=lambda r: trace.ranges[r].start_ns)
    # a range's parent: the innermost (latest to start) other range of its thread around it
    parents = [max((p for p in by_start if p != r and (trace.ranges[p].pid, trace.ranges[p].tid)
                    == (rng.pid, rng.tid) and _contains(trace.ranges[p], rng)),
                   key=lambda p: trace.ranges[p].start_ns, default=None)
               for r, rng in enumerate(trace.ranges)]
    assert att.parent == parents

    launches = [(i, (c.pid, c.tid), c.start_ns) for i, c in enumerate(calls) if launch_kind(c.name)]
    assert att.launches == _members(trace, launches)

    # a kernel belongs where its launch call was made, whatever that call is
    kernels = [(k, (calls[kern.launch].pid, calls[kern.launch].tid), calls[kern.launch].start_ns)
               for k, kern in enumerate(trace.kernels) if kern.launch is not None]
    assert att.kernels == _members(trace, kernels)

    # only top-level ops count: those no other op of their thread contains (of two that span the
    # same time, the one listed first in start order holds the other)
    ops = list(trace.cpu_ops)
    top = [i for i, op in enumerate(ops)
           if not any(j != i and (o.pid, o.tid) == (op.pid, op.tid) and _contains(o, op)
                      and (o.start_ns, -o.end_ns, j) < (op.start_ns, -op.end_ns, i) for j, o in enumerate(ops))]
    assert att.top_ops.tolist() == top
    assert att.ops == _members(trace, [(i, (ops[i].pid, ops[i].tid), ops[i].start_ns) for i in top])
