"""Step groups set against each other: the first group of all the traces against each later
one (eager vs graph, say), or, where an engine's markers made the steps, each group of eager
steps against the groups of the same phase and batch that replayed a graph.

    for comparison in compare_steps([analyze(eager), analyze(graph)]):
        print(format_comparison(comparison))  # graphrt.trace.present.tables
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphrt.trace.analysis.steps import STEP_METRICS, StepGroup, TraceReport, shown
from graphrt.vocab import Mode


@dataclass(frozen=True)
class Comparison:
    """Median step figures of `baseline` and `other`, and what `other` removed."""

    baseline: str
    other: str
    rows: list[tuple[str, str, float | None, float | None]]  # (metric key, title, baseline, other)


def _label(report: TraceReport, group: str, several_traces: bool) -> str:
    """A step group's name, after its file's where the groups come from several traces."""
    return f"{Path(report.source).name}: {group}" if several_traces else group


def _comparison(base_label: str, base: StepGroup, label: str, group: StepGroup) -> Comparison:
    return Comparison(base_label, label, [
        (key, title, base.medians[key], group.medians[key])
        for key, title, _ in STEP_METRICS if shown(base.medians[key]) or shown(group.medians[key])])


def compare_steps(reports: Sequence[TraceReport]) -> list[Comparison]:
    """The first step group of all the traces against each later one (eager vs graph, say).
    Where an engine's markers made the steps, each group of eager steps against each group of
    the same phase and batch that replayed a graph, in any of the traces. Metrics that are zero
    on both sides are left out."""
    several = len(reports) > 1
    groups = [(_label(rep, g.name, several), g) for rep in reports for g in rep.step_groups]
    if any(rep.engine_steps for rep in reports):
        return _engine_comparisons(reports, dict(groups), several)
    if len(groups) < 2:
        return []
    (base_label, base), rest = groups[0], groups[1:]
    return [_comparison(base_label, base, label, g) for label, g in rest]


def _engine_comparisons(reports: Sequence[TraceReport], groups: dict[str, StepGroup],
                        several: bool) -> list[Comparison]:
    """Eager against replayed, group by group, where phase and batch are the same and known;
    `groups` by their labels (`_label`)."""
    kind: dict[str, tuple[str, int | None, str]] = {}  # group label -> (phase, batch, mode)
    for rep in reports:
        for record in rep.steps:
            kind[_label(rep, record.step.group, several)] = (record.marker.phase, record.marker.requests, record.mode)
    return [_comparison(eager, groups[eager], other, groups[other])
            for eager, (phase, batch, mode) in kind.items() if mode == Mode.EAGER and batch is not None
            for other, (phase2, batch2, mode2) in kind.items()
            if mode2 in ("graph", "piecewise") and (phase2, batch2) == (phase, batch)]
