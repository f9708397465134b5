"""`graphrt analyze`: read traces back and print what the decode steps launched, where the GPU
waited, and which module each replayed kernel belongs to; a `--tp` directory rank by rank.
The figures are graphrt.trace.analysis.trace_analysis's, the text, JSON and picture
graphrt.trace.present.analysis_report's."""

from __future__ import annotations

from pathlib import Path

import click

from graphrt.cli.option_types import check_plot
from graphrt.io import check_writable, write_json
from graphrt.trace.analysis.file_analysis import cores
from graphrt.trace.analysis.rank_steps import rank_dirs
from graphrt.trace.analysis.trace_analysis import analyze_rank_dirs, analyze_traces, trace_files
from graphrt.trace.present.analysis_report import (analysis_dict, analysis_text, draw_analysis, draw_ranks,
                                                   rank_dict, rank_text)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every figure (times in ns) here.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1),
              help="Range names to list, most total time first.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw one eager step above one replayed step (or the first two steps) "
              "into this PNG (needs matplotlib).")
@click.option("--steps", "steps_shown", default=50, show_default=True, type=click.IntRange(min=0),
              help="Steps to list one by one where an engine's markers made them (all are in --json).")
@click.option("--fail-on-eager-decode", is_flag=True,
              help="Exit non-zero where any decode step ran eagerly (no graph launch), or where the "
              "traces hold no decode step whose mode can be told: for a CI that must not serve without graphs.")
@click.option("--jobs", default=cores, show_default="the cores this process may use", type=click.IntRange(min=1),
              help="Traces read at once, one process each, where several are given (a directory of rank traces).")
def analyze(paths: tuple[str, ...], json_path: str | None, top: int, plot_path: str | None, steps_shown: int,
            fail_on_eager_decode: bool, jobs: int) -> None:
    """Per-step launches, launch delay, launch CPU time and GPU idle time (host wait, kernel
    wait, other), and per-range totals, from Nsight Systems exports (.sqlite, or .nsys-rep with
    nsys on PATH) or torch.profiler Chrome traces (.json, .json.gz), or a directory of them.
    Steps are graphrt's step ranges, a serving engine's step markers (vLLM, SGLang, ATOM,
    TensorRT-LLM), or torch.profiler's ProfilerStep#N. An engine's steps are listed one by one,
    each eager, graph or piecewise by its graph launches, and grouped by phase, mode and batch;
    decode steps that ran eagerly while others replayed are named. Given two traces, or one
    holding eager and replay steps, the second step group is set against the first, and each
    replayed kernel (op, on a CPU) is given its module by aligning it with the eager step's.
    Given the directory `graphrt trace --tp N` made (rank0/ ... rank<N-1>/), or one file per rank
    of an engine, each rank's figures and the slowest rank per step; --plot draws each rank's
    eager step above its replay."""
    if json_path:
        check_writable(json_path)
    check_plot(plot_path)
    if len(paths) == 1 and (dirs := rank_dirs(Path(paths[0]))) is not None:
        ranks = analyze_rank_dirs(Path(paths[0]), dirs, jobs)
        click.echo(rank_text(ranks))
        if plot_path:
            click.echo(draw_ranks(ranks, plot_path))
        if json_path:
            write_json(json_path, rank_dict(ranks))
            click.echo(f"wrote {json_path}")
        return
    one_dir = Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    found = analyze_traces(trace_files(paths), jobs, quiet=bool(json_path), directory=one_dir)
    click.echo(analysis_text(found, top, steps_shown))
    if plot_path:
        click.echo(draw_analysis(found, plot_path))
    if json_path:
        write_json(json_path, analysis_dict(found))
        click.echo(f"wrote {json_path}")
    if fail_on_eager_decode:
        found.refuse_eager_decode()
