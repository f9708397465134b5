"""`graphrt analyze`: read traces back and print what the decode steps launched, where the GPU
waited, and which module each replayed kernel belongs to; a `--tp` directory rank by rank."""

from __future__ import annotations

from pathlib import Path

import click

from graphrt.cli.analyzed_files import Analysed, analyse_all, cores
from graphrt.cli.plot_option import check_plot
from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json
from graphrt.trace.analysis.ledger import eager_decode
from graphrt.trace.analysis.modules import replay_modules
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.analysis.rank_steps import RankGroup, format_ranks, rank_dirs, ranks_dict
from graphrt.trace.analysis.comparisons import compare_steps
from graphrt.trace.present.capture_tables import capture_attribution_dict, format_capture_attribution
from graphrt.trace.present.step_tables import format_replay_modules, replay_modules_dict
from graphrt.trace.present.tables import comparison_dict, format_comparison
from graphrt.trace.present.text_table import cut
from graphrt.trace.read.capture_records import capture_records


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
        _analyze_ranks(Path(paths[0]), dirs, json_path, plot_path, jobs)
        return
    files = _trace_files(paths)
    analysed = analyse_all(files, jobs, quiet=bool(json_path))
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
            click.echo(f"\nnote: {cut(group)}: replayed {unit}s fire no module range; give an eager trace of "
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


def _from_captures(analysed: list[Analysed], top: int) -> list[dict]:
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


def _ranks(analysed: list[Analysed]) -> list[list[RankGroup]] | None:
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


def _refuse_eager_decode(analysed: list[tuple[str, Analysed]]) -> None:
    """Exit 1, naming them, where decode steps ran eagerly; exit 1 too where no decode step's
    mode can be told (a gate that passes on nothing would pass a server without graphs)."""
    eager = [(path, r) for path, a in analysed for r in eager_decode(a.report.steps)]
    told = [r for _, a in analysed for r in a.report.steps if r.mode not in ("unknown", "idle")]  # idle: launched nothing
    decode = [r for r in told if r.marker.phase == "decode"]
    if eager:
        where = ", ".join(dict.fromkeys(path for path, _ in eager))
        batches = sorted({r.marker.requests for _, r in eager}, key=lambda b: (b is None, b or 0))
        raise GraphrtError(f"{len(eager):,} of {len(decode):,} decode steps ran eagerly (batch "
                                   f"{', '.join('?' if b is None else str(b) for b in batches)}) in {where}")
    if not decode:
        raise GraphrtError("no decode step whose mode can be told (no decode marker, or no launch "
                                   "call recorded): cannot tell whether decode ran without graphs")


def _analyze_ranks(path: Path, dirs: list[Path], json_path: str | None, plot_path: str | None, jobs: int) -> None:
    """`graphrt analyze` on a directory of `graphrt trace --tp`: `dirs[r]` holds rank r's traces."""
    files = [_trace_files((str(d),)) for d in dirs]
    every = iter(analyse_all([p for rank_files in files for p in rank_files], jobs))
    analysed = [[next(every) for _ in rank_files] for rank_files in files]
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
