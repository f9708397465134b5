"""The device check's one table and gpu-summary.json, from what its steps wrote.

usage: python scripts/gpu_summary.py RESULTS WORK

WORK holds outcomes.txt (each step's planned limit and outcome) and raw/, the files the steps
wrote: run-b1.json, run-qwen3-b1.json, run-hf.json, compile-b1.json, tp1.json, sweep.json, cuda-tests.xml,
probe.json, localize.json, analysis.json, plan.json, trace-*.json (each may be missing: its step failed or
was skipped). Prints the tables, writes RESULTS/gpu-summary.json; exit 1 if a file a step wrote
is unreadable.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from tabulate import tabulate

from graphrt.io import write_json

MIB = 1 << 20


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _outcomes(work: Path) -> list[dict[str, Any]]:
    """Each step in the check's order: its planned limit, and what became of it."""
    lines = (work / "outcomes.txt").read_text().splitlines() if (work / "outcomes.txt").exists() else []
    steps = []
    for line in lines:
        name, _, rest = line.partition("=")
        planned, _, outcome = rest.partition("|")
        steps.append({"step": name, "limit_s": int(planned), "outcome": outcome})
    return steps


def _tests(raw: Path) -> dict[str, int] | None:
    path = raw / "cuda-tests.xml"
    if not path.exists():
        return None
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def _eager_ms(run: dict) -> float | None:
    eager = run["modes"].get("eager")
    return eager["step_ms"]["median"] if eager else None


def _run_rows(run: dict, eager_ms: float | None = None) -> list[dict[str, Any]]:
    """One row per mode of a `graphrt run --json`; speedups against its eager mode, or against
    `eager_ms` (a compile-only run set against the batch-1 run's eager)."""
    eager_ms = _eager_ms(run) or eager_ms
    rows = []
    for mode, m in run["modes"].items():
        eq = m.get("equivalence") or {}
        rows.append({
            "batch": run["batch"], "mode": mode, "p10_ms": m["step_ms"]["p10"],
            "p50_ms": m["step_ms"]["median"], "p90_ms": m["step_ms"]["p90"],
            "speedup_vs_eager": eager_ms / m["step_ms"]["median"] if eager_ms else None,
            "kernels_per_step": m["ops_per_step"], "host_launches_per_step": m["host_launches_per_step"],
            "graph_launches_per_step": m.get("graph_launches_per_step"),
            "copies_per_step": m.get("copies_per_step"),
            "tokens_identical": eq.get("identical"), "max_abs_logit_diff": eq.get("max_abs_logit_diff"),
            # no figure where the roofline does not know the model (one on transformers' forward)
            "achieved_GBps": None if m["achieved_bandwidth"] is None else m["achieved_bandwidth"] / 1e9,
            "share_of_peak": m["bandwidth_share_of_peak"],
            # the step's time over its HBM floor (its bytes at the peak bandwidth)
            "over_hbm_floor": 1 / m["bandwidth_share_of_peak"] if m["bandwidth_share_of_peak"] else None,
            "hf_kernels_per_step": run.get("hf_ops_per_step"),
            "graph_MiB_per_bucket": {bs: {k: None if v is None else v / MIB for k, v in mem.items()}
                                     for bs, mem in m["graph_memory_per_bucket"].items()},
            "prepare_s": m["prepare_s"], "lint_s": m.get("lint_s"),
        })
    return rows


def _memory(per_bucket: dict[str, dict[str, float]]) -> str:
    """Each bucket's figures in MiB; "-" where a figure cannot be the graph's (a negative drop)."""
    return ", ".join(f"{bs}: " + " / ".join("-" if v is None else f"{v:.1f}" for v in mem.values())
                     for bs, mem in per_bucket.items())


def _sweep_rows(sweep: dict) -> list[dict[str, Any]]:
    rows = []
    for point in sweep.get("points", []):
        modes = point["modes"]
        row = {"batch": point["batch"], "context": point["context"]}
        for name, m in modes.items():
            row[f"{name}_ms"] = m["step_ms"]["median"]
        if "graph" in modes:
            row["graph_speedup"] = modes["graph"]["speedup_vs_eager"]
            row["same_tokens"] = modes["graph"]["same_tokens_as_eager"]
        rows.append(row)
    return rows


