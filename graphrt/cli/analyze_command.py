"""`graphrt analyze`: read traces back and print what the decode steps launched, where the GPU
waited, and which module each replayed kernel belongs to; a `--tp` directory rank by rank."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json
from graphrt.trace import load_trace
from graphrt.trace.analysis.engine_capture import CaptureAttribution, CaptureGroup, attribute, captures
from graphrt.trace.analysis.idle import BetweenPieces, StepLaunchIdle, between_pieces, step_launch_idle
from graphrt.trace.analysis.ledger import eager_decode, fallback, ledger
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.modules import replay_modules
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.analysis.rank_steps import (CollectiveTime, RankGroup, collective_time, format_ranks,
                                               rank_dirs, ranks_dict)
from graphrt.trace.analysis.steps import TraceReport, analyze as analyze_trace, compare_steps
from graphrt.trace.analysis.timeline import StepTimeline, step_timelines, whole_trace
from graphrt.trace.present.capture_tables import capture_attribution_dict, format_capture_attribution
from graphrt.trace.present.step_ledger import (TraceStep, fallback_dict, format_engine_steps, ledger_dict,
                                               steps_dict, trace_steps)
from graphrt.trace.present.step_tables import (format_launch_idle, format_replay_modules, launch_idle_dict,
                                               replay_modules_dict)
from graphrt.trace.present.tables import comparison_dict, format_comparison, format_report, report_dict
from graphrt.trace.read.capture_records import capture_records
from graphrt.trace.read.progress import ReadProgress


def _trace_files(paths: tuple[str, ...]) -> list[Path]:
    """Files as given; a directory stands for its SQLite exports, or else its Chrome traces
    (*.json and *.json.gz: eager before graph, as `graphrt trace` writes them; one file per rank,
    as serving engines write them)."""
    files = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(path.glob("*.sqlite")) or sorted(
            p for p in [*path.glob("*.json"), *path.glob("*.json.gz")] if p.name != "summary.json")
        if rank_dirs(path) is not None:
            raise GraphrtError(f"{path}: one trace directory per rank, as graphrt trace --tp writes: "
                               f"analyse it on its own (graphrt analyze {path})")
        if not found:
            raise GraphrtError(f"{path}: a directory with no trace in it (expected *.sqlite, or Chrome-trace "
                               "*.json or *.json.gz)")
        files += found
    return files


@dataclass
class _Analysed:
    report: TraceReport
    timelines: list[StepTimeline]
    launch_idle: list[StepLaunchIdle]
    whole: StepTimeline | None  # the whole trace as one timeline, where it has no steps (to plot)
    collectives: dict[str, list[CollectiveTime | None]]  # per step group, each step's time in collectives
    between: list[BetweenPieces | None]  # per step of `launch_idle`: what it ran between its pieces
    captures: list[CaptureGroup]  # the graphs it captured, where it is an engine's capture trace

    def attributed(self, groups: list[CaptureGroup]) -> dict[str, list[CaptureAttribution]]:
        """Per group of its engine steps that replayed graphs, each step's replayed kernels
        attributed from the capture `groups` (steps that none attributes left out)."""
        out: dict[str, list[CaptureAttribution]] = {}
        if self.report.engine_steps:
            for record, timeline in zip(self.report.steps, self.timelines):
                if record.mode in ("graph", "piecewise") and (found := attribute(timeline, groups)):
                    out.setdefault(record.step.group, []).append(found)
        return out

    @property
    def steps(self) -> list[TraceStep]:
        return trace_steps(self.report, self.launch_idle, self.between)

    def text(self, top: int, steps: int) -> str:
        """The trace's report; where an engine's markers made its steps, the steps and their
        ledger first, one row per group and per step (`steps` of them at most)."""
        report = self.report
        if not report.engine_steps:
            table = format_launch_idle(self.launch_idle)
            return format_report(report, top=top) + (f"\n\n{table}" if table else "")
        return format_report(report, top=top, steps=format_engine_steps(
            report, self.steps, fallback(report.steps), steps))

    def json(self) -> dict:
        return {**report_dict(self.report), "launch_idle": launch_idle_dict(self.launch_idle),
                "steps": steps_dict(self.steps), "ledger": ledger_dict(ledger(self.report.steps)),
                "fallback": fallback_dict(fallback(self.report.steps))}


def _analyse(path: Path, quiet: bool = False) -> _Analysed:
    """`quiet`: no progress on stderr while a big trace is read."""
    progress = None if quiet or not path.is_file() else ReadProgress(path)
    trace = load_trace(path, progress)
    if progress:
        progress.done()
    membership = Membership.of(trace)
    timelines = step_timelines(trace, membership)
    with_kernels = [t for t in timelines if t.unit == "kernel"]
    return _Analysed(analyze_trace(trace, membership), timelines, [step_launch_idle(t) for t in with_kernels],
                     None if timelines else whole_trace(trace, membership), collective_time(trace, membership),
                     [between_pieces(t) for t in with_kernels], captures(trace))


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
def analyze(paths: tuple[str, ...], json_path: str | None, top: int, plot_path: str | None, steps_shown: int,
            fail_on_eager_decode: bool) -> None:
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
        click.echo(a.text(top, steps_shown))
    comparisons = compare_steps(reports)
    for comparison in comparisons:
        click.echo()
        click.echo(format_comparison(comparison))
    ranks = _ranks(analysed) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    if ranks:
        click.echo()
        click.echo(format_ranks(Path(paths[0]), ranks))
    several = len(files) > 1
    records = [capture_records(p) for p in files]
    modules = replay_modules([(p.name if several else "", a.timelines) for p, a in zip(files, analysed)], records)
    for found in modules:
        click.echo()
        click.echo(format_replay_modules(found, top=top))
    from_captures = _from_captures(analysed, top)
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
        write_json(json_path, {"traces": [a.json() for a in analysed],
                               "comparisons": [comparison_dict(c) for c in comparisons],
                               "replay_modules": [replay_modules_dict(m) for m in modules],
                               "capture_attribution": from_captures,
                               **(ranks_dict(ranks) if ranks else {})})
        click.echo(f"wrote {json_path}")
    if fail_on_eager_decode:
        _refuse_eager_decode([(str(p), a) for p, a in zip(files, analysed)])


def _from_captures(analysed: list[_Analysed], top: int) -> list[dict]:
    """Print, and give as JSON, each engine step group's replayed kernels attributed from the
    capture traces among `analysed` (none where no capture trace was given)."""
    groups = [g for a in analysed for g in a.captures]
    if not groups:
        return []
    if not any(g.named for g in groups):
        click.echo("\nnote: the capture traces' launch calls name no kernel (CUDA's runtime events carry none; "
                   "ROCm's do): their graphs cannot be matched to the replayed kernels")
        return []
    out = []
    for a in analysed:
        for group, found in a.attributed(groups).items():
            click.echo()
            click.echo(format_capture_attribution(group, found, top))
            out.append(capture_attribution_dict(group, found))
    return out


def _ranks(analysed: list[_Analysed]) -> list[list[RankGroup]] | None:
    """Each rank's step groups, by rank, where the traces (of one directory) are the ranks
    0 ... N-1 of one run, each once, as their files say (torch.profiler's `distributedInfo`);
    else None."""
    ranks = [a.report.meta.get("rank") for a in analysed]
    worlds = {a.report.meta.get("world_size", str(len(analysed))) for a in analysed}
    if len(analysed) < 2 or sorted(ranks, key=str) != [str(r) for r in range(len(analysed))] \
            or worlds != {str(len(analysed))}:
        return None
    by_rank = sorted(analysed, key=lambda a: int(a.report.meta["rank"]))
    return [[RankGroup(rank, g, a.collectives[g.name]) for g in a.report.step_groups]
            for rank, a in enumerate(by_rank)]


def _refuse_eager_decode(analysed: list[tuple[str, _Analysed]]) -> None:
    """Exit 1, naming them, where decode steps ran eagerly; exit 1 too where no decode step's
    mode can be told (a gate that passes on nothing would pass a server without graphs)."""
    eager = [(path, r) for path, a in analysed for r in eager_decode(a.report.steps)]
    decode = [r for _, a in analysed for r in a.report.steps if r.marker.phase == "decode" and r.mode != "unknown"]
    if eager:
        where = ", ".join(dict.fromkeys(path for path, _ in eager))
        batches = sorted({r.marker.requests for _, r in eager}, key=lambda b: (b is None, b or 0))
        raise GraphrtError(f"{len(eager):,} of {len(decode):,} decode steps ran eagerly (batch "
                                   f"{', '.join('?' if b is None else str(b) for b in batches)}) in {where}")
    if not decode:
        raise GraphrtError("no decode step whose mode can be told (no decode marker, or no launch "
                                   "call recorded): cannot tell whether decode ran without graphs")


def _analyze_ranks(path: Path, dirs: list[Path], json_path: str | None, plot_path: str | None) -> None:
    """`graphrt analyze` on a directory of `graphrt trace --tp`: `dirs[r]` holds rank r's traces."""
    files = [_trace_files((str(d),)) for d in dirs]
    analysed = [[_analyse(p) for p in rank_files] for rank_files in files]
    ranks = [[RankGroup(rank, g, a.collectives[g.name]) for a in mine for g in a.report.step_groups]
             for rank, mine in enumerate(analysed)]
    click.echo(format_ranks(path, ranks))
    click.echo(f"\nevery figure of one rank: graphrt analyze {dirs[0]}")
    if plot_path:
        # matplotlib is optional: imported only for --plot
        from graphrt.trace.present.step_picture import plot_rank_steps

        click.echo(plot_rank_steps([[a.timelines for a in mine] for mine in analysed],
                                   [[capture_records(p) for p in rank_files] for rank_files in files],
                                   str(path), plot_path))
    if json_path:
        write_json(json_path, {"source": str(path), **ranks_dict(ranks), "traces": [
            [a.json() for a in mine]
            for mine in analysed]})
        click.echo(f"wrote {json_path}")
