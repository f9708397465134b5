"""`graphrt analyze`: read traces back and print what the decode steps launched."""

from __future__ import annotations

import click

from graphrt.io import check_writable, write_json
from graphrt.trace import load_trace
from graphrt.trace.analyze import (analyze as analyze_trace, compare_steps, comparison_dict,
                                   format_comparison, format_report, report_dict)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every figure (times in ns) here.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1),
              help="Range names to list, most total time first.")
def analyze(paths: tuple[str, ...], json_path: str | None, top: int) -> None:
    """Per-step launches, launch CPU time and GPU idle time, and per-range totals, from Nsight
    Systems exports (.sqlite, or .nsys-rep with nsys on PATH) or torch.profiler Chrome traces
    (.json). Given two traces, or one holding eager and replay steps, the second step group is
    set against the first."""
    if json_path:
        check_writable(json_path)
    reports = [analyze_trace(load_trace(p)) for p in paths]
    for i, report in enumerate(reports):
        if i:
            click.echo()
        click.echo(format_report(report, top=top))
    comparisons = compare_steps(reports)
    for comparison in comparisons:
        click.echo()
        click.echo(format_comparison(comparison))
    if json_path:
        write_json(json_path, {"traces": [report_dict(r) for r in reports],
                               "comparisons": [comparison_dict(c) for c in comparisons]})
        click.echo(f"wrote {json_path}")
