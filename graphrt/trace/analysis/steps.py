"""What a trace says about decode steps, kernel launches and NVTX ranges.

    report = analyze(load_trace(path))          # figures, as dataclasses
    print(format_report(report))                # tables: graphrt.trace.present.tables

Step groups compared across traces: graphrt.trace.analysis.comparisons.

How ranges, calls, kernels and ops are tied together: graphrt.trace.analysis.membership.

A step is a range named `decode_step[...]` or `replay[...]`, or torch.profiler's `ProfilerStep#N`
(graphrt.trace.analysis.names). Steps with the same group name form a group; a group's figures are
medians over its steps. Range names group the same way (per-call counters dropped).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from graphrt.errors import cut
from graphrt.measure.intervals import busy_and_gaps_of, busy_of
from graphrt.measure.range_names import KINDS, STEP_COLORS, kind_of, parse_range_name
from graphrt.quantiles import median
from graphrt.trace.analysis.membership import Launched, Membership, joined
from graphrt.trace.analysis.markers import GRAPHRT, MARKERS, PROFILER, Marker, Step, unread
from graphrt.trace.analysis.names import group_name
from graphrt.trace.read.columns import ABSENT, Table
from graphrt.trace.read.events import Trace


def range_kind(name: str) -> str | None:
    """The module kind (one of graphrt.measure.range_names.KINDS) of a range, from the class in parentheses
    and the module's name (`model.layers.3.mlp (Qwen2MLP)` -> mlp), or from the bare name for
    ranges that are not module ranges. None for graphrt's step-level ranges (prefill,
    decode_step[...], replay[...], capture[...], copy_in, ...): they hold whole steps."""
    if name.partition("[")[0] in STEP_COLORS:
        return None
    try:
        qualname, cls = parse_range_name(name)
    except ValueError:
        return kind_of(name, "")
    return kind_of(qualname, cls)


# ---------------------------------------------------------------------------------------------
# Figures


UNLINKED_GRAPH_KERNELS = ("graph kernels not linked to their launch: this trace cannot say per-step GPU "
                          "figures for replay")
# StepFigures fields figured over the step's kernels: None where they cannot be known
KERNEL_FIGURES = ("kernels", "gpu_busy_ns", "gpu_idle_ns", "idle_gaps", "median_gap_ns")


@dataclass(frozen=True)
class StepFigures:
    """One decode step (one `decode_step[...]` or `replay[...]` range). Times in ns; `wall_ns`
    is the range's CPU time; GPU figures are over the kernels the step launched. They are None
    (unknown, never 0) for every step with a graph launch in a trace where some graph launch has
    no kernel linked to it: a replay's kernels are tied to it only by the launch's correlation id,
    and where a profiler got those ids wrong (CUPTI 13.0 after a process's first session) they land
    in no step, or several replays' in one."""

    name: str
    start_ns: int
    wall_ns: int
    kernels: int | None
    kernel_launches: int  # cudaLaunchKernel* and other non-graph launch calls
    kernel_launch_ns: int  # their CPU time
    graph_launches: int  # cudaGraphLaunch* calls
    graph_launch_ns: int
    gpu_busy_ns: int | None  # union of the kernels' intervals
    gpu_idle_ns: int | None  # sum of the gaps between consecutive kernels
    idle_gaps: int | None
    median_gap_ns: float | None
    cpu_ops: int  # top-level CPU ops (torch.profiler cpu_op) run inside the step
    cpu_op_ns: int

    @property
    def launches(self) -> int:
        return self.kernel_launches + self.graph_launches

    @property
    def launch_ns(self) -> int:
        return self.kernel_launch_ns + self.graph_launch_ns


# (field or property of StepFigures, title, unit): what a step group reports and compares
STEP_METRICS: tuple[tuple[str, str, str], ...] = (
    ("wall_ns", "step time (CPU)", "ns"),
    ("kernels", "kernels", "count"),
    ("launches", "launch calls", "count"),
    ("kernel_launches", "cudaLaunchKernel* calls", "count"),
    ("graph_launches", "cudaGraphLaunch* calls", "count"),
    ("launch_ns", "launch CPU time", "ns"),
    ("kernel_launch_ns", "cudaLaunchKernel* CPU time", "ns"),
    ("graph_launch_ns", "cudaGraphLaunch* CPU time", "ns"),
    ("gpu_busy_ns", "GPU busy", "ns"),
    ("gpu_idle_ns", "GPU idle", "ns"),
    ("idle_gaps", "GPU idle gaps", "count"),
    ("median_gap_ns", "median idle gap", "ns"),
    ("cpu_ops", "CPU ops", "count"),
    ("cpu_op_ns", "CPU op time", "ns"),
)


def shown(median: float | None) -> bool:
    """A metric is shown where it is not zero, or unknown (never left out as if zero)."""
    return median is None or median != 0


@dataclass
class StepGroup:
    """All steps with one name, and the median of every metric across them (None where a step's
    figure is unknown)."""

    name: str
    steps: list[StepFigures]
    medians: dict[str, float | None] = field(init=False)

    def __post_init__(self) -> None:
        values = {key: [getattr(s, key) for s in self.steps] for key, _, _ in STEP_METRICS}
        self.medians = {key: median(v) for key, v in values.items()}


@dataclass(frozen=True)
class DeviceFigures:
    device: int
    kernels: int
    kernel_ns: int  # sum of kernel durations
    busy_ns: int  # union of kernel intervals (concurrent kernels counted once)
    span_ns: int  # first kernel start to last kernel end


@dataclass(frozen=True)
class RangeFigures:
    """Ranges grouped by `key` (a module kind, or a domain and name). `kernels` and `gpu_ns`:
    kernels launched inside the ranges (nested ranges included) and their summed duration."""

    key: str
    domain: str
    count: int
    total_ns: int
    kernels: int | None  # None: unknown (graph kernels not linked to their launches)
    gpu_ns: int | None
    cpu_ops: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


@dataclass
class TraceReport:
    source: str
    kind: str
    meta: dict[str, str]
    counts: dict[str, int]
    notes: list[str]
    devices: list[DeviceFigures]
    step_groups: list[StepGroup]
    by_kind: list[RangeFigures]  # outermost range of each kind, so nesting is not counted twice
    by_name: list[RangeFigures]  # every (domain, name), most total time first
    steps: list[StepRecord] = field(default_factory=list)  # every step, by start

    @property
    def engine_steps(self) -> bool:
        """Whether a serving engine's markers made (some of) the steps, rather than graphrt's
        own or the profiler's."""
        return any(r.marker.engine not in (GRAPHRT, PROFILER) for r in self.steps)


def unlinked_graph_launches(trace: Trace, kinds: np.ndarray) -> set[int]:
    """The graph launch calls (by index into `trace.api_calls`; `kinds`: each call's Launched code)
    that no kernel is linked to."""
    return set(np.setdiff1d(np.flatnonzero(kinds == Launched.GRAPH), trace.kernels.ints("launch")).tolist())


def _durations(table: Table, rows: list[int] | np.ndarray) -> np.ndarray:
    index = np.asarray(rows, dtype=np.int64)
    return table.ints("end_ns")[index] - table.ints("start_ns")[index]


def _step(trace: Trace, att: Membership, r: int, unlinked: set[int]) -> StepFigures:
    """Step figures of range `r`; `unlinked`: the trace's graph launches without kernels."""
    kernels = att.kernels[r]
    kinds, ns = att.launch_kinds[att.launches[r]], _durations(trace.api_calls, att.launches[r])
    launch_ns = {kind: ns[kinds == kind].tolist() for kind in (Launched.KERNEL, Launched.GRAPH)}
    busy, gaps = busy_and_gaps_of(trace.kernels.ints("start_ns")[kernels], trace.kernels.ints("end_ns")[kernels])
    rng = trace.ranges[r]
    figures = StepFigures(
        name=rng.name, start_ns=rng.start_ns, wall_ns=rng.duration_ns, kernels=len(kernels),
        kernel_launches=len(launch_ns[Launched.KERNEL]), kernel_launch_ns=sum(launch_ns[Launched.KERNEL]),
        graph_launches=len(launch_ns[Launched.GRAPH]), graph_launch_ns=sum(launch_ns[Launched.GRAPH]),
        gpu_busy_ns=busy, gpu_idle_ns=sum(gaps), idle_gaps=len(gaps),
        median_gap_ns=median(gaps) if gaps else 0,
        cpu_ops=len(att.ops[r]), cpu_op_ns=int(_durations(trace.cpu_ops, att.ops[r]).sum()))
    if not (unlinked and launch_ns[Launched.GRAPH]):
        return figures
    # one graph launch of the trace without kernels: those of the others cannot be trusted either
    return dataclasses.replace(figures, **dict.fromkeys(KERNEL_FIGURES))


@dataclass(frozen=True)
class StepRecord:
    """One step of the trace: its figures, its marker, how it ran (eager, graph, piecewise) and
    the group it counts in (graphrt.trace.analysis.markers.Step)."""

    figures: StepFigures
    step: Step
    pid: int
    tid: int

    @property
    def marker(self) -> Marker:
        return self.step.marker

    @property
    def mode(self) -> str:
        return self.step.mode


def _records(trace: Trace, att: Membership, unlinked: set[int]) -> list[StepRecord]:
    """Every step of the trace, by start."""
    pids, tids = trace.ranges.ints("pid"), trace.ranges.ints("tid")
    return [StepRecord(_step(trace, att, s.range, unlinked), s, int(pids[s.range]), int(tids[s.range]))
            for s in att.steps]


def _step_groups(records: list[StepRecord]) -> list[StepGroup]:
    groups: dict[str, list[StepFigures]] = {}
    for record in records:
        groups.setdefault(record.step.group, []).append(record.figures)
    return [StepGroup(name, figures) for name, figures in groups.items()]


def _figures(trace: Trace, att: Membership, key: str, domain: str, members: list[int],
             unlinked: set[int]) -> RangeFigures:
    # kernels unknown around a graph launch where the trace's graph kernels are not linked (_step)
    unknown = bool(unlinked) and any((att.launch_kinds[att.launches[r]] == Launched.GRAPH).any() for r in members)
    kernels = joined(att.kernels[r] for r in members)
    return RangeFigures(
        key=key, domain=domain, count=len(members), total_ns=int(_durations(trace.ranges, members).sum()),
        kernels=None if unknown else len(kernels),
        gpu_ns=None if unknown else int(_durations(trace.kernels, kernels).sum()),
        cpu_ops=sum(len(att.ops[r]) for r in members))


def _by_kind(trace: Trace, att: Membership, unlinked: set[int]) -> list[RangeFigures]:
    """Per module kind, its outermost ranges: a range inside another of the same kind (q_proj
    inside self_attn) is already counted in it."""
    module_kinds = [range_kind(name) for name in trace.ranges.strings("name")]
    outermost: dict[str, list[int]] = defaultdict(list)
    for r, kind in enumerate(module_kinds):
        if kind is None:
            continue
        p = att.parent[r]
        while p is not None and module_kinds[p] != kind:
            p = att.parent[p]
        if p is None:
            outermost[kind].append(r)
    return [_figures(trace, att, kind, "", outermost[kind], unlinked) for kind in KINDS if outermost[kind]]


def _by_name(trace: Trace, att: Membership, unlinked: set[int]) -> list[RangeFigures]:
    named: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r, (domain, name) in enumerate(zip(trace.ranges.strings("domain"), trace.ranges.strings("name"))):
        named[(domain, group_name(name))].append(r)
    return sorted((_figures(trace, att, name, domain, members, unlinked)
                   for (domain, name), members in named.items()), key=lambda f: (-f.total_ns, f.key))


def _devices(trace: Trace) -> list[DeviceFigures]:
    devices, starts, ends = (trace.kernels.ints(c) for c in ("device", "start_ns", "end_ns"))
    figures = []
    for d in np.unique(devices).tolist():
        s, e = starts[devices == d], ends[devices == d]
        figures.append(DeviceFigures(device=d, kernels=len(s), kernel_ns=int((e - s).sum()),
                                     busy_ns=busy_of(s, e), span_ns=int(e.max() - s.min())))
    return figures


def analyze(trace: Trace, att: Membership | None = None) -> TraceReport:
    """Every figure graphrt reports for one trace (`att`: its Membership, if already made)."""
    att = att or Membership.of(trace)
    kinds = att.launch_kinds
    counts = {"ranges": len(trace.ranges), "kernels": len(trace.kernels),
              "api_calls": len(trace.api_calls), "cpu_ops": len(trace.cpu_ops),
              "kernel_launches": int((kinds == Launched.KERNEL).sum()),
              "graph_launches": int((kinds == Launched.GRAPH).sum()),
              "kernels_without_launch": int((trace.kernels.ints("launch") == ABSENT).sum())}
    unlinked = unlinked_graph_launches(trace, kinds)
    counts["graph_launches_without_kernels"] = len(unlinked)
    records = _records(trace, att, unlinked)
    return TraceReport(source=trace.source, kind=trace.kind, meta=dict(trace.meta), counts=counts,
                       notes=_notes(trace, counts, bool(records)), devices=_devices(trace),
                       step_groups=_step_groups(records), by_kind=_by_kind(trace, att, unlinked),
                       by_name=_by_name(trace, att, unlinked), steps=records)


def _notes(trace: Trace, counts: dict[str, int], has_steps: bool) -> list[str]:
    notes = []
    if not trace.kernels:
        what = "NVTX ranges only" if trace.kind == "nsys" else "CPU ops and record_function ranges only"
        notes.append(f"no CUDA kernels in this trace: {what}")
    elif counts["kernels_without_launch"]:
        notes.append(f"{counts['kernels_without_launch']} of {counts['kernels']} kernels match no "
                     "launch call in the trace: they count per device, not per range or step")
    if counts["graph_launches_without_kernels"] and trace.meta.get("cuda_graph_trace") != "Graph":
        notes.append(f"{UNLINKED_GRAPH_KERNELS} ({counts['graph_launches_without_kernels']} of "
                     f"{counts['graph_launches']} graph launch calls have no kernel linked to them)")
    if counts["graph_launches"] and trace.meta.get("cuda_graph_trace") == "Graph":
        notes.append("CUDA graphs were traced whole (--cuda-graph-trace=graph): their kernels are not "
                     "in the trace; record with --cuda-graph-trace=node to see them")
    if not trace.ranges:
        notes.append("no NVTX or record_function ranges in this trace")
    elif not has_steps:
        notes.append(f"no step marker ({MARKERS}): whole-trace figures only")
    return notes + _unread_notes(trace.ranges.strings("name"))


def _unread_notes(names: list[str]) -> list[str]:
    """One line per marker form for the ranges named like it that mark no step (left out of the
    steps, as graphrt.trace.analysis.markers says why): how many, the first, and why."""
    found = unread(names)
    if not found:
        return []
    ranges = Counter(n for n in names if n in {u.name for u in found})
    by_form: dict[str, list] = {}
    for u in found:
        by_form.setdefault(u.expected, []).append(u)
    notes = []
    for expected, named in by_form.items():
        n, others = sum(ranges[u.name] for u in named), len(named) - 1
        more = f" (and {others:,} other name{'s' if others > 1 else ''})" if others else ""
        notes.append(f"{n:,} range{'s' if n > 1 else ''} named like {expected} mark{'' if n > 1 else 's'} no step, "
                     f"left out: `{cut(named[0].name, 80)}` {named[0].why}{more}")
    return notes
