"""Module by module, what an eager step spends and what its graph replay spends.

    found = replay_modules(timelines)   # timelines: StepTimelines of one or more traces

Each replayed kernel (or op, in a CPU trace) is given the module it belongs to by the best record
there is (graphrt.trace.analysis.attribution): on a CPU, the tape's own record of each op's ranges; on
CUDA, the graph-node annotations of the capture, looked up by each kernel's graph node id; else
the eager step's module stacks, carried over by aligning the two kernel sequences. Then per module
kind and per module name, in both modes, per step (the mean over the group's steps):

- `work`: kernels (ops) issued inside the module;
- `busy_ns`: their summed duration (GPU time; CPU time for ops);
- `gap_ns`: the idle time in front of each of them (from the end of everything before it to
  its start): in eager mode that is where launch overhead shows, a GPU waiting for the host.
  `busy_ns + gap_ns` over all modules is the step's span, first start to last end.

A work item's kind is the kind of the innermost module around it that has one other than
"other" (a q_proj is attention, a decoder layer's own elementwise add is "other"); items issued
in no module are "(no module)", replayed items that could not be attributed "(unattributed)".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from graphrt.measure.range_names import KINDS
from graphrt.trace.analysis.attribution import Attribution, carry_over, look_up
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.analysis.steps import range_kind
from graphrt.trace.analysis.timeline import StepTimeline

EAGER_STEP = "decode_step[eager]"
NO_MODULE = "(no module)"
UNATTRIBUTED_KIND = "(unattributed)"
KIND_ORDER = (*KINDS, NO_MODULE, UNATTRIBUTED_KIND)


def work_kind(stack: tuple[str, ...] | None) -> str:
    """The kind a work item counts under (see the module docstring)."""
    if stack is None:
        return UNATTRIBUTED_KIND
    kinds = [range_kind(name) for name in stack]
    for kind in reversed(kinds):
        if kind is not None and kind != "other":
            return kind
    return "other" if any(k is not None for k in kinds) else NO_MODULE


@dataclass
class Side:
    """One mode's figures for a module, per step."""

    work: float = 0.0
    busy_ns: float = 0.0
    gap_ns: float = 0.0

    @property
    def total_ns(self) -> float:
        return self.busy_ns + self.gap_ns

    def add(self, busy_ns: int, gap_ns: int) -> None:
        self.work += 1
        self.busy_ns += busy_ns
        self.gap_ns += gap_ns

    def per_step(self, steps: int) -> None:
        """From totals over `steps` steps to the mean per step."""
        self.work, self.busy_ns, self.gap_ns = (x / steps for x in (self.work, self.busy_ns, self.gap_ns))


@dataclass
class ModuleTime:
    """One module kind or module name, in both modes (per step: the mean over the steps)."""

    key: str
    eager: Side = field(default_factory=Side)
    replay: Side = field(default_factory=Side)

    @property
    def removed_ns(self) -> float:
        return self.eager.total_ns - self.replay.total_ns


@dataclass
class ReplayModules:
    eager: str  # the eager step group's label
    replay: str
    unit: str  # "kernel" or "op"
    method: str
    items: int  # work items of the first replayed step
    how: dict[str, int]  # of those, by how they were attributed (graphrt.trace.analysis.attribution)
    eager_steps: int  # how many eager steps the eager figures are the mean of (0: none)
    replay_steps: int
    by_kind: list[ModuleTime] = field(default_factory=list)
    by_name: list[ModuleTime] = field(default_factory=list)

    @property
    def share(self) -> float:
        return 1 - self.how.get("unattributed", 0) / self.items if self.items else 1.0


def idle_before(step: StepTimeline) -> list[int]:
    """Per work item, the idle time in front of it: from the latest end of everything before it
    to its start (0 for the first, and for one that overlaps what came before)."""
    gaps, busy_until = [], None
    for w in step.work:
        gaps.append(0 if busy_until is None else max(0, w.start_ns - busy_until))
        busy_until = w.end_ns if busy_until is None else max(busy_until, w.end_ns)
    return gaps


def _accumulate(steps: Sequence[StepTimeline], stacks_of: list[list[tuple[str, ...] | None]],
                kinds: dict[str, ModuleTime], names: dict[str, ModuleTime], mode: str) -> None:
    for step, stacks in zip(steps, stacks_of):
        for w, gap, stack in zip(step.work, idle_before(step), stacks):
            for row in [kinds[work_kind(stack)], *(names[n] for n in dict.fromkeys(stack or ()))]:
                getattr(row, mode).add(w.duration_ns, gap)
    for row in [*kinds.values(), *names.values()]:
        getattr(row, mode).per_step(len(steps))