def _trace_facts(raw: Path) -> dict[str, Any] | None:
    """GPU idle share per step and NVTX overhead, from the trace steps' summaries and the one
    analysis of both traces."""
    summaries = [_load(p) for p in sorted(raw.glob("trace-*.json"))]
    analysis = _load(raw / "analysis.json")
    if not summaries and analysis is None:
        return None
    groups = [{"name": g["name"], "steps": g["steps"], **{k: g["medians"].get(k) for k in
               ("wall_ns", "kernels", "launches", "gpu_busy_ns", "gpu_idle_ns")}}
              for t in (analysis or {}).get("traces", []) for g in t.get("step_groups", [])]
    for g in groups:
        busy, idle = g["gpu_busy_ns"] or 0, g["gpu_idle_ns"] or 0
        g["gpu_idle_share"] = idle / (busy + idle) if busy + idle else None
    attributed = [{k: m[k] for k in ("replay", "unit", "method", "items", "attributed_share")}
                  for m in (analysis or {}).get("replay_modules", [])]
    modes = {mode: facts for summary in summaries for mode, facts in (summary.get("modes") or {}).items()}
    overhead = next((s["nvtx_overhead"] for s in summaries if s.get("nvtx_overhead")), None)
    return {"nvtx_overhead": overhead, "steps": groups, "analysis": analysis,
            "replay_attribution": attributed, "graph_notes": modes.get("graph", {}).get("notes", [])}


