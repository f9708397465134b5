"""Launches and GPU idle time, step by step, for any trace with kernels: graphrt's own or any
other torch.profiler / Nsight Systems trace (steps are `ProfilerStep#N` there).

Per step:

- **launch delay**: for each launch call, its first kernel's start minus the end of the call
  (negative where the GPU started the kernel before the call returned). A `cudaGraphLaunch` is
  one host launch however many kernels it fans out to, so it has one delay, the first node's;
  counting a delay per replayed kernel would make the later nodes look launched late.
- **launch CPU time**: the summed duration of the launch calls.
- **GPU idle**, split as Holistic Trace Analysis does, but right for graphs. Idle time is the gaps
  between the step's kernels (their union on the GPU); the gap before a kernel is
  - `host_wait` when the call that launched the kernel began only after the GPU had run out of
    work: the GPU waited on the host;
  - `kernel_wait` when the kernel was already launched and the gap is under `KERNEL_WAIT_NS`:
    back-to-back kernels, the device's own scheduling latency;
  - `other` for the rest (an event wait, a dependency on another stream, a host sync...).
  Every node of a replayed graph shares the one `cudaGraphLaunch`, which began before the graph's
  first kernel: the gaps inside a graph are never host waits, only the one before its first node
  can be.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphrt import quantiles
from graphrt.trace.analysis.timeline import StepTimeline
from graphrt.trace.read.columns import ABSENT

# Gaps under this between a kernel and the next one already launched count as back-to-back
# (`kernel_wait`). A kernel boundary on one stream costs the GPU about 1-3 µs on recent parts.
KERNEL_WAIT_NS = 3_000

IDLE_KINDS = ("host_wait", "kernel_wait", "other")


def percentile(values: list[int], q: int) -> float | None:
    """The q-th percentile of a step's launch delays (graphrt.quantiles.percentile, as the run
    tables compute theirs), as a float; None for a step with no delay to take it of."""
    return float(quantiles.percentile(values, q)) if values else None


@dataclass(frozen=True)
class StepLaunchIdle:
    step: str
    start_ns: int
    kernels: int
    kernel_launches: int
    graph_launches: int
    launch_cpu_ns: int
    delay_p50_ns: float | None
    delay_p90_ns: float | None
    graph_fanout: list[int]  # kernels of each graph launch, in order
    idle_ns: dict[str, int] = field(default_factory=dict)  # IDLE_KINDS -> ns

    @property
    def idle_total_ns(self) -> int:
        return sum(self.idle_ns.values())


def launch_delays(timeline: StepTimeline) -> list[int]:
    """Per launch call that ran a kernel: its first kernel's start minus the call's end."""
    launch = timeline.work.ints("launch")
    has = launch != ABSENT
    calls, first = np.unique(launch[has], return_index=True)  # each call, and its first work item (by start)
    return (timeline.work.ints("start_ns")[has][first] - timeline.launches.ints("end_ns")[calls]).tolist()


def idle_split(timeline: StepTimeline, kernel_wait_ns: int = KERNEL_WAIT_NS) -> dict[str, int]:
    """The gaps between the step's kernels, by cause (see the module docstring)."""
    starts, ends, launch = timeline.work.ints("start_ns"), timeline.work.ints("end_ns"), timeline.work.ints("launch")
    if len(starts) < 2:
        return dict.fromkeys(IDLE_KINDS, 0)
    busy_until = np.maximum.accumulate(ends)[:-1]  # before each item after the first: the latest end so far
    starts, launch = starts[1:], launch[1:]
    gap = np.where(starts > busy_until, starts - busy_until, 0)
    launched_at = np.where(launch != ABSENT, timeline.launches.ints("start_ns")[np.maximum(launch, 0)]
                           if len(timeline.launches) else 0, ABSENT)
    host = (launch != ABSENT) & (launched_at > busy_until)
    kernel = ~host & (gap < kernel_wait_ns)
    return {"host_wait": int(gap[host].sum()), "kernel_wait": int(gap[kernel].sum()),
            "other": int(gap[~host & ~kernel].sum())}


def step_launch_idle(timeline: StepTimeline, kernel_wait_ns: int = KERNEL_WAIT_NS) -> StepLaunchIdle:
    delays = launch_delays(timeline)
    kinds = timeline.launches.strings("kind")
    launch = timeline.work.ints("launch")
    per_call = np.bincount(launch[launch != ABSENT], minlength=len(kinds))
    starts, ends = timeline.launches.ints("start_ns"), timeline.launches.ints("end_ns")
    return StepLaunchIdle(
        step=timeline.name, start_ns=timeline.start_ns,
        kernels=len(timeline.work) if timeline.unit == "kernel" else 0,
        kernel_launches=kinds.count("kernel"), graph_launches=kinds.count("graph"),
        launch_cpu_ns=int((ends - starts).sum()),
        delay_p50_ns=percentile(delays, 50), delay_p90_ns=percentile(delays, 90),
        graph_fanout=[int(per_call[n]) for n, kind in enumerate(kinds) if kind == "graph"],
        idle_ns=idle_split(timeline, kernel_wait_ns) if timeline.unit == "kernel" else dict.fromkeys(IDLE_KINDS, 0))


@dataclass(frozen=True)
class BetweenPieces:
    """What a piecewise step ran eagerly between its pieces: the kernels launched on their own
    after its first graph launch began and before its last one began (attention, cache writes),
    and their summed GPU time."""

    kernels: int
    gpu_ns: int


def between_pieces(timeline: StepTimeline) -> BetweenPieces | None:
    """None for a step with fewer than two graph launches (no pieces to be between)."""
    kinds, starts = timeline.launches.strings("kind"), timeline.launches.ints("start_ns")
    graphs = [start for kind, start in zip(kinds, starts.tolist()) if kind == "graph"]
    if len(graphs) < 2:
        return None
    launch = timeline.work.ints("launch")
    by_kernel_call = np.array([kind == "kernel" for kind in kinds] + [False])  # the last: no call
    call = np.where(launch != ABSENT, launch, len(kinds))
    called_at = np.append(starts, 0)[call]
    inside = by_kernel_call[call] & (graphs[0] < called_at) & (called_at < graphs[-1])
    work = timeline.work
    return BetweenPieces(int(inside.sum()), int((work.ints("end_ns") - work.ints("start_ns"))[inside].sum()))
