"""A trace's steps by phase, mode and batch, and the decode steps that fell back to eager.

    rows = ledger(report.steps)          # one row per (phase, mode, batch), with medians
    found = fallback(report.steps)       # decode steps that ran eagerly while others replayed

A serving engine replays a captured graph for the batch sizes it captured and runs any other
step eagerly, silently: a decode batch off the capture sizes, or one past the largest, costs
every kernel's launch again. The ledger shows how many steps of each phase and batch ran each
way and what they cost; the fallback names the decode steps that ran eagerly in a trace where
other decode steps replayed a graph, with their batches. A step that launched nothing (`idle`:
an engine's step between requests, or one whose work fell outside the trace) ran neither way: it
has a row of its own and is never counted as an eager step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from graphrt.quantiles import median
from graphrt.trace.analysis.markers import PHASES
from graphrt.trace.analysis.steps import StepRecord
from graphrt.vocab import STEP_MODES, Mode, Phase

REPLAYED = (Mode.GRAPH, Mode.PIECEWISE)


@dataclass(frozen=True)
class LedgerRow:
    """The steps of one phase, mode and batch (None: the marker does not say), and the median of
    each figure over them (None where some step's figure is unknown)."""

    phase: str
    mode: str
    batch: int | None
    steps: int
    wall_ns: float
    gpu_busy_ns: float | None
    kernels: float | None
    kernel_launches: float
    graph_launches: float
    markers: tuple[str, ...]  # the marker forms its steps came from


def _order(key: tuple[str, str, int | None]) -> tuple:
    phase, mode, batch = key
    return PHASES.index(phase), batch is None, batch or 0, STEP_MODES.index(mode)


def ledger(records: list[StepRecord]) -> list[LedgerRow]:
    """One row per (phase, mode, batch), by phase, then batch, then mode."""
    groups: dict[tuple[str, str, int | None], list[StepRecord]] = {}
    for r in records:
        groups.setdefault((r.marker.phase, r.mode, r.marker.requests), []).append(r)
    rows = []
    for key in sorted(groups, key=_order):
        steps = groups[key]
        figures = [s.figures for s in steps]
        rows.append(LedgerRow(
            *key, steps=len(steps), wall_ns=median(f.wall_ns for f in figures),
            gpu_busy_ns=median(f.gpu_busy_ns for f in figures), kernels=median(f.kernels for f in figures),
            kernel_launches=median(f.kernel_launches for f in figures),
            graph_launches=median(f.graph_launches for f in figures),
            markers=tuple(dict.fromkeys(s.marker.form for s in steps))))
    return rows


def step_markers(records: list[StepRecord]) -> dict[str, int]:
    """How many steps each marker form made, most first."""
    return dict(Counter(r.marker.form for r in records).most_common())


@dataclass(frozen=True)
class Fallback:
    """Decode steps that ran eagerly (`eager`, by start) in a trace where `replayed` decode
    steps replayed a graph (whole or in pieces)."""

    eager: list[StepRecord]
    replayed: list[StepRecord]

    @staticmethod
    def _batches(records: list[StepRecord]) -> dict[int | None, int]:
        counts = Counter(r.marker.requests for r in records)
        return {b: counts[b] for b in sorted(counts, key=lambda b: (b is None, b or 0))}

    @property
    def eager_batches(self) -> dict[int | None, int]:
        """Steps per batch (None: not stated), by batch."""
        return self._batches(self.eager)

    @property
    def replayed_batches(self) -> dict[int | None, int]:
        return self._batches(self.replayed)


def eager_decode(records: list[StepRecord]) -> list[StepRecord]:
    """The decode steps that ran eagerly."""
    return [r for r in records if r.marker.phase == Phase.DECODE and r.mode == Mode.EAGER]


def fallback(records: list[StepRecord]) -> Fallback | None:
    """The decode steps that ran eagerly where other decode steps replayed; None where none did
    (all eager, all replayed, or no decode step)."""
    replayed = [r for r in records if r.marker.phase == Phase.DECODE and r.mode in REPLAYED]
    eager = eager_decode(records)
    return Fallback(eager, replayed) if eager and replayed else None
