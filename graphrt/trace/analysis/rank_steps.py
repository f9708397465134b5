"""`graphrt analyze` on what `graphrt trace --tp N` wrote: one directory holding rank0/ ...
rank<N-1>/, each a trace directory of its own.

Per rank and step group: the steps, the median step (CPU wall time), kernels (ops, in a trace
without kernels) and launch calls per step, and the share of a step spent in collectives. Per
step, the slowest rank: a tensor-parallel step is as slow as its slowest rank, since every
all-reduce waits for the last rank to arrive. The i-th step of a group on one rank is set against
the i-th of the same group on every other rank (the ranks run their steps in lockstep).

The share of a step in collectives is graphrt.measure.collective_share's, as `graphrt run --tp` gives it.
In a trace with kernels (CUDA), the GPU time of the NCCL kernels the step launched over the
step's GPU time (first kernel start to last kernel end), eager steps and replays alike. In a
trace without (gloo, on a CPU), CPU time: the union of the step's `... (AllReduce)` module ranges (the
row-parallel linears' sums, graphrt.model.sharding.AllReduce) and its top-level
functional collective ops (`_c10d_functional::all_reduce`, `::wait_tensor`: a replay fires no
module range, but the ops it replays still show), over the step's CPU time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError
from graphrt.measure.collective_share import NAMESPACE, Measure, kernel_time_of, share
from graphrt.measure.intervals import busy_and_gaps
from graphrt.quantiles import median
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.steps import StepGroup
from graphrt.trace.read.events import Trace

_RANK_DIR = re.compile(r"rank(\d+)")
COLLECTIVE_MODULE = " (AllReduce)"  # the range of graphrt.model.sharding.AllReduce, a row-parallel linear's sum
_COLLECTIVE_OP = f"{NAMESPACE}::"


def rank_dirs(path: Path) -> list[Path] | None:
    """rank0/ ... rank<N-1>/ of a directory `graphrt trace --tp N` wrote, by rank; None where
    `path` is not one (no rank<r>/ in it, or traces of its own). GraphrtError, in one line,
    where a rank is missing: a gap in the numbers, or fewer than a rank's summary.json says ran."""
    if not path.is_dir() or any(path.glob("*.sqlite")) or any(
            p.name != "summary.json" for p in path.glob("*.json")):
        return None
    found = {int(m.group(1)): p for p in path.iterdir()
             if p.is_dir() and (m := _RANK_DIR.fullmatch(p.name))}
    if not found:
        return None
    world = max([max(found) + 1, *(_world(p / "summary.json") for p in found.values())])
    missing = [f"rank{r}/" for r in range(world) if r not in found]
    if missing:
        raise GraphrtError(f"{path}: {', '.join(missing)} missing of {world} ranks (graphrt trace --tp "
                           f"{world} writes rank0/ ... rank{world - 1}/)")
    return [found[r] for r in range(world)]


def _world(summary: Path) -> int:
    """How many ranks ran, as the rank's summary.json says (0 where it does not say)."""
    try:
        world = json.loads(summary.read_text()).get("world", 0)
    except (OSError, ValueError, AttributeError):
        return 0  # no summary, or none graphrt wrote: the rank's traces say what is wrong
    return world if isinstance(world, int) else 0


@dataclass(frozen=True)
class CollectiveTime:
    """One step's time in collectives and the step time it is a share of (ns)."""

    collective_ns: int
    step_ns: int
    measure: Measure  # GPU time (NCCL kernels) or CPU time: graphrt.measure.collective_share


def collective_time(trace: Trace, membership: Membership) -> dict[str, list[CollectiveTime | None]]:
    """Per step group, each step's time in collectives (steps in the order they started); None
    for a step of a trace with kernels that launched none."""
    steps = [s.range for s in membership.steps]
    spent = _gpu_time(trace, membership, steps) if trace.kernels else _cpu_time(trace, membership, steps)
    per_group: dict[str, list[CollectiveTime | None]] = {}
    for s in membership.steps:
        per_group.setdefault(s.group, []).append(spent[s.range])
    return per_group


