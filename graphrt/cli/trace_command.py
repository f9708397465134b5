"""`graphrt analyze` reads traces back and prints what the decode steps launched;
`graphrt trace` records them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click
from tabulate import tabulate

from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json
from graphrt.cli.options import decode_options
from graphrt.parallel import launch, group as ranks
from graphrt.trace.record.per_rank import make_rank_traces
from graphrt.run import execute as runner
from graphrt.run.execute import RunSpec
from graphrt.trace import load_trace
from graphrt.trace.analysis.steps import TraceReport, analyze as analyze_trace, compare_steps
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.rank_steps import CollectiveTime, RankGroup, collective_time, format_ranks, rank_dirs, ranks_dict
from graphrt.trace.analysis.idle import StepLaunchIdle, step_launch_idle
from graphrt.trace.analysis.modules import CaptureRecords, replay_modules
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.read.progress import ReadProgress
from graphrt.trace.present.tables import comparison_dict, format_comparison, format_report, report_dict
from graphrt.trace.present.step_tables import (format_launch_idle, format_replay_modules, launch_idle_dict,
                                         replay_modules_dict)
from graphrt.trace.analysis.timeline import StepTimeline, step_timelines, whole_trace
from graphrt.trace.record.make_traces import DEFAULT_TIMEOUT_S, PROFILERS, MadeTraces, make_traces


def _trace_files(paths: tuple[str, ...]) -> list[Path]:
    """Files as given; a directory of `graphrt trace` stands for its SQLite exports, or else
    its Chrome traces (eager before graph, as trace writes them)."""
    files = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(path.glob("*.sqlite")) or sorted(
            p for p in path.glob("*.json") if p.name != "summary.json")
        if rank_dirs(path) is not None:
            raise GraphrtError(f"{path}: one trace directory per rank, as graphrt trace --tp writes: "
                               f"analyse it on its own (graphrt analyze {path})")
        if not found:
            raise GraphrtError(f"{path}: a directory with no trace in it (expected *.sqlite or "
                               "Chrome-trace *.json, as graphrt trace writes)")
        files += found
    return files


@dataclass
class _Analysed:
    report: TraceReport
    timelines: list[StepTimeline]
    launch_idle: list[StepLaunchIdle]
    whole: StepTimeline | None  # the whole trace as one timeline, where it has no steps (to plot)
    collectives: dict[str, list[CollectiveTime | None]]  # per step group, each step's time in collectives


def _analyse(path: Path, quiet: bool = False) -> _Analysed:
    """`quiet`: no progress on stderr while a big trace is read."""
    progress = None if quiet or not path.is_file() else ReadProgress(path)
    trace = load_trace(path, progress)
    if progress:
        progress.done()
    membership = Membership.of(trace)
    timelines = step_timelines(trace, membership)
    return _Analysed(analyze_trace(trace, membership), timelines,
                     [step_launch_idle(t) for t in timelines if t.unit == "kernel"],
                     None if timelines else whole_trace(trace, membership), collective_time(trace, membership))


def _range_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{value!r} is not a list of range names")
    return tuple(value)


def _op_entries(entries: list) -> list[tuple[str, tuple[str, ...]]]:
    read = []
    for name, stack in entries:
        if not isinstance(name, str):
            raise ValueError(f"{name!r} is not an op name")
        read.append((name, _range_names(stack)))
    return read


def _node_stacks(nodes: dict) -> dict[int, tuple[str, ...]]:
    return {int(node): _range_names(stack) for node, stack in nodes.items()}


# what each record holds per replay step, as graphrt.trace.record.record_modes.RecordedMode writes it
_RECORDS = {"captured_ops": (_op_entries, "a list of [op name, [range names]]"),
            "node_ranges": (_node_stacks, "{graph node id: [range names]}")}


def _capture_records(trace_file: Path) -> CaptureRecords:
    """What the captures of the graphs recorded of their ranges, where the trace came from
    `graphrt trace`: summary.json beside it holds it (graphrt.trace.record.record_modes.RecordedMode)."""
    summary = trace_file.parent / "summary.json"
    if not summary.is_file():
        return CaptureRecords()
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError) as e:
        raise GraphrtError(f"{summary}: not a summary graphrt trace wrote ({e})") from None
    modes = data.get("modes", {}) if isinstance(data, dict) else None
    if not isinstance(modes, dict):
        raise GraphrtError(f"{summary}: not a summary graphrt trace wrote (expected a JSON object "
                           "whose 'modes' is an object)")
    read: dict[str, dict] = {key: {} for key in _RECORDS}
    for mode, facts in modes.items():
        for key, (parse, expected) in _RECORDS.items():
            try:
                read[key].update({step: parse(value) for step, value in facts.get(key, {}).items()})
            except (ValueError, AttributeError, TypeError) as e:
                raise GraphrtError(f"{summary}: modes.{mode}.{key} is not what graphrt trace writes "
                                   f"(per replay step, {expected}): {e}") from None
    return CaptureRecords(read["captured_ops"], read["node_ranges"])


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every figure (times in ns) here.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1),
              help="Range names to list, most total time first.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw one eager step above one replayed step (or the first two steps) "
              "into this PNG (needs matplotlib).")
def analyze(paths: tuple[str, ...], json_path: str | None, top: int, plot_path: str | None) -> None:
    """Per-step launches, launch delay, launch CPU time and GPU idle time (host wait, kernel
    wait, other), and per-range totals, from Nsight Systems exports (.sqlite, or .nsys-rep with
    nsys on PATH) or torch.profiler Chrome traces (.json), or a directory `graphrt trace` made.
    Steps are graphrt's step ranges or torch.profiler's ProfilerStep#N. Given two traces, or one
    holding eager and replay steps, the second step group is set against the first, and each
    replayed kernel (op, on a CPU) is given its module by aligning it with the eager step's.
    Given the directory `graphrt trace --tp N` made (rank0/ ... rank<N-1>/), each rank's figures
    and the slowest rank per step; --plot draws each rank's eager step above its replay."""
    for out in (json_path, plot_path):
        if out:
            check_writable(out)
    if len(paths) == 1 and (dirs := rank_dirs(Path(paths[0]))) is not None:
        _analyze_ranks(Path(paths[0]), dirs, json_path, plot_path)
        return
    files = _trace_files(paths)
    analysed = [_analyse(p, quiet=bool(json_path)) for p in files]
    reports = [a.report for a in analysed]
    for i, a in enumerate(analysed):
        if i:
            click.echo()
        click.echo(format_report(a.report, top=top))
        if table := format_launch_idle(a.launch_idle):
            click.echo()
            click.echo(table)
    comparisons = compare_steps(reports)
    for comparison in comparisons:
        click.echo()
        click.echo(format_comparison(comparison))
    several = len(files) > 1
    records = [_capture_records(p) for p in files]
    modules = replay_modules([(p.name if several else "", a.timelines) for p, a in zip(files, analysed)], records)
    for found in modules:
        click.echo()
        click.echo(format_replay_modules(found, top=top))
    attributed = {m.replay.rpartition(": ")[2] for m in modules}
    replays = {t.group: t.unit for a in analysed for t in a.timelines if is_replay(t.group) and t.work}
    for group, unit in replays.items():
        if group not in attributed:
            click.echo(f"\nnote: {group}: replayed {unit}s fire no module range; give an eager trace of "
                       "the same model and batch beside it to attribute them (graphrt analyze eager.json "
                       "graph.json)")
    if plot_path:
        from graphrt.trace.present.step_picture import plot_steps  # matplotlib is optional: only for --plot

        drawn = [a.timelines or [a.whole] for a in analysed]
        click.echo(plot_steps(drawn, [str(p) for p in files], plot_path, records))
    if json_path:
        write_json(json_path, {"traces": [{**report_dict(a.report), "launch_idle": launch_idle_dict(a.launch_idle)}
                                          for a in analysed],
                               "comparisons": [comparison_dict(c) for c in comparisons],
                               "replay_modules": [replay_modules_dict(m) for m in modules]})
        click.echo(f"wrote {json_path}")


