"""Printing and serialising what an engine's capture trace says of its replayed kernels
(graphrt.trace.analysis.engine_capture): per op and per module, and a piecewise step's pieces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.trace.analysis.attribution import BETWEEN, MATCHED, UNATTRIBUTED
from graphrt.trace.analysis.engine_capture import CaptureAttribution, Total, totals
from graphrt.trace.present.text_table import cut, table
from graphrt.units import MISSING, format_us


def _pieces(found: list[CaptureAttribution]) -> list[tuple[int, float, float, tuple[str, str] | None]]:
    """Per piece of the group's steps: kernels and GPU time per step, and the first and last
    decoder layer it spans where the capture's module frames name them."""
    first = found[0]
    rows = []
    for piece in range(first.group.graphs):
        items = [(f, i) for f in found for i, p in zip(f.work, f.pieces) if p == piece]
        rows.append((piece, len(items) / len(found), sum(f.step.work[i].duration_ns for f, i in items) / len(found),
                     first.layers(piece)))
    return rows


def _layers(layers: tuple[str, str] | None) -> str:
    return MISSING if layers is None else layers[0] if layers[0] == layers[1] else f"{layers[0]} … {layers[1]}"


def _counts(found: list[CaptureAttribution]) -> dict[str, int]:
    return {h: sum(f.attribution.counts()[h] for f in found) for h in (MATCHED, BETWEEN, UNATTRIBUTED)}


def format_capture_attribution(group: str, found: list[CaptureAttribution], top: int = 15) -> str:
    """One step group's replayed kernels as the capture launched them."""
    first, how = found[0], _counts(found)
    items = sum(how.values())
    head = (f"{cut(group)}: replayed kernels attributed from {cut(first.group.name)} "
            f"({Path(first.group.source).name}) by kernel name over {len(found):,} "
            f"step{'' if len(found) == 1 else 's'}: {1 - how[UNATTRIBUTED] / items:.1%} of {items:,} "
            f"({how[MATCHED]:,} matched, {how[BETWEEN]:,} between matched ones in one call, "
            f"{how[UNATTRIBUTED]:,} unattributed)")

    def by_table(by: str, title: str) -> list[str]:
        rows: list[Total] = totals(found, by)
        shown = f" (top {top} of {len(rows)})" if len(rows) > top else ""
        return ["", f"{title}{shown}", table([(t.key, f"{t.kernels:,.1f}", format_us(t.gpu_ns)) for t in rows[:top]],
                                             headers=["", "kernels", "GPU µs"])]

    out = [head, *by_table("op", "by the op that launched them at capture (per step)"),
           *by_table("module", "by the module that launched them at capture (per step)")]
    if first.group.graphs > 1:
        out += ["", "pieces (per step; layers: the decoder layers the capture's module frames name, - where none)",
                table([(p, f"{k:,.1f}", format_us(ns), _layers(layers)) for p, k, ns, layers in _pieces(found)],
                      headers=["piece", "kernels", "GPU µs", "layers"])]
    return "\n".join(out)


def capture_attribution_dict(group: str, found: list[CaptureAttribution]) -> dict[str, Any]:
    first = found[0]
    return {"step_group": group, "capture": first.group.name, "source": first.group.source, "steps": len(found),
            "how": _counts(found),
            "by_op": [vars(t) for t in totals(found, "op")], "by_module": [vars(t) for t in totals(found, "module")],
            "pieces": [{"piece": p, "kernels": k, "gpu_ns": ns, "layers": layers and list(layers)}
                       for p, k, ns, layers in _pieces(found)] if first.group.graphs > 1 else None}
