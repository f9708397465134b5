"""What `graphrt analyze` finds in the traces it is given, as one typed result: each file's
figures (steps, ledger, fallback, timelines, idle split), the step groups compared, each replayed
kernel's module, the replays an engine's capture traces attribute, and the ranks side by side.
graphrt.trace.present.analysis_report turns it into text and JSON, step_picture into a picture.

    found = analyze_traces(trace_files(paths), jobs)        # TraceAnalysis
    found = analyze_rank_dirs(path, rank_dirs(path), jobs)  # RankAnalysis: a `graphrt trace --tp` directory
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphrt.errors import GraphrtError
from graphrt.trace.analysis.comparisons import Comparison, compare_steps
from graphrt.trace.analysis.engine_capture import CaptureAttribution
from graphrt.trace.analysis.file_analysis import FileAnalysis, analyze_files
from graphrt.trace.analysis.ledger import eager_decode
from graphrt.trace.analysis.modules import CaptureRecords, ReplayModules, replay_modules
from graphrt.trace.analysis.names import is_replay
from graphrt.trace.analysis.rank_steps import RankGroup, rank_dirs
from graphrt.trace.read.capture_records import capture_ranges
from graphrt.vocab import IDLE, UNKNOWN, Phase


def trace_files(paths: tuple[str, ...]) -> list[Path]:
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
class TraceAnalysis:
    """Everything `graphrt analyze` works out of some trace files."""

    files: list[FileAnalysis]  # in the order given
    records: list[CaptureRecords]  # per file, what its captures recorded of their ranges (summary.json)
    comparisons: list[Comparison]
    ranks: list[list[RankGroup]] | None  # ranks[r]: rank r's step groups, where the files are one run's ranks
    ranks_source: Path | None  # the directory the ranks' files are in
    replay_modules: list[ReplayModules]
    # per engine step group that replayed graphs, its steps' kernels attributed from capture traces
    capture_attribution: list[tuple[str, list[CaptureAttribution]]]
    captures_unnamed: bool  # capture traces were given, but their launch calls name no kernel
    unattributed: dict[str, str]  # replay step group -> its unit of work, where no module was given

    def refuse_eager_decode(self) -> None:
        """GraphrtError, naming them, where decode steps ran eagerly; one too where no decode
        step's mode can be told (a gate that passes on nothing would pass a server without graphs)."""
        eager = [(str(f.source), r) for f in self.files for r in eager_decode(f.report.steps)]
        told = [r for f in self.files for r in f.report.steps if r.mode not in (UNKNOWN, IDLE)]
        decode = [r for r in told if r.marker.phase == Phase.DECODE]
        if eager:
            where = ", ".join(dict.fromkeys(path for path, _ in eager))
            batches = sorted({r.marker.requests for _, r in eager}, key=lambda b: (b is None, b or 0))
            raise GraphrtError(f"{len(eager):,} of {len(decode):,} decode steps ran eagerly (batch "
                               f"{', '.join('?' if b is None else str(b) for b in batches)}) in {where}")
        if not decode:
            raise GraphrtError("no decode step whose mode can be told (no decode marker, or no launch "
                               "call recorded): cannot tell whether decode ran without graphs")


def analyze_traces(files: list[Path], jobs: int, quiet: bool = False, directory: Path | None = None) -> TraceAnalysis:
    """Every figure of `files` (trace_files), `jobs` files at a time; `directory`: the one
    directory they were found in, whose files may be the ranks of one run."""
    found = analyze_files(files, jobs, quiet)
    records = [CaptureRecords(*capture_ranges(p)) for p in files]
    several = len(files) > 1
    modules = replay_modules([(f.source.name if several else "", f.timelines) for f in found], records)
    # a replay group no module attribution covers: its work fires no module range of its own
    attributed = {m.replay.rpartition(": ")[2] for m in modules}
    replays = {t.group: t.unit for f in found for t in f.timelines if is_replay(t.group) and t.work}
    # an engine's capture traces among the files attribute its replays, where their launch calls name kernels
    groups = [g for f in found for g in f.captures]
    named = any(g.named for g in groups)
    ranks = _ranks(found) if directory is not None else None
    return TraceAnalysis(
        files=found, records=records, comparisons=compare_steps([f.report for f in found]),
        ranks=ranks, ranks_source=directory if ranks else None, replay_modules=modules,
        capture_attribution=[(group, steps) for f in found for group, steps in f.attributed(groups).items()]
        if named else [],
        captures_unnamed=bool(groups) and not named,
        unattributed={group: unit for group, unit in replays.items() if group not in attributed})


def _ranks(found: list[FileAnalysis]) -> list[list[RankGroup]] | None:
    """Each rank's step groups, by rank, where the traces (of one directory) are the ranks
    0 ... N-1 of one run, each once, as their files say (torch.profiler's `distributedInfo`);
    else None."""
    ranks = [f.report.meta.get("rank") for f in found]
    worlds = {f.report.meta.get("world_size", str(len(found))) for f in found}
    if len(found) < 2 or sorted(ranks, key=str) != [str(r) for r in range(len(found))] \
            or worlds != {str(len(found))}:
        return None
    by_rank = sorted(found, key=lambda f: int(f.report.meta["rank"]))
    return [[RankGroup(rank, g, f.collectives[g.name]) for g in f.report.step_groups]
            for rank, f in enumerate(by_rank)]


@dataclass
class RankAnalysis:
    """`graphrt analyze` of a directory `graphrt trace --tp N` wrote: rank0/ ... rank<N-1>/."""

    source: Path
    dirs: list[Path]  # dirs[r]: rank r's trace directory
    files: list[list[FileAnalysis]]  # files[r]: rank r's traces, eager before graph
    ranks: list[list[RankGroup]]  # ranks[r]: rank r's step groups, over all its traces

    def records(self) -> list[list[CaptureRecords]]:
        """Per rank, per trace, what its captures recorded of their ranges (summary.json): read
        only when asked, as only a picture of the ranks needs them."""
        return [[CaptureRecords(*capture_ranges(f.source)) for f in mine] for mine in self.files]


def analyze_rank_dirs(source: Path, dirs: list[Path], jobs: int) -> RankAnalysis:
    """Every rank's figures: `dirs[r]` (rank_dirs) holds rank r's traces, all read `jobs` at a time."""
    files = [trace_files((str(d),)) for d in dirs]
    every = iter(analyze_files([p for rank_files in files for p in rank_files], jobs))
    found = [[next(every) for _ in rank_files] for rank_files in files]
    ranks = [[RankGroup(rank, g, f.collectives[g.name]) for f in mine for g in f.report.step_groups]
             for rank, mine in enumerate(found)]
    return RankAnalysis(source, dirs, found, ranks)