@dataclass(frozen=True)
class Reference:
    """What replayed work is attributed from: a sequence of names, each with the ranges it was
    issued in and the module call it lies in (graphrt.trace.analysis.attribution.carry_over)."""

    names: list[str]
    stacks: list[tuple[str, ...]]
    calls: list[object]
    method: str

    @classmethod
    def of_eager(cls, step: StepTimeline) -> Reference:
        what = "kernel" if step.unit == "kernel" else "op"
        return cls(step.names, [w.stack for w in step.work], [w.home for w in step.work],
                   f"{what} names aligned with the eager step's (longest common subsequence)")

    @classmethod
    def of_capture(cls, entries: Sequence[tuple[str, Sequence[str]]]) -> Reference:
        """From a TapeGraph's own records: per entry, its op name and the ranges open at capture."""
        stacks = [tuple(stack) for _, stack in entries]
        return cls([name for name, _ in entries], stacks, list(stacks),
                   "the capture's own records of each op's ranges (TapeGraph.op_ranges)")

    def attribute(self, steps: Sequence[StepTimeline]) -> list[Attribution]:
        done: dict[tuple[str, ...], Attribution] = {}  # replays of one graph repeat one sequence
        for step in steps:
            key = tuple(step.names)
            if key not in done:
                done[key] = carry_over(self.names, self.stacks, self.calls, step.names)
        return [done[tuple(step.names)] for step in steps]


@dataclass(frozen=True)
class NodeLookup:
    """Replayed kernels attributed by their graph node id, from the ranges the capture recorded
    per node (CudaGraph.node_ranges): exact, and a kernel whose node it lacks is unattributed."""

    nodes: Mapping[int, tuple[str, ...]]
    method: str = "the capture's graph-node annotations, looked up by each kernel's graph node id"

    def knows(self, step: StepTimeline) -> bool:
        """Does it hold the node of any of `step`'s kernels (is it this graph's)?"""
        return any(w.node in self.nodes for w in step.work)

    def attribute(self, steps: Sequence[StepTimeline]) -> list[Attribution]:
        return [look_up(self.nodes, [w.node for w in step.work]) for step in steps]


def compare_modules(eager: Sequence[StepTimeline], replay: Sequence[StepTimeline],
                    eager_label: str, replay_label: str,
                    reference: Reference | NodeLookup | None = None) -> ReplayModules:
    """The replayed steps' work attributed from `reference` (by default the first eager step),
    and both modes' time per module kind and module name (eager's zero without eager steps)."""
    reference = reference or Reference.of_eager(eager[0])
    attributions = reference.attribute(replay)
    kinds: dict[str, ModuleTime] = {k: ModuleTime(k) for k in KIND_ORDER}
    names: dict[str, ModuleTime] = defaultdict(lambda: ModuleTime(""))
    if eager:
        _accumulate(eager, [[w.stack for w in s.work] for s in eager], kinds, names, "eager")
    _accumulate(replay, [a.stacks for a in attributions], kinds, names, "replay")
    for key, row in names.items():
        row.key = key
    return ReplayModules(
        eager=eager_label, replay=replay_label, unit=replay[0].unit, method=reference.method,
        items=len(replay[0].work), how=attributions[0].counts(), eager_steps=len(eager), replay_steps=len(replay),
        by_kind=[row for row in kinds.values() if row.eager.work or row.replay.work],
        by_name=sorted(names.values(), key=lambda r: (-r.eager.total_ns, -r.replay.total_ns, r.key)))


@dataclass(frozen=True)
class CaptureRecords:
    """What one trace's captures recorded of their ranges, by the replay step that replays them
    (`graphrt trace` keeps it in summary.json beside the trace)."""

    ops: Mapping[str, Sequence[tuple[str, Sequence[str]]]] = field(default_factory=dict)  # TapeGraph: per entry
    nodes: Mapping[str, Mapping[int, tuple[str, ...]]] = field(default_factory=dict)  # CUDA graph: per node

    def reference(self, step: StepTimeline) -> Reference | NodeLookup | None:
        """The record that attributes `step`'s work, if any: for kernels, node annotations that
        hold its kernels' nodes; for ops, the tape's per-entry records."""
        if step.unit == "kernel":
            lookup = NodeLookup(self.nodes[step.group]) if step.group in self.nodes else None
            return lookup if lookup is not None and lookup.knows(step) else None
        entries = self.ops.get(step.group)
        return Reference.of_capture(entries) if entries else None


def replay_modules(labelled: Sequence[tuple[str, Sequence[StepTimeline]]],
                   captured: Sequence[CaptureRecords] = ()) -> list[ReplayModules]:
    """For every replay step group in the traces (label, timelines), set against the first
    `decode_step[eager]` group with the same unit of work (a compiled or piecewise step fires
    no module range for all of its work, so it cannot stand in for eager). A replay whose capture
    left records of its own (`captured[i]` for trace i) is attributed from those, exactly; the
    others by aligning them with the eager step, and not at all without one."""
    groups: dict[tuple[int, str], list[StepTimeline]] = {}
    for n, (_, timelines) in enumerate(labelled):
        for t in timelines:
            groups.setdefault((n, t.group), []).append(t)
    eager = [(key, steps) for key, steps in groups.items() if key[1] == EAGER_STEP]
    found = []
    for (n, group), steps in groups.items():
        if not is_replay(group) or not steps[0].work:
            continue
        matching = [(k, s) for k, s in eager if s[0].unit == steps[0].unit and s[0].work]
        records = captured[n].reference(steps[0]) if n < len(captured) else None
        if not matching and not records:
            continue
        if matching:
            (m, eager_group), eager_steps = matching[0]
            eager_label = _label(labelled[m][0], eager_group)
        else:
            eager_steps, eager_label = [], "no eager step"
        found.append(compare_modules(eager_steps, steps, eager_label, _label(labelled[n][0], group), records))
    return found


def _label(trace_label: str, group: str) -> str:
    return f"{trace_label}: {group}" if trace_label else group
