"""Every figure of one trace file, and many files analysed at once: one process per core, each
reading and analysing whole files (a rank directory's traces, say), the figures the same as
reading them one after another.

    found = analyze_files(files, jobs=cores())   # FileAnalysis each, in the order of `files`
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from graphrt.trace import load_trace
from graphrt.trace.analysis.engine_capture import CaptureAttribution, CaptureGroup, attribute, captures
from graphrt.trace.analysis.idle import BetweenPieces, StepLaunchIdle, between_pieces, step_launch_idle
from graphrt.trace.analysis.ledger import REPLAYED, Fallback, LedgerRow, fallback, ledger
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.rank_steps import CollectiveTime, collective_time
from graphrt.trace.analysis.steps import StepRecord, TraceReport, analyze
from graphrt.trace.analysis.timeline import StepTimeline, step_timelines, whole_trace
from graphrt.trace.read.progress import ReadProgress


@dataclass(frozen=True)
class TraceStep:
    """A step with everything the trace tells of it: its figures and marker, and where the trace
    has kernels its launches and GPU idle time, and what it ran between its pieces."""

    record: StepRecord
    launch_idle: StepLaunchIdle | None
    between: BetweenPieces | None


@dataclass
class FileAnalysis:
    """One trace file's figures."""

    source: Path
    report: TraceReport
    timelines: list[StepTimeline]
    launch_idle: list[StepLaunchIdle]  # per step with kernels (none in a trace without kernels)
    whole: StepTimeline | None  # the whole trace as one timeline, where it has no steps (to plot)
    collectives: dict[str, list[CollectiveTime | None]]  # per step group, each step's time in collectives
    between: list[BetweenPieces | None]  # per step of `launch_idle`: what it ran between its pieces
    captures: list[CaptureGroup]  # the graphs it captured, where it is an engine's capture trace

    @property
    def steps(self) -> list[TraceStep]:
        """Each step of the report with its launch/idle figures and pieces (the same step order)."""
        if not self.launch_idle:
            return [TraceStep(r, None, None) for r in self.report.steps]
        assert len(self.launch_idle) == len(self.between) == len(self.report.steps)
        return [TraceStep(r, li, b) for r, li, b in zip(self.report.steps, self.launch_idle, self.between)]

    @property
    def ledger(self) -> list[LedgerRow]:
        return ledger(self.report.steps)

    @property
    def fallback(self) -> Fallback | None:
        return fallback(self.report.steps)

    def attributed(self, groups: list[CaptureGroup]) -> dict[str, list[CaptureAttribution]]:
        """Per group of its engine steps that replayed graphs, each step's replayed kernels
        attributed from the capture `groups` (steps that none attributes left out)."""
        out: dict[str, list[CaptureAttribution]] = {}
        if self.report.engine_steps:
            for record, timeline in zip(self.report.steps, self.timelines):
                if record.mode in REPLAYED and (found := attribute(timeline, groups)):
                    out.setdefault(record.step.group, []).append(found)
        return out


def analyze_file(path: Path, quiet: bool = False, live: bool = True) -> FileAnalysis:
    """Every figure of one trace file. `quiet`: no progress on stderr while a big trace is read;
    `live`: progress as one line kept up to date on a terminal (else a line every few seconds)."""
    progress = None if quiet or not path.is_file() else ReadProgress(path, live=live)
    trace = load_trace(path, progress)
    if progress:
        progress.done()
    membership = Membership.of(trace)
    timelines = step_timelines(trace, membership)
    with_kernels = [t for t in timelines if t.unit == "kernel"]
    return FileAnalysis(path, analyze(trace, membership), timelines, [step_launch_idle(t) for t in with_kernels],
                        None if timelines else whole_trace(trace, membership), collective_time(trace, membership),
                        [between_pieces(t) for t in with_kernels], captures(trace))


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _start_method() -> multiprocessing.context.BaseContext:
    """fork where no other Python thread runs (a child starts at once, graphrt imported: a fresh
    interpreter takes a fifth of a second to), else a fresh interpreter's, as a forked child may
    inherit a lock another thread held. (Native threads, as numpy's BLAS starts, are fork-safe.)"""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([__name__])
    return context


def analyze_files(paths: Sequence[Path], jobs: int, quiet: bool = False) -> list[FileAnalysis]:
    """Each file's figures, in the order given: in this process where one job or one file is
    asked for, else in min(jobs, files) processes, a file to a process at a time. A GraphrtError
    is the first file's (in the order given) that has one, as one after another would give."""
    if jobs <= 1 or len(paths) <= 1:
        return [analyze_file(p, quiet) for p in paths]
    context = _start_method()
    with ProcessPoolExecutor(min(jobs, len(paths)), mp_context=context) as pool:
        futures = [pool.submit(analyze_file, p, quiet, False) for p in paths]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
