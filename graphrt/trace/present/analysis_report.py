"""What `graphrt analyze` prints, writes and draws of what it found
(graphrt.trace.analysis.trace_analysis): text, one block per finding; JSON, every figure (times
in ns); the picture of one eager step above one replayed step.

    click.echo(analysis_text(found, top=15, steps=50)); write_json(path, analysis_dict(found))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.errors import cut
from graphrt.trace.analysis.file_analysis import FileAnalysis
from graphrt.trace.analysis.trace_analysis import RankAnalysis, TraceAnalysis
from graphrt.trace.present.capture_tables import capture_attribution_dict, format_capture_attribution
from graphrt.trace.present.rank_tables import format_ranks, ranks_dict
from graphrt.trace.present.step_ledger import fallback_dict, format_engine_steps, ledger_dict, steps_dict
from graphrt.trace.present.step_picture import plot_rank_steps, plot_steps
from graphrt.trace.present.step_tables import (format_launch_idle, format_replay_modules, launch_idle_dict,
                                               replay_modules_dict)
from graphrt.trace.present.tables import comparison_dict, format_comparison, format_report, report_dict

UNNAMED_CAPTURES = ("note: the capture traces' launch calls name no kernel (CUDA's runtime events carry none; "
                    "ROCm's do): their graphs cannot be matched to the replayed kernels")


def file_text(found: FileAnalysis, top: int, steps: int) -> str:
    """One trace's report; where an engine's markers made its steps, the steps and their ledger
    first, one row per group and per step (`steps` of them at most)."""
    report = found.report
    if not report.engine_steps:
        table = format_launch_idle(found.launch_idle)
        return format_report(report, top=top) + (f"\n\n{table}" if table else "")
    return format_report(report, top=top, steps=format_engine_steps(report, found.steps, found.fallback, steps))


def file_dict(found: FileAnalysis) -> dict[str, Any]:
    return {**report_dict(found.report), "launch_idle": launch_idle_dict(found.launch_idle),
            "steps": steps_dict(found.steps), "ledger": ledger_dict(found.ledger),
            "fallback": fallback_dict(found.fallback)}


def analysis_text(found: TraceAnalysis, top: int, steps: int) -> str:
    """Each trace's report, then the comparisons, the ranks, the replays module by module and
    as their captures launched them, and what could not be attributed: blocks a blank line apart."""
    blocks = [file_text(f, top, steps) for f in found.files]
    blocks += [format_comparison(c) for c in found.comparisons]
    if found.ranks and found.ranks_source:
        blocks.append(format_ranks(found.ranks_source, found.ranks))
    blocks += [format_replay_modules(m, top=top) for m in found.replay_modules]
    if found.captures_unnamed:
        blocks.append(UNNAMED_CAPTURES)
    blocks += [format_capture_attribution(group, attributed, top) for group, attributed in found.capture_attribution]
    blocks += [f"note: {cut(group)}: replayed {unit}s fire no module range; give an eager trace of the same model "
               "and batch beside it to attribute them (graphrt analyze eager.json graph.json)"
               for group, unit in found.unattributed.items()]
    return "\n\n".join(blocks)


def analysis_dict(found: TraceAnalysis) -> dict[str, Any]:
    return {"traces": [file_dict(f) for f in found.files],
            "comparisons": [comparison_dict(c) for c in found.comparisons],
            "replay_modules": [replay_modules_dict(m) for m in found.replay_modules],
            "capture_attribution": [capture_attribution_dict(group, attributed)
                                    for group, attributed in found.capture_attribution],
            **(ranks_dict(found.ranks) if found.ranks else {})}


def draw_analysis(found: TraceAnalysis, path: str | Path) -> str:
    """One eager step above one replayed step (or the first two steps) into a PNG at `path`
    (matplotlib needed); the line saying what was drawn."""
    return plot_steps([f.timelines or [f.whole] for f in found.files], [str(f.source) for f in found.files],
                      path, found.records)


def rank_text(found: RankAnalysis) -> str:
    return format_ranks(found.source, found.ranks) + f"\n\nevery figure of one rank: graphrt analyze {found.dirs[0]}"


def rank_dict(found: RankAnalysis) -> dict[str, Any]:
    return {"source": str(found.source), **ranks_dict(found.ranks),
            "traces": [[file_dict(f) for f in mine] for mine in found.files]}


def draw_ranks(found: RankAnalysis, path: str | Path) -> str:
    """Each rank's eager step above its replay, rank after rank, into a PNG at `path`."""
    return plot_rank_steps([[f.timelines for f in mine] for mine in found.files], found.records(),
                           str(found.source), path)