def _plan_facts(plan: dict) -> dict[str, Any]:
    """The chosen capture list against the baselines, and how its check went."""
    rows = [{"name": r["name"], "sizes": ",".join(map(str, r["sizes"])) or "-", "expected_ms": r["expected_ms"],
             "padding_share": r["padding_share"], "eager_share": r["eager_share"], "graph_MiB": r["graph_bytes"] / 2**20}
            for r in (plan["chosen"], *plan["baselines"])]
    return {"model": plan["model"], "dtype": plan["dtype"], "measured_sizes": sum(f["measured"] for f in plan["per_size"]),
            "rows": rows, "check": plan["check"]}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    results, work = Path(argv[0]), Path(argv[1])
    raw = work / "raw"
    try:
        runs = [r for r in (_load(raw / f"{name}.json") for name in ("run-b1", "run-qwen3-b1", "run-hf", "tp1")) if r]
        sweep, compiled = _load(raw / "sweep.json"), _load(raw / "compile-b1.json")
        probe, localized = _load(raw / "probe.json"), _load(raw / "localize.json")
        trace, plan = _trace_facts(raw), _load(raw / "plan.json")
        summary = {
            "machine": runs[0]["machine"] if runs else None,
            "steps": _outcomes(work),
            "cuda_tests": _tests(raw),
            "runs": [{"model": run["model"], "tp": run.get("tp", 1), **row} for run in runs for row in _run_rows(run)],
            # a mode whose capture refused the step or whose replay failed: model -> mode -> why
            "refused": {run["model"]: run["refused"] for run in runs if run.get("refused")},
            "compile_b1": _run_rows(compiled, _eager_ms(runs[0]) if runs else None) if compiled else None,
            "sweep": _sweep_rows(sweep) if sweep else None,
            "trace": trace,
            "probe": probe,
            "localize": localized,
            "plan": _plan_facts(plan) if plan else None,
        }
    except (json.JSONDecodeError, ET.ParseError, KeyError, ValueError) as e:
        print(f"gpu_summary: a result file is unreadable ({e!r})")
        return 1
    write_json(results / "gpu-summary.json", summary)

    print("== summary")
    if summary["machine"]:
        m = summary["machine"]
        print(f"{m['device_name']} · torch {m['torch']} · CUDA {m['cuda']}")
    print(tabulate([s.values() for s in summary["steps"]], headers=["step", "limit s", "outcome"]))
    print(f"planned: {sum(s['limit_s'] for s in summary['steps'])} s in all")
    if summary["cuda_tests"]:
        print("CUDA tests: " + ", ".join(f"{v} {k}" for k, v in summary["cuda_tests"].items()))
    keys = ["model", "tp", "batch", "mode", "p10_ms", "p50_ms", "p90_ms", "speedup_vs_eager", "kernels_per_step",
            "host_launches_per_step", "graph_launches_per_step", "copies_per_step", "tokens_identical", "max_abs_logit_diff", "achieved_GBps",
            "share_of_peak", "over_hbm_floor", "hf_kernels_per_step", "prepare_s", "lint_s"]
    compiled_rows = [{"model": compiled["model"], "tp": 1, **r} for r in summary["compile_b1"] or []]
    rows = summary["runs"] + compiled_rows
    if rows:
        print(tabulate([[_fmt(r[k]) for k in keys] for r in rows], headers=keys))
        for r in rows:
            if r["graph_MiB_per_bucket"]:
                kinds = " / ".join(k.removesuffix("_bytes") for k in next(iter(r["graph_MiB_per_bucket"].values())))
                print(f"{r['mode']} memory, batch {r['batch']}, MiB per bucket ({kinds}): "
                      f"{_memory(r['graph_MiB_per_bucket'])}")
    for model, modes in summary["refused"].items():
        for mode, why in modes.items():
            print(f"{model} {mode}: not run: {why}")
    if summary["sweep"]:
        sweep_keys = list(summary["sweep"][0])
        print(tabulate([[_fmt(r.get(k)) for k in sweep_keys] for r in summary["sweep"]], headers=sweep_keys))
    if trace and trace["steps"]:
        step_keys = ["name", "steps", "kernels", "launches", "wall_ns", "gpu_busy_ns", "gpu_idle_ns", "gpu_idle_share"]
        print(tabulate([[_fmt(g[k]) for k in step_keys] for g in trace["steps"]], headers=step_keys))
    for a in trace["replay_attribution"] if trace else []:
        print(f"{a['replay']}: {100 * a['attributed_share']:.1f}% of {a['items']} replayed {a['unit']}s attributed by {a['method']}")
    for note in trace["graph_notes"] if trace else []:
        print(f"graph capture: {note}")
    if trace and trace["nvtx_overhead"]:
        o = trace["nvtx_overhead"]
        print(f"NVTX on vs off (eager step): {100 * o['overhead']:+.2f}% ({o['per_range_us']:.2f} us per range)")
    if probe:
        for session in (probe["replay"], probe["second_session"]):
            linked = session["linked_share"]
            print(f"profiler session {session['profiler_session']}: a replay launches "
                  f"{session['graph_launches_per_replay']:g} graph(s), {session['kernel_launches_per_replay']:g} "
                  f"other launch calls, {session['kernels_per_replay']:g} kernels "
                  f"({'-' if linked is None else f'{100 * linked:.0f}%'} linked to a launch), "
                  f"{session['kernels_outside_the_graph_per_replay']:g} outside the graph: "
                  f"{session['kernels_outside_the_graph'] or 'none'}")
        for name, t in probe["profiler_tax"].items():
            print(f"after two torch.profiler sessions, {name} steps: {t['before_ms']:.3f} -> "
                  f"{t['after_ms']:.3f} ms ({100 * t['slowdown']:+.1f}%)")
    if localized:
        print(f"localizer, planted bug in {localized['planted']['module']}: "
              f"{'named it' if localized['named_the_planted_module'] else 'DID NOT name it'}; clean step: "
              f"{'no difference' if localized['clean_found_nothing'] else 'A FALSE REPORT'}")
    if summary["plan"]:
        p = summary["plan"]
        print(f"plan, {p['model']} {p['dtype']}, {p['measured_sizes']} sizes measured:")
        print(tabulate([[_fmt(v) for v in r.values()] for r in p["rows"]], headers=list(p["rows"][0])))
        if check := p["check"]:
            print(f"plan check, {check['steps']} steps: measured {check['measured']['ms']:.3f} ms, sizes re-timed "
                  f"{check['retimed']['ms']:.3f} ms ({'agree' if check['agrees'] else 'DISAGREE'}), plan's figures "
                  f"{check['predicted']['ms']:.3f} ms ({'hold' if check['figures_hold'] else 'DO NOT HOLD'}); "
                  f"graph memory {check['measured_bytes'] / 2**20:.2f} MiB, predicted {check['predicted_bytes'] / 2**20:.2f}")
    print(f"wrote {results / 'gpu-summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
