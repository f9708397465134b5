"""A plan's rows (the chosen plan, the engines' defaults, the frontier), its table and JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from graphrt.plan.engine_lists import said
from graphrt.plan.measure_sizes import SizeFigures
from graphrt.plan.optimize import Plan, Problem, evaluate
from graphrt.plan.size_rounds import LEVEL, MODES, WIDE
from graphrt.measure.robust import OUTLIER_MADS
from graphrt.units import MIB, MISSING


def problem_for(figures: list[SizeFigures], traffic: dict[int, int]) -> Problem:
    """The optimizer's problem: per size 1..M, the traffic's steps and the figures in integer
    units (step ns, bytes, capture us), so that sums are exact and ties real."""
    return Problem(
        weights=tuple(traffic.get(f.batch, 0) for f in figures),
        eager_ns=tuple(round(f.eager_ms * 1e6) for f in figures),
        graph_ns=tuple(round(f.graph_ms * 1e6) for f in figures),
        inc_bytes=tuple(max(0, f.graph_bytes) for f in figures),
        first_bytes=tuple(max(0, f.first_graph_bytes) for f in figures),
        inc_us=tuple(round(max(0.0, f.capture_s) * 1e6) for f in figures),
        first_us=tuple(round(max(0.0, f.first_capture_s) * 1e6) for f in figures))


@dataclass(frozen=True)
class Row:
    """One list of sizes, evaluated over the traffic."""

    name: str
    plan: Plan
    padding: bool = True  # a batch pads up to the next captured size (else only exact sizes replay)
    unused: int = 0  # sizes of the list above every batch of the traffic, left out of its figures


def baseline(problem: Problem, name: str, sizes: tuple[int, ...], largest: int, padding: bool = True,
             unused: int = 0) -> Row:
    """A list as an engine runs it: the sizes that can serve this traffic (up to the first that
    holds its `largest` batch, or up to it without padding) are evaluated; those above serve
    none of it and are counted as unused, not charged, with `unused` others of the list (those
    no decode step replays)."""
    cover = next((s for s in sorted(sizes) if s >= largest), None) if padding else largest
    kept = tuple(s for s in sorted(set(sizes)) if cover is None or s <= cover)
    return Row(name, evaluate(problem, kept, padding), padding, len(set(sizes)) - len(kept) + unused)


def row_dict(row: Row) -> dict[str, Any]:
    plan = row.plan
    return {"name": row.name, "sizes": list(plan.sizes), "padding": row.padding,
            "unused_sizes": row.unused, "expected_ms": plan.mean_ms,
            "padding_share": plan.padded_rows / plan.rows if plan.rows else 0.0,
            "eager_share": plan.eager_steps / plan.steps, "graph_bytes": plan.memory_bytes,
            "capture_s": plan.capture_us / 1e6}


def _sizes_text(sizes: list[int], limit: int = 12) -> str:
    text = ",".join(map(str, sizes[:limit]))
    return text + (f",… ({len(sizes)})" if len(sizes) > limit else "") if sizes else MISSING


def _ends_text(sizes: list[int]) -> str:
    """A long list by its first and last sizes, and how many there are."""
    if len(sizes) <= 10:
        return ",".join(map(str, sizes))
    return f"{','.join(map(str, sizes[:5]))},…,{','.join(map(str, sizes[-3:]))} ({len(sizes)} sizes)"


def vs_chosen_text(vs: dict[str, Any] | None, noisy: bool) -> tuple[str, str]:
    """A row's "vs chosen" and its interval, as the table says them: no ranking where the
    difference lies inside its interval, or where the machine was too noisy to choose."""
    if vs is None:  # the chosen plan itself
        return MISSING, MISSING
    if vs["interval"] is None:
        return f"{vs['ratio']:+.1%}", "unknown"
    low, high = vs["interval"]
    said = ("too noisy" if noisy else f"{vs['ratio']:+.1%}" if vs["measurable"] else "no measurable difference")
    return said, f"{low:+.1%}..{high:+.1%}"


def table(rows: list[dict[str, Any]], noisy: bool = False) -> str:
    """The chosen plan (first row) against the others (each with its `vs_chosen`)."""
    body = [[r["name"], len(r["sizes"]) if not r["unused_sizes"] else f"{len(r['sizes'])} (+{r['unused_sizes']} unused)",
             f"{r['expected_ms']:.4f}", *vs_chosen_text(r.get("vs_chosen"), noisy),
             f"{100 * r['padding_share']:.1f}", f"{100 * r['eager_share']:.1f}",
             f"{r['graph_bytes'] / MIB:.3f}", f"{r['capture_s']:.3f}", _sizes_text(r["sizes"])]
            for r in rows]
    headers = ["plan", "graphs", "mean step ms", "vs chosen", f"{LEVEL:.0%} interval", "padding %", "eager %",
               "graph MiB", "capture s", "sizes"]
    return tabulate(body, headers=headers, disable_numparse=True, colalign=("left", *["right"] * 8, "left"))


def frontier_table(frontier: list[dict[str, Any]]) -> str:
    body = [[f["graphs"], f"{f['expected_ms']:.4f}", f"{f['graph_bytes'] / MIB:.3f}", f"{f['capture_s']:.3f}",
             _sizes_text(f["sizes"])] for f in frontier]
    return tabulate(body, headers=["graphs", "best mean step ms", "graph MiB", "capture s", "sizes"],
                    disable_numparse=True, colalign=("right", "right", "right", "right", "left"))


def frontier_dicts(plans: dict[int, Plan]) -> list[dict[str, Any]]:
    return [{"graphs": k, **{key: v for key, v in row_dict(Row("", plan)).items()
                             if key in ("sizes", "expected_ms", "graph_bytes", "capture_s")}}
            for k, plan in plans.items()]


def engine_lines(listed: list[dict[str, Any]]) -> list[str]:
    """Each engine's list: what it assumed, its sizes, and its note."""
    lines = []
    for e in listed:
        full = e["full_graphs_up_to"]
        lines.append(f"{e['name']}: {said(e['assumed'])}")
        lines.append(f"    {_ends_text(e['sizes'])}" + (f"; decode replays full graphs up to {full}"
                                                         if full is not None and full < e["sizes"][-1] else ""))
        if e["note"]:
            lines.append(f"    note: {e['note']}")
    return lines


