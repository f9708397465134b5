"""A picture of one step: an eager step above a replayed one, on the same time axis.

Each step gets two rows: the host (its launch calls; graph launches in the replay colour) and the
GPU (its kernels, coloured by module kind with graphrt's NVTX colours, the idle gaps between them
shaded). In a trace without kernels (torch.profiler on a CPU) the second row holds the step's
top-level CPU ops instead. Replayed kernels take their kind from the best record there is, as
`graphrt analyze` attributes them (graphrt.trace.analysis.modules). Times are from each step's own start,
so the two line up.

matplotlib is an optional dependency (`pip install graphrt[plot]`); only this module needs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from graphrt.errors import GraphrtError
from graphrt.measure.range_names import KIND_COLORS, STEP_COLORS
from graphrt.trace.analysis.modules import (NO_MODULE, UNATTRIBUTED_KIND, CaptureRecords, Reference,
                                            idle_before, work_kind)
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.analysis.timeline import StepTimeline

_EXTRA_COLORS = {NO_MODULE: "#c7c7c7", UNATTRIBUTED_KIND: "#000000"}
_IDLE_COLOR = "#f4cccc"
_WIDTH_IN, _DPI = 14, 110
# Every op is drawn at least this many pixels wide, as a timeline viewer draws it: a step stretched
# by a stall (a preempted host, a slow first launch) would otherwise shrink its short ops below a
# pixel, and antialiasing would blend their colour away.
_MIN_PX = 3


def _rgb(argb: int) -> str:
    return f"#{argb & 0xFFFFFF:06x}"


def _color(kind: str) -> str:
    return _rgb(KIND_COLORS[kind]) if kind in KIND_COLORS else _EXTRA_COLORS[kind]


def pick_steps(timelines: Sequence[Sequence[StepTimeline]]) -> list[StepTimeline]:
    """An eager step and a replayed one where the traces hold both (the second of each group
    where there is one: the first can carry warmup effects), else the first two steps."""
    steps = [t for ts in timelines for t in ts if t.work]

    def first_of(wanted) -> StepTimeline | None:
        found = [t for t in steps if wanted(t.name)]
        return found[1] if len(found) > 1 else (found[0] if found else None)

    eager = first_of(lambda n: not is_replay(n))
    replay = first_of(is_replay)
    if eager and replay:
        return [eager, replay]
    return steps[:2]


def _kinds(step: StepTimeline, eager: StepTimeline | None, records: CaptureRecords) -> list[str]:
    """Each piece of work's module kind; a replayed step's from the best record there is, as
    `graphrt analyze` attributes it (graphrt.trace.analysis.modules)."""
    if is_replay(step.name):
        reference = records.reference(step) or (Reference.of_eager(eager) if eager is not None else None)
        if reference is not None:
            return [work_kind(s) for s in reference.attribute([step])[0].stacks]
    return [work_kind(w.stack) for w in step.work]


def _span_ns(step: StepTimeline) -> int:
    return max(w.end_ns for w in step.work) - min(w.start_ns for w in step.work)


def _figures(step: StepTimeline, scale: float, unit: str) -> str:
    span = _span_ns(step)
    what = "kernels" if step.unit == "kernel" else "ops"
    launches = f", {len(step.launches):,} launch calls" if step.launches or step.unit == "kernel" else ""
    idle = 100 * sum(idle_before(step)) / span if span else 0
    return f"{step.name}: {len(step.work):,} {what}{launches}, {span / scale:,.1f} {unit} first→last, {idle:.0f}% idle"


def _headline(steps: list[StepTimeline], scale: float, unit: str) -> str:
    """eager 1.2 ms → replay 0.4 ms (−67%), where the steps are one of each."""
    if len(steps) != 2 or not is_replay(steps[1].name) or is_replay(steps[0].name):
        return ""
    before, after = _span_ns(steps[0]), _span_ns(steps[1])
    change = f" ({(after - before) / before:+.0%})" if before else ""
    return f": eager {before / scale:,.1f} {unit} → replay {after / scale:,.1f} {unit}{change}"


def _kinds_of(steps: list[StepTimeline], timelines: Sequence[Sequence[StepTimeline]],
              records: Sequence[CaptureRecords]) -> list[list[str]]:
    """Each step's work's module kinds; a replay's from its trace's records (`records[i]`: trace
    i's), else from the eager step among `steps`."""
    eager = next((s for s in steps if not is_replay(s.name)), None)
    trace_of = {id(t): n for n, ts in enumerate(timelines) for t in ts}
    return [_kinds(step, eager, records[n] if (n := trace_of[id(step)]) < len(records) else CaptureRecords())
            for step in steps]


def plot_steps(timelines: Sequence[Sequence[StepTimeline]], sources: Sequence[str], path: str | Path,
               records: Sequence[CaptureRecords] = ()) -> str:
    """Draw the steps `pick_steps` chooses into a PNG at `path` (through a temporary name);
    returns a line saying what was written. `records[i]`: what trace i's captures recorded (a
    replay's kinds come from there first). GraphrtError without matplotlib or steps."""
    steps = pick_steps(timelines)
    if not steps:
        raise GraphrtError(f"{', '.join(sources)}: no step with kernels or CPU ops to plot "
                           "(expected decode_step[...], replay[...] or ProfilerStep#N ranges)")
    _draw(steps, _kinds_of(steps, timelines, records), [""] * len(steps),
          lambda scale, unit: " · ".join(Path(s).name for s in sources) + _headline(steps, scale, unit), path)
    return f"wrote {path} ({' above '.join(s.name for s in steps)})"


def plot_rank_steps(timelines: Sequence[Sequence[Sequence[StepTimeline]]],
                    records: Sequence[Sequence[CaptureRecords]], source: str, path: str | Path) -> str:
    """Each rank's steps as `plot_steps` picks them (its eager step above its replay), rank
    after rank on one time axis: `timelines[r]` and `records[r]` are rank r's traces'."""
    steps, kinds, labels = [], [], []
    for rank, (mine, recorded) in enumerate(zip(timelines, records)):
        picked = pick_steps(mine)
        if not picked:
            raise GraphrtError(f"{source}: rank {rank} has no step with kernels or CPU ops to plot "
                               "(expected decode_step[...], replay[...] or ProfilerStep#N ranges)")
        steps += picked
        kinds += _kinds_of(picked, mine, recorded)
        labels += [f"rank {rank} · "] * len(picked)
    _draw(steps, kinds, labels, lambda scale, unit: f"{Path(source).name}: {len(timelines)} ranks", path)
    return f"wrote {path} (per rank, {' above '.join(s.name for s in pick_steps(timelines[0]))})"


def _draw(steps: list[StepTimeline], kinds: list[list[str]], labels: list[str],
          title: Callable[[float, str], str], path: str | Path) -> None:
    """One panel per step, top to bottom, titled `labels[i]` and its figures; `kinds[i]`: the
    module kind of each of step i's work; `title(scale, unit)`: the figure's title."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise GraphrtError("--plot needs matplotlib: pip install matplotlib (or graphrt[plot])") from None
    longest = max(_span_ns(s) for s in steps)
    scale, unit = (1e6, "ms") if longest > 20e6 else (1e3, "µs")
    fig, axes = plt.subplots(len(steps), 1, figsize=(_WIDTH_IN, 1.9 * len(steps) + 1.2), sharex=True, squeeze=False)
    min_width = _MIN_PX * longest / scale / (_WIDTH_IN * _DPI)  # in the x axis' units
    used: set[str] = set()
    for ax, step, step_kinds, label in zip(axes[:, 0], steps, kinds, labels):
        t0 = min(step.start_ns, *(w.start_ns for w in step.work))
        at = lambda t: (t - t0) / scale  # noqa: E731
        rows = ["GPU kernels" if step.unit == "kernel" else "CPU ops"]
        if step.launches or step.unit == "kernel":  # a CPU trace has no launches: its ops are the host
            rows.append("host launches")
            ax.broken_barh([(at(c.start_ns), (c.end_ns - c.start_ns) / scale) for c in step.launches], (1.1, 0.8),
                           facecolors=[_rgb(STEP_COLORS["replay"]) if c.kind == "graph" else "#555555"
                                       for c in step.launches])
        used.update(step_kinds)
        ax.broken_barh([(at(w.start_ns), max(w.duration_ns / scale, min_width)) for w in step.work], (0.1, 0.8),
                       facecolors=[_color(k) for k in step_kinds], linewidth=0)
        gaps = [(at(w.start_ns - gap), gap / scale) for w, gap in zip(step.work, idle_before(step)) if gap]
        ax.broken_barh(gaps, (0.1, 0.8), facecolors=_IDLE_COLOR, zorder=0)  # idle, shaded in the work row
        ax.set_yticks([0.5 + i for i in range(len(rows))], rows)
        ax.set_ylim(0, len(rows))
        ax.set_title(label + _figures(step, scale, unit), fontsize=10, loc="left")
    axes[-1, 0].set_xlabel(f"{unit} from the step's start")
    order = [k for k in (*KIND_COLORS, NO_MODULE, UNATTRIBUTED_KIND) if k in used]
    idle = "GPU idle" if any(s.unit == "kernel" for s in steps) else "idle"
    handles = [Patch(color=_color(k), label=k) for k in order] + [Patch(color=_IDLE_COLOR, label=idle)]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.suptitle(title(scale, unit), fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=_DPI)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