def _analyze_ranks(path: Path, dirs: list[Path], json_path: str | None, plot_path: str | None) -> None:
    """`graphrt analyze` on a directory of `graphrt trace --tp`: `dirs[r]` holds rank r's traces."""
    files = [_trace_files((str(d),)) for d in dirs]
    analysed = [[_analyse(p) for p in rank_files] for rank_files in files]
    ranks = [[RankGroup(rank, g, a.collectives[g.name]) for a in mine for g in a.report.step_groups]
             for rank, mine in enumerate(analysed)]
    click.echo(format_ranks(path, ranks))
    click.echo(f"\nevery figure of one rank: graphrt analyze {dirs[0]}")
    if plot_path:
        from graphrt.trace.present.step_picture import plot_rank_steps  # matplotlib is optional: only for --plot

        click.echo(plot_rank_steps([[a.timelines for a in mine] for mine in analysed],
                                   [[_capture_records(p) for p in rank_files] for rank_files in files],
                                   str(path), plot_path))
    if json_path:
        write_json(json_path, {"source": str(path), **ranks_dict(ranks), "traces": [
            [{**report_dict(a.report), "launch_idle": launch_idle_dict(a.launch_idle)} for a in mine]
            for mine in analysed]})
        click.echo(f"wrote {json_path}")


# ---------------------------------------------------------------------------------------------
# graphrt trace

TRACE_MODES = ("eager", "graph", "both")
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
@click.option("--overhead", type=click.IntRange(min=0), is_flag=False, flag_value=OVERHEAD_STEPS,
              default=0, help=f"Also measure what the NVTX ranges cost an eager step: N steps "
              f"with them, N without, no profiler attached [N: {OVERHEAD_STEPS}].")
@click.option("--timeout", type=click.FloatRange(min=1), default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds each nsys run may take before it is killed.")
def trace(profiler: str, out: str, overhead: int, timeout: float, **options) -> None:
    """Record the decode steps after warmup under Nsight Systems or torch.profiler into a new
    directory traces/<time>-<model>-<mode>/: the report and its SQLite export, or a Chrome-trace
    JSON, and summary.json. With --mode both, eager and graph are recorded as two traces and set
    side by side. With --tp N, each rank records its own steps (torch.profiler) into rank<r>/
    of one directory."""
    if launch.relaunched(options):
        return
    spec = RunSpec(**options)
    if ranks.launched():
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
    """One rank of `graphrt trace --tp N`: its traces in rank<r>/ of one directory; rank 0 says
    where."""
    if profiler == "nsys" or overhead:
        raise GraphrtError("--tp traces each rank with torch.profiler: give --profiler torch "
                           "(or auto), and no --overhead")
    me = runner.join_ranks(spec)
    made = make_rank_traces(spec, me, out, say=lambda line: click.echo(line, err=True) if me.leader else None)
    ranks.leave()
    if made is not None:
        click.echo(f"wrote {made.path.parent}/, one trace directory per rank (rank0/ ... "
                   f"rank{me.world - 1}/); rank 0's:")
        click.echo(_listing(made))
        click.echo(f"\nevery figure of a rank: graphrt analyze {made.path}")