def _gpu_time(trace: Trace, membership: Membership, steps: list[int]) -> dict[int, CollectiveTime | None]:
    names, starts, ends = (trace.kernels.strings("name"), trace.kernels.ints("start_ns"),
                           trace.kernels.ints("end_ns"))
    out: dict[int, CollectiveTime | None] = {}
    for r in steps:
        kernels = membership.kernels[r]
        spent = kernel_time_of([names[i] for i in kernels.tolist()], starts[kernels], ends[kernels])
        out[r] = None if spent is None else CollectiveTime(*spent, "gpu")
    return out


def _cpu_time(trace: Trace, membership: Membership, steps: list[int]) -> dict[int, CollectiveTime | None]:
    ranges, ops = trace.ranges, trace.cpu_ops
    spans: dict[int, list[tuple[int, int]]] = {r: [] for r in steps}  # step range -> its collective spans
    for r, name in enumerate(ranges.strings("name")):
        if name.endswith(COLLECTIVE_MODULE) and (step := _enclosing(membership, r, spans)) is not None:
            spans[step].append((ranges[r].start_ns, ranges[r].end_ns))
    op_names = ops.strings("name")
    for r in steps:
        mine = membership.ops[r]
        spans[r] += [(start, end) for i, start, end in zip(mine.tolist(), ops.ints("start_ns")[mine].tolist(),
                                                           ops.ints("end_ns")[mine].tolist())
                     if op_names[i].startswith(_COLLECTIVE_OP)]
    return {r: CollectiveTime(busy_and_gaps(spans[r])[0], ranges[r].duration_ns, "cpu") for r in steps}


def _enclosing(membership: Membership, r: int, steps: dict[int, Any]) -> int | None:
    p = membership.parent[r]
    while p is not None and p not in steps:
        p = membership.parent[p]
    return p


@dataclass(frozen=True)
class RankGroup:
    """One rank's steps of one group."""

    rank: int
    group: StepGroup
    collectives: list[CollectiveTime | None]  # per step, in the group's order

    @property
    def wall_ns(self) -> list[int]:
        return [s.wall_ns for s in self.group.steps]

    @property
    def shares(self) -> list[float | None]:
        """Each step's share in collectives; None where a step's kernels are unknown (graph
        kernels not linked to their launch) or it has none."""
        return [None if c is None or (c.measure == "gpu" and s.kernels is None)
                else share(c.collective_ns, c.step_ns) for c, s in zip(self.collectives, self.group.steps)]

    @property
    def collective_share(self) -> float | None:
        """The median over steps of each step's share in collectives; None if any is unknown."""
        shares = self.shares
        return median(shares) if shares else None

    @property
    def measure(self) -> Measure | None:
        """What the share is of: GPU or CPU time (None for a group without a known step)."""
        return next((c.measure for c in self.collectives if c is not None), None)

    @property
    def work(self) -> tuple[str, float | None]:
        """('kernels', median per step) in a trace with kernels, else ('ops', top-level CPU ops)."""
        kernels = self.group.medians["kernels"]
        return ("kernels", kernels) if kernels != 0 else ("ops", self.group.medians["cpu_ops"])


@dataclass(frozen=True)
class SlowestStep:
    """The i-th step of a group: the rank that took longest, and by how much over the fastest."""

    index: int
    rank: int
    wall_ns: int
    ahead_ns: int  # its wall time less the fastest rank's


def slowest_steps(groups: list[RankGroup]) -> list[SlowestStep]:
    """Step by step (as far as every rank has steps), the slowest of `groups` (one per rank)."""
    out = []
    for i, walls in enumerate(zip(*(g.wall_ns for g in groups))):
        slow = max(range(len(walls)), key=lambda k: walls[k])
        out.append(SlowestStep(i, groups[slow].rank, walls[slow], walls[slow] - min(walls)))
    return out


def by_group(ranks: list[list[RankGroup]]) -> dict[str, list[RankGroup]]:
    """Every rank's figures (`ranks[r]`: rank r's groups), regrouped by step group, ranks in order."""
    out: dict[str, list[RankGroup]] = {}
    for groups in ranks:
        for g in groups:
            out.setdefault(g.group.name, []).append(g)
    return out
