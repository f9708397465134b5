"""`graphrt trace`: record the decode steps of each mode into a new directory under traces/."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from tabulate import tabulate

from graphrt.backends.choices import GROUPS
from graphrt.cli.option_types import MAX_TIMED_STEPS, Amount
from graphrt.cli.options import decode_options
from graphrt.errors import GraphrtError
from graphrt.run.spec import RunSpec
from graphrt.trace.record.nsys_profile import DEFAULT_TIMEOUT_S, PROFILERS

if TYPE_CHECKING:
    from graphrt.trace.record.make_traces import MadeTraces

# one of the two modes `both` records (as two traces), or both; as plain words: click reads an
# Enum member by its name (EAGER), not by the word it spells
TRACE_MODES = (*map(str, GROUPS["both"]), "both")
OVERHEAD_STEPS = 120  # --overhead without a value
# how to look at each kind of file `graphrt trace` writes
OPEN_WITH = {
    "report": "open in the Nsight Systems GUI (File > Open)",
    "sqlite": "graphrt analyze {path}",
    "chrome": "open at https://ui.perfetto.dev, or graphrt analyze {path}",
}


def _listing(made: MadeTraces) -> str:
    """The files written, one a line, each with how to look at it."""
    rows = [(name, OPEN_WITH[what].format(path=made.path / name))
            for files in made.files.values() for what, name in files.items()]
    rows.append(("summary.json", "what was recorded: spec, machine, versions, ops per step"))
    return "\n".join(f"  {line}" for line in tabulate(rows, tablefmt="plain").splitlines())


@click.command()
@click.option("--mode", type=click.Choice(TRACE_MODES), default="both", show_default=True,
              help="both: eager and graph, as two traces, then set side by side.")
@click.option("--profiler", type=click.Choice(PROFILERS), default="auto", show_default=True,
              help="auto: Nsight Systems when nsys is on PATH, else torch.profiler.")
@decode_options(steps=8, steps_help="Decode steps, the warmup included; the rest are recorded.",
                warmup_help="Leading decode steps that run before the recording")
@click.option("--out", default="traces", show_default=True, type=click.Path(file_okay=False),
              help="Where the trace directory is made.")
@click.option("--overhead", type=click.IntRange(min=0, max=MAX_TIMED_STEPS), is_flag=False, flag_value=OVERHEAD_STEPS,
              default=0, help=f"Also measure what the NVTX ranges cost an eager step: N steps "
              f"with them, N without, no profiler attached [N: {OVERHEAD_STEPS}].")
@click.option("--timeout", type=Amount(min=1), default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds each nsys run may take before it is killed.")
def trace(profiler: str, out: str, overhead: int, timeout: float, **options) -> None:
    """Record the decode steps after warmup under Nsight Systems or torch.profiler into a new
    directory traces/<time>-<model>-<mode>/: the report and its SQLite export, or a Chrome-trace
    JSON, and summary.json. With --mode both, eager and graph are recorded as two traces and set
    side by side. With --tp N, each rank records its own steps (torch.profiler) into rank<r>/
    of one directory."""
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.parallel import launch, ranks
    from graphrt.trace import load_trace
    from graphrt.trace.analysis.comparisons import compare_steps
    from graphrt.trace.analysis.steps import analyze as analyze_trace
    from graphrt.trace.present.tables import format_comparison
    from graphrt.run.footprint import check_fits
    from graphrt.trace.record.make_traces import make_traces

    spec = RunSpec(**options)
    if fit := check_fits(spec):  # before anything is allocated, here or in the recording processes
        click.echo(fit, err=True)
    if ranks.launched():
        raise GraphrtError("graphrt trace starts its own ranks (--tp N), one launch per mode: run it "
                           "without torchrun")
    if (spec.tp or 1) > 1:
        launch.refuse_early(options)
        _trace_ranks(spec, profiler, Path(out), overhead)
        return
    made = make_traces(spec, profiler, Path(out), overhead_steps=overhead, timeout_s=timeout,
                       say=lambda line: click.echo(line, err=True))
    if made.path != made.wanted:
        click.echo(f"note: {made.wanted} already exists; wrote {made.path.name} beside it", err=True)
    click.echo(f"wrote {made.path}/")
    click.echo(_listing(made))
    if made.overhead:
        click.echo(made.overhead.describe())
    if len(made.files) > 1:
        reports = [analyze_trace(load_trace(made.analysis_file(mode))) for mode in made.files]
        for comparison in compare_steps(reports):
            click.echo()
            click.echo(format_comparison(comparison))
        click.echo(f"\nevery figure: graphrt analyze {made.path}")


def _trace_ranks(spec: RunSpec, profiler: str, out: Path, overhead: int) -> None:
    """`graphrt trace --tp N`: each rank's traces in rank<r>/ of one directory."""
    from graphrt.trace.record.per_rank import make_rank_traces

    if profiler == "nsys" or overhead:
        raise GraphrtError("--tp traces each rank with torch.profiler: give --profiler torch "
                           "(or auto), and no --overhead")
    made = make_rank_traces(spec, spec.tp, out, say=lambda line: click.echo(line, err=True))
    click.echo(f"wrote {made.path.parent}/, one trace directory per rank (rank0/ ... "
               f"rank{spec.tp - 1}/); rank 0's:")
    click.echo(_listing(made))
    click.echo(f"\nevery figure of a rank: graphrt analyze {made.path}")
