"""Printing and serialising what `graphrt.trace.analysis.steps` found: tabulate tables and JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from graphrt.trace.analysis.comparisons import Comparison
from graphrt.trace.analysis.steps import STEP_METRICS, RangeFigures, TraceReport, shown
from graphrt.trace.present.text_table import cut, table
from graphrt.units import MISSING, format_count, format_us
from graphrt.vocab import UNKNOWN  # a figure the trace cannot say (steps.UNLINKED_GRAPH_KERNELS)

_UNIT_FORMAT = {"ns": format_us, "count": format_count}
_METRIC_UNITS = {key: unit for key, _, unit in STEP_METRICS}


def _metric(unit: str, value: float | None) -> str:
    return UNKNOWN if value is None else _UNIT_FORMAT[unit](value)


def _titled(title: str, unit: str) -> str:
    return f"{title} µs" if unit == "ns" else title


def _describe(report: TraceReport) -> str:
    if report.kind == "nsys":
        meta = report.meta
        made = f"Nsight Systems {meta.get('nsys_version', '?')}, export schema {meta.get('schema', '?')}"
    else:
        made = "torch.profiler Chrome trace"
    c = report.counts
    parts = [f"{c['ranges']:,} ranges", f"{c['kernels']:,} kernels",
             f"{c['kernel_launches']:,} kernel launch calls", f"{c['graph_launches']:,} graph launch calls"]
    if c["cpu_ops"]:
        parts.append(f"{c['cpu_ops']:,} CPU ops")
    return f"== {report.source} ({made})\n" + ", ".join(parts)


def format_report(report: TraceReport, top: int = 15, steps: str = "") -> str:
    """The report as text: a header, notes, `steps` (what an engine's steps were, where its
    markers made them: graphrt.trace.present.step_ledger), then one table per kind of figure."""
    out = [_describe(report), *report.notes, *(["", steps] if steps else [])]
    if report.devices:
        out += ["", "Kernels per device", table(
            [(d.device, format_count(d.kernels), format_us(d.kernel_ns), format_us(d.busy_ns), format_us(d.span_ns))
             for d in report.devices],
            headers=["device", "kernels", "kernel time µs", "busy µs", "first→last µs"])]
    if report.step_groups and not report.engine_steps:  # an engine's steps are in `steps`, by row
        # one column per step group, one row per metric that is not zero everywhere
        rows = [(_titled(title, unit), *(_metric(unit, g.medians[key]) for g in report.step_groups))
                for key, title, unit in STEP_METRICS
                if any(shown(g.medians[key]) for g in report.step_groups)]
        headers = ["median per step", *(f"{g.name} ({len(g.steps)} steps)" for g in report.step_groups)]
        out += ["", "Decode steps", table(rows, headers=headers)]
    with_ops = any(f.cpu_ops for f in report.by_name)

    def range_rows(rows: list[RangeFigures], first: str, domain: bool) -> str:
        headers = [first, *(["domain"] if domain else []), "ranges", "total µs", "mean µs",
                   "kernels", "GPU µs", *(["CPU ops"] if with_ops else [])]
        return table([(f.key, *([f.domain] if domain else []), f.count, format_us(f.total_ns),
                       format_us(f.mean_ns), _metric("count", f.kernels), _metric("ns", f.gpu_ns), *([f.cpu_ops] if with_ops else []))
                      for f in rows], headers=headers)

    if any(f.key != "other" for f in report.by_kind):  # only "other": no module ranges to sort
        out += ["", "Ranges by module kind (outermost range of each kind)",
                range_rows(report.by_kind, "kind", domain=False)]
    if report.by_name:
        title = "Ranges by name"
        if len(report.by_name) > top:
            title += f" (top {top} by total time of {len(report.by_name)})"
        out += ["", title, range_rows(report.by_name[:top], "range",
                                      domain=any(f.domain for f in report.by_name))]
    return "\n".join(out)


def format_comparison(comparison: Comparison) -> str:
    rows = []
    for key, title, a, b in comparison.rows:
        unit = _METRIC_UNITS[key]
        removed = None if a is None or b is None else a - b
        share = f"{removed / a:.0%}" if removed is not None and a else MISSING
        rows.append((_titled(title, unit), _metric(unit, a), _metric(unit, b), _metric(unit, removed), share))
    return "\n".join([f"{cut(comparison.other)} against {cut(comparison.baseline)} (median per step)",
                      table(rows, headers=[
                          "", comparison.baseline, comparison.other, "removed", "removed %"])])


# ---------------------------------------------------------------------------------------------
# JSON


def report_dict(report: TraceReport) -> dict[str, Any]:
    """The report as plain data (times in ns), every step and every range name included."""
    return {
        "source": report.source, "kind": report.kind, "meta": report.meta, "counts": report.counts,
        "notes": report.notes, "devices": [asdict(d) for d in report.devices],
        "step_groups": [{"name": g.name, "steps": len(g.steps), "medians": g.medians,
                         "per_step": [asdict(s) for s in g.steps]} for g in report.step_groups],
        "by_kind": [asdict(f) for f in report.by_kind],
        "by_name": [asdict(f) for f in report.by_name],
    }


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    return {"baseline": comparison.baseline, "other": comparison.other,
            "metrics": [{"metric": key, "title": title, "baseline": a, "other": b,
                         "removed": None if a is None or b is None else a - b}
                        for key, title, a, b in comparison.rows]}
