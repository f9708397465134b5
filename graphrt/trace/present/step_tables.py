"""Printing and serialising the per-step launch/idle figures and the module-by-module comparison
of eager and replay (graphrt.trace.analysis.idle, graphrt.trace.analysis.modules)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from graphrt.quantiles import median
from graphrt.trace.analysis.idle import IDLE_KINDS, KERNEL_WAIT_NS, StepLaunchIdle
from graphrt.trace.analysis.modules import ModuleTime, ReplayModules
from graphrt.trace.analysis.names import group_name
from graphrt.trace.present.text_table import cut, table
from graphrt.units import MISSING, format_us


def _groups(steps: Sequence[StepLaunchIdle]) -> dict[str, list[StepLaunchIdle]]:
    groups: dict[str, list[StepLaunchIdle]] = {}
    for s in steps:
        groups.setdefault(group_name(s.step), []).append(s)
    return groups


def format_launch_idle(steps: Sequence[StepLaunchIdle]) -> str:
    """One column per step group: medians over its steps."""
    groups = _groups(steps)
    if not any(s.kernels for s in steps):
        return ""
    rows: list[tuple[str, ...]] = []

    def row(title: str, value) -> None:
        rows.append((title, *(value(g) for g in groups.values())))

    row("launch delay p50 µs", lambda g: format_us(median([s.delay_p50_ns for s in g])))
    row("launch delay p90 µs", lambda g: format_us(median([s.delay_p90_ns for s in g])))
    row("launch CPU time µs", lambda g: format_us(median([s.launch_cpu_ns for s in g])))
    row("kernels per graph launch", lambda g: ", ".join(sorted({str(n) for s in g for n in s.graph_fanout})) or MISSING)
    for kind in IDLE_KINDS:
        row(f"GPU idle: {kind} µs", lambda g, kind=kind: format_us(median([s.idle_ns[kind] for s in g])))
    headers = ["median per step", *(f"{name} ({len(g)} steps)" for name, g in groups.items())]
    return "\n".join([
        f"Launches and GPU idle (kernel_wait: a gap under {KERNEL_WAIT_NS / 1000:g} µs before a kernel "
        "already launched; host_wait: launched only after the GPU ran dry)",
        table(rows, headers=headers)])


def _module_rows(rows: Sequence[ModuleTime], unit: str) -> str:
    what = "kernels" if unit == "kernel" else "ops"
    busy = "GPU" if unit == "kernel" else "op"
    headers = ["", f"eager {what}", f"replay {what}", f"eager {busy} µs", f"replay {busy} µs",
               "eager idle before µs", "replay idle before µs", "eager µs", "replay µs", "removed µs"]
    return table([(r.key, f"{r.eager.work:,.1f}", f"{r.replay.work:,.1f}", format_us(r.eager.busy_ns),
                   format_us(r.replay.busy_ns), format_us(r.eager.gap_ns), format_us(r.replay.gap_ns),
                   format_us(r.eager.total_ns), format_us(r.replay.total_ns), format_us(r.removed_ns)) for r in rows],
                 headers=headers)


def format_replay_modules(found: ReplayModules, top: int = 15) -> str:
    how = found.how
    what = "kernels" if found.unit == "kernel" else "ops"
    against = f" against {cut(found.eager)}" if found.eager_steps else " (no eager step to set it against)"
    # "between" only arises from an alignment; a lookup by graph node finds or does not
    between = f"{how['between']:,} lying inside one module call between matched ones, " if how["between"] else ""
    head = (f"{cut(found.replay)}{against}, module by module (per step): {found.share:.1%} of "
            f"{found.items:,} replayed {what} attributed ({how['matched']:,} by {found.method}, "
            f"{between}{how['unattributed']:,} unattributed)")
    names = found.by_name[:top]
    title = "by module" + (f" (top {top} by eager time of {len(found.by_name)})" if len(found.by_name) > top else "")
    return "\n".join([head, "by module kind", _module_rows(found.by_kind, found.unit), "",
                      title, _module_rows(names, found.unit)])


def _module_dict(r: ModuleTime) -> dict[str, Any]:
    return {"key": r.key, "eager": {**asdict(r.eager), "total_ns": r.eager.total_ns},
            "replay": {**asdict(r.replay), "total_ns": r.replay.total_ns}, "removed_ns": r.removed_ns}


def replay_modules_dict(found: ReplayModules) -> dict[str, Any]:
    return {"eager": found.eager, "replay": found.replay, "unit": found.unit, "method": found.method,
            "items": found.items, "attributed_share": found.share, "how": found.how,
            "eager_steps": found.eager_steps, "replay_steps": found.replay_steps,
            "by_kind": [_module_dict(r) for r in found.by_kind],
            "by_name": [_module_dict(r) for r in found.by_name]}


def launch_idle_dict(steps: Sequence[StepLaunchIdle]) -> dict[str, Any]:
    return {"kernel_wait_threshold_ns": KERNEL_WAIT_NS,
            "per_step": [{**asdict(s), "idle_total_ns": s.idle_total_ns} for s in steps]}
