"""Printing and serialising every rank's figures and the slowest rank per step
(graphrt.trace.analysis.rank_steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.measure.collective_share import OF
from graphrt.trace.analysis.rank_steps import RankGroup, by_group, slowest_steps
from graphrt.trace.present.text_table import table
from graphrt.units import MISSING, format_us
from graphrt.vocab import UNKNOWN


def _share(share: float | None) -> str:
    return MISSING if share is None else f"{share:.1%}"


def format_ranks(source: Path, ranks: list[list[RankGroup]]) -> str:
    """Per-rank figures, then the slowest rank per step, one table each."""
    rows = []
    for name, groups in by_group(ranks).items():
        for g in groups:
            unit, work = g.work
            rows.append((name, g.rank, len(g.group.steps), format_us(g.group.medians["wall_ns"]),
                         UNKNOWN if work is None else f"{work:,.0f} {unit}",
                         f"{g.group.medians['launches']:,.0f}", _share(g.collective_share)))
    measures = dict.fromkeys(g.measure for groups in ranks for g in groups if g.measure is not None)
    out = [f"== {source}: {len(ranks)} ranks",
           "Per rank (median per step; collective %: "
           f"{'; or '.join(OF[m] for m in measures) or 'no step to tell'})",
           table(rows, headers=["steps", "rank", "count", "step µs", "work", "launch calls", "collective %"])]
    for name, groups in by_group(ranks).items():
        if len(groups) < 2:
            continue
        slow = slowest_steps(groups)
        counts = {g.rank: sum(s.rank == g.rank for s in slow) for g in groups}
        tally = ", ".join(f"rank {r} in {n}" for r, n in counts.items() if n)
        out += ["", f"{name}: the slowest rank per step ({tally} of {len(slow)} steps)",
                table([(s.index, s.rank, format_us(s.wall_ns), format_us(s.ahead_ns),
                        f"{s.ahead_ns / (s.wall_ns - s.ahead_ns):.0%}" if s.wall_ns > s.ahead_ns else MISSING)
                       for s in slow],
                      headers=["step", "slowest rank", "step µs", "over the fastest µs", "over the fastest %"])]
    return "\n".join(out)


def ranks_dict(ranks: list[list[RankGroup]]) -> dict[str, Any]:
    """Every rank's figures per step group, and the slowest rank per step (times in ns)."""
    return {
        "ranks": [{"rank": r, "step_groups": [{
            "name": g.group.name, "steps": len(g.group.steps), "median_wall_ns": g.group.medians["wall_ns"],
            "work_unit": g.work[0], "work_per_step": g.work[1], "launches_per_step": g.group.medians["launches"],
            "collective_share": g.collective_share, "collective_share_of": g.measure and OF[g.measure],
            "step_shares": g.shares, "wall_ns": g.wall_ns,
            "collective_ns": [c and c.collective_ns for c in g.collectives],
            "collective_of_ns": [c and c.step_ns for c in g.collectives]}
            for g in groups]} for r, groups in enumerate(ranks)],
        "slowest": [{"step_group": name, "steps": [
            {"step": s.index, "rank": s.rank, "wall_ns": s.wall_ns, "over_fastest_ns": s.ahead_ns}
            for s in slowest_steps(groups)]} for name, groups in by_group(ranks).items()],
    }
