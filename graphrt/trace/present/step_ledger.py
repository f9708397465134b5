"""Printing and serialising a trace's steps one by one, its ledger (steps by phase, mode and
batch) and the decode steps that fell back to eager (graphrt.trace.analysis.ledger)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphrt.trace.analysis.file_analysis import TraceStep
from graphrt.trace.analysis.idle import IDLE_KINDS
from graphrt.trace.analysis.ledger import Fallback, LedgerRow, ledger, step_markers
from graphrt.trace.analysis.steps import TraceReport
from graphrt.trace.present.text_table import cut, table
from graphrt.units import MISSING, format_count, format_us

MARKER_WIDTH = 48  # a marker's name is cut to this in the step table (whole in --json)


def _batch(batch: int | None) -> str:
    """A step's batch as its marker states it; one it does not state is a figure not known, said
    as every table says one."""
    return MISSING if batch is None else str(batch)


def _steps(n: int, what: str = "step") -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _batches(counts: dict[int | None, int]) -> str:
    return ", ".join(f"{_batch(b)}: {_steps(n)}" for b, n in counts.items())


def format_markers(report: TraceReport) -> str:
    """Which markers made the steps: `12 steps, marked by SGLang step[...]`."""
    made = step_markers(report.steps)
    return f"{_steps(len(report.steps))}, marked by " + "; ".join(
        form if len(made) == 1 else f"{form} ({n:,})" for form, n in made.items())


def format_ledger(rows: list[LedgerRow]) -> str:
    return "\n".join([
        "Steps by phase, mode and batch (median per step; batch: requests the marker states, "
        f"{MISSING} where it does not)",
        table([(r.phase, r.mode, _batch(r.batch), f"{r.steps:,}", format_us(r.wall_ns), format_us(r.gpu_busy_ns),
                format_count(r.kernels), format_count(r.kernel_launches), format_count(r.graph_launches))
               for r in rows],
              headers=["phase", "mode", "batch", "steps", "step µs (CPU)", "GPU busy µs", "kernels",
                       "kernel launches", "graph launches"])])


def format_fallback(found: Fallback | None) -> str | None:
    """The line naming the decode steps that ran eagerly while others replayed, or None."""
    if found is None:
        return None
    return (f"silent fallback: {_steps(len(found.eager), 'decode step')} ran eagerly (batch "
            f"{_batches(found.eager_batches)}) while {_steps(len(found.replayed), 'decode step')} replayed a graph "
            f"(batch {_batches(found.replayed_batches)})")


def _piece_share(step: TraceStep) -> str:
    if step.between is None:
        return MISSING
    busy = step.record.figures.gpu_busy_ns
    share = f", {step.between.gpu_ns / busy:.0%} of GPU busy" if busy else ""
    return f"{step.between.kernels:,} kernels{share}"


def format_steps(steps: Sequence[TraceStep], limit: int) -> str:
    """One row per step, the first `limit` of them."""
    if not steps:
        return ""
    origin = steps[0].record.figures.start_ns
    rows = []
    for i, s in enumerate(steps[:limit]):
        f, li = s.record.figures, s.launch_idle
        idle = [format_us(li.idle_ns[k]) if li else MISSING for k in IDLE_KINDS]
        rows.append((i, f"{(f.start_ns - origin) / 1e6:,.3f}", cut(f.name, MARKER_WIDTH), s.record.marker.phase,
                     _batch(s.record.marker.requests), s.record.mode, format_us(f.wall_ns),
                     format_count(f.graph_launches), format_count(f.kernel_launches), format_count(f.kernels),
                     format_us(f.launch_ns), format_us(f.gpu_busy_ns), *idle, _piece_share(s)))
    more = f" (the first {limit} of {len(steps):,}; every step is in --json)" if len(steps) > limit else ""
    return "\n".join([
        f"Step by step{more}; GPU idle between its kernels: host wait (launched after the GPU ran dry), "
        "kernel wait (back to back), other",
        table(rows, headers=["step", "start ms", "marker", "phase", "batch", "mode", "step µs", "graph launches",
                             "kernel launches", "kernels", "launch CPU µs", "GPU busy µs",
                             *(f"{k.replace('_', ' ')} µs" for k in IDLE_KINDS), "eager between pieces"])])


def format_engine_steps(report: TraceReport, steps: Sequence[TraceStep], found: Fallback | None, limit: int) -> str:
    """What `graphrt analyze` prints of a trace an engine's markers split into steps: which
    markers, the fallback line where there is one, the ledger, the steps one by one."""
    out = [format_markers(report)]
    if line := format_fallback(found):
        out.append(line)
    out += ["", format_ledger(ledger(report.steps))]
    if limit:
        out += ["", format_steps(steps, limit)]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# JSON


def ledger_dict(rows: list[LedgerRow]) -> list[dict[str, Any]]:
    return [{"phase": r.phase, "mode": r.mode, "batch": r.batch, "steps": r.steps, "median_wall_ns": r.wall_ns,
             "median_gpu_busy_ns": r.gpu_busy_ns, "median_kernels": r.kernels,
             "median_kernel_launches": r.kernel_launches, "median_graph_launches": r.graph_launches,
             "markers": list(r.markers)} for r in rows]


def steps_dict(steps: Sequence[TraceStep]) -> list[dict[str, Any]]:
    """One object per step, by start (times in ns; None where the trace cannot say)."""
    out = []
    for s in steps:
        f, m, li = s.record.figures, s.record.marker, s.launch_idle
        out.append({
            "name": f.name, "marker": m.form, "engine": m.engine, "start_ns": f.start_ns, "dur_ns": f.wall_ns,
            "pid": s.record.pid, "tid": s.record.tid, "phase": m.phase, "batch": m.requests, "tokens": m.tokens,
            "padded_to": m.padded_to, "mode": s.record.mode, "graph_launches": f.graph_launches,
            "kernel_launches": f.kernel_launches, "kernels": f.kernels, "launch_cpu_ns": f.launch_ns,
            "gpu_busy_ns": f.gpu_busy_ns, "gpu_idle_ns": f.gpu_idle_ns,
            "idle_ns": dict(li.idle_ns) if li else None,
            "eager_between_pieces": None if s.between is None else {
                "kernels": s.between.kernels, "gpu_ns": s.between.gpu_ns,
                "share_of_gpu_busy": s.between.gpu_ns / f.gpu_busy_ns if f.gpu_busy_ns else None}})
    return out


def fallback_dict(found: Fallback | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"eager_steps": len(found.eager), "replayed_steps": len(found.replayed),
            "eager_batches": [{"batch": b, "steps": n} for b, n in found.eager_batches.items()],
            "replayed_batches": [{"batch": b, "steps": n} for b, n in found.replayed_batches.items()],
            "eager_step_starts_ns": [r.figures.start_ns for r in found.eager]}