def export_lines(export: dict[str, dict]) -> list[str]:
    return [f"vLLM:          {export['vllm']['cli']}",
            f"SGLang:        {export['sglang']['cli']}",
            "TensorRT-LLM:  " + export["tensorrt_llm"]["yaml"].rstrip().replace("\n", "\n               "),
            f"graphrt:       {export['graphrt']['cli']}"]


def rounds_lines(per_size: list[dict[str, Any]], rounds: int, limit: int = 8) -> list[str]:
    """How the measured sizes were timed: the figures that earned extra rounds, and every
    outlier left out, by size and mode (the first `limit` of each)."""
    measured = [f for f in per_size if f["measured"] and f.get("eager_rounds_ms")]
    extra = [f"{f['batch']} {mode} ({len(f[f'{mode}_rounds_ms'])})" for f in measured for mode in MODES
             if len(f[f"{mode}_rounds_ms"]) > rounds]
    left = [(f["batch"], mode, f[f"{mode}_outliers_ms"], f[f"{mode}_ms"]) for f in measured for mode in MODES
            if f[f"{mode}_outliers_ms"]]
    lines = []
    if extra:
        lines.append(f"wider than ±{WIDE:.0%} after {rounds} rounds, timed again: batch "
                     + ", ".join(extra[:limit]) + (f", … ({len(extra)})" if len(extra) > limit else ""))
    if left:
        count = sum(len(out) for _, _, out, _ in left)
        named = [f"batch {b} {mode} {len(out)} (up to {max(out):.3f} ms, median {ms:.3f})"
                 for b, mode, out, ms in left[:limit]]
        lines.append(f"outliers left out (beyond median + {OUTLIER_MADS:g} MAD of their size and mode): "
                     f"{count} steps: " + ", ".join(named) + (f", … ({len(left)} sizes and modes)"
                                                              if len(left) > limit else ""))
    return lines
