"""The results document of a bench run: building it, its tables, and comparing two runs.

One JSON document per run (`FORMAT`): the scenario, the machine with its measured and datasheet
ceilings, versions, and per point and mode every figure with the samples behind it. Tables and
comparisons read only the document, so a run printed now and one loaded from disk look alike.

    {"format", "scenario", "device", "dtype", "modes", "peer_note", "machine", "versions",
     "started_at", "finished_at", "partial", "stopped_at",
     "points": [{"model", "tp", "batch", "context", "max_seq_len", "prompt_len", "memory",
                 "modes": {mode: {"step_ms": {median, p10, p90, mean, n}, "spread", "wide",
                                  "samples_ms", "repeat_medians_ms", "host_ms", "tokens_per_s",
                                  "ops_per_step", "host_launches_per_step",
                                  "graph_launches_per_step", "copies_per_step",
                                  "counted_in_profiler_session", "prepare_s",
                                  "graph_memory_bytes", "peak_allocated_bytes", "notes",
                                  "speedup_vs_eager", "speedup_vs_peer",
                                  "same_tokens_as_eager", "roofline"}}}]}
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

from graphrt.backends.base import PrepareReport
from graphrt.backends.peer import NAME as PEER
from graphrt.bench.scenario import Point, Scenario
from graphrt.errors import GraphrtError
from graphrt.measure import hardware
from graphrt.measure.launches import StepLaunches
from graphrt.measure.roofline import Ceilings, StepCost, roofline
from graphrt.measure.stats import Stats
from graphrt.run.decode import Generation
from graphrt.run.machine import machine, versions
from graphrt.units import MIB, MISSING
from graphrt.vocab import Mode

FORMAT = "graphrt-bench/1"
GRAPH_MODES = (Mode.GRAPH, Mode.PIECEWISE)  # the modes whose graphs the memory table shows


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_document(scenario: Scenario, device: torch.device, dtype: torch.dtype,
                 measured: dict[str, Any], modes: tuple[str, ...], peer_note: str | None
                 ) -> dict[str, Any]:
    """A run that has not finished a point yet: `partial` until the last point is in."""
    return {
        "format": FORMAT,
        "scenario": scenario.to_dict(),
        "device": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "modes": list(modes),
        "peer_note": peer_note,  # why the peer is missing, or None when it ran
        "machine": {**machine(device), "measured": measured},
        "versions": versions(),
        "started_at": _now(),
        "finished_at": None,
        "partial": True,
        "stopped_at": None,
        "points": [],
    }


def _distribution(samples: list[float]) -> dict[str, float]:
    s = Stats.of(samples)
    return {"median": s.median, "p10": s.p10, "p90": s.p90, "mean": s.mean, "n": s.n}


def mode_record(runs: list[Generation], prepare: PrepareReport, cost: StepCost | None, limits: Ceilings,
                batch: int, max_spread: float, peak_allocated: int | None) -> dict[str, Any]:
    """One mode at one point: its repeats pooled into one distribution, and its roofline (None
    where the step's cost is not known: a model on transformers' forward outside the lean families)."""
    samples = [ms for run in runs for ms in run.step_ms]
    stats = Stats.of(samples)
    return {
        "step_ms": _distribution(samples),
        "spread": stats.spread,
        "wide": stats.spread > max_spread,
        "samples_ms": samples,
        "repeat_medians_ms": [Stats.of(run.step_ms).median for run in runs],
        "host_ms": _distribution([ms for run in runs for ms in run.host_ms]),
        "tokens_per_s": batch * 1e3 / stats.median,
        **_launch_fields(runs[0].launches),
        "prepare_s": prepare.seconds,
        "capture_setup_s": prepare.capture_setup_seconds,
        "graph_memory_bytes": prepare.memory_bytes,
        "peak_allocated_bytes": peak_allocated,
        "notes": prepare.notes,
        "roofline": None if cost is None else roofline(cost, stats.median / 1e3, limits).to_dict(),
    }


def _launch_fields(launches: StepLaunches | None) -> dict[str, int | None]:
    """A mode's launch figures; None each where its step is not counted (yet)."""
    if launches is None:
        launches = StepLaunches(ops=None)
    return {
        "ops_per_step": launches.ops,
        "host_launches_per_step": launches.host_launches,
        "graph_launches_per_step": launches.graph_launches,
        "copies_per_step": launches.copies,  # cudaMemcpy*/cudaMemset* calls (CUDA)
        "counted_in_profiler_session": launches.profiler_session,
    }


def add_launches(point: dict[str, Any], counted: dict[str, StepLaunches]) -> None:
    """A timed point's launch figures, counted after every point was timed (graphrt.bench.sweep)."""
    for mode, launches in counted.items():
        point["modes"][mode].update(_launch_fields(launches))


def point_record(point: Point, scenario: Scenario, seq_len: int, memory: dict[str, Any],
                 modes: dict[str, dict[str, Any]], runs: dict[str, list[Generation]],
                 tokens_comparable: bool) -> dict[str, Any]:
    """A point's modes with what relates them: speedups, and whether tokens match eager's.

    The peer's tokens are comparable only when decoding starts right after the prompt (it
    keeps its own positions; see `peer`)."""
    eager, peer = modes.get("eager"), modes.get(PEER)
    for name, record in modes.items():
        median = record["step_ms"]["median"]
        record["speedup_vs_eager"] = eager["step_ms"]["median"] / median if eager else None
        record["speedup_vs_peer"] = peer["step_ms"]["median"] / median if peer else None
        same = None
        if eager and name != "eager" and (name != PEER or tokens_comparable):
            same = torch.equal(runs[name][0].tokens, runs["eager"][0].tokens)
        record["same_tokens_as_eager"] = same
    return {"model": point.model, "tp": point.tp, "batch": point.batch, "context": point.context,
            "max_seq_len": seq_len, "prompt_len": scenario.prompt_len, "memory": memory,
            "modes": modes}


def default_path(out_dir: str | Path, name: str) -> Path:
    """`<out_dir>/<name>-<local time>.json`, never an existing file's name."""
    stem = f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, n = Path(out_dir) / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = Path(out_dir) / f"{stem}-{n}.json"
    return path


def load_results(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise GraphrtError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphrtError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphrtError(f"{path}: not a graphrt bench result (expected format {FORMAT!r})")
    return doc


# --- tables --------------------------------------------------------------------------------


def _g(value: float | None, spec: str = ".3g") -> str | None:
    """Three significant digits, but whole numbers from 100 up (3237, not 3.24e+03)."""
    if value is None:
        return None
    return f"{value:.0f}" if spec == ".3g" and abs(value) >= 100 else format(value, spec)


def _x(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}x"


def header(doc: dict[str, Any]) -> list[str]:
    s, machine = doc["scenario"], doc["machine"]
    measured = machine["measured"]
    peak = measured["peak"]
    lines = [
        f"{s['name']} · {machine['device_name']} ({doc['device']}) · {doc['dtype']} · "
        f"{s['steps']} timed steps after {s['warmup']} warmup, x{s['repeats']} repeats",
        f"measured here: copy {hardware.rate(measured['copy_bandwidth'], 'B/s')}, "
        f"{measured['matmul_dtype']} matmul {hardware.rate(measured['matmul_flops'], 'FLOP/s')}"
        + ("" if peak is None else f" · datasheet {peak['name']}: {hardware.rate(peak['bandwidth'], 'B/s')}, "
           f"{hardware.rate(peak['bf16_flops'], 'FLOP/s')} dense bf16 ({peak['source']})"),
    ]
    known = [m["roofline"] for p in doc["points"] for m in p["modes"].values() if m["roofline"]]
    if known:
        r = known[0]
        lines.append(f"roofline against {r['bandwidth_source']} bandwidth and {r['flops_source']} "
                     f"FLOP/s: ridge at {r['ridge']:.3g} FLOP/byte")
    return lines


# a roofline's fields where its cost is not known: shown as MISSING
_NO_ROOFLINE = {"achieved_bandwidth": None, "bandwidth_share": None, "intensity": None, "bound": None}


def table(doc: dict[str, Any]) -> str:
    """One row per point and mode: step time distribution, speedups, host time, work, roofline."""
    cuda = doc["device"] == "cuda"
    peer = PEER in doc["modes"]
    rows = []
    for p in doc["points"]:
        for mode, m in p["modes"].items():
            t, r = m["step_ms"], m["roofline"] or _NO_ROOFLINE
            rows.append([
                p["model"], p.get("tp", 1), p["batch"], p["context"], mode, _g(t["median"]), _g(t["p10"]),
                _g(t["p90"]), f"{m['spread']:.2f}" + (" !" if m["wide"] else ""),
                _x(m["speedup_vs_eager"]) if mode != "eager" else None,
                *([_x(m["speedup_vs_peer"]) if mode != PEER else None] if peer else []),
                _g(m["host_ms"]["median"]), m["ops_per_step"],
                *([m["host_launches_per_step"], m.get("graph_launches_per_step"), m.get("copies_per_step")]
                  if cuda else []),
                _g(m["tokens_per_s"]), _g(r["achieved_bandwidth"] and r["achieved_bandwidth"] / 1e9),
                _g(r["bandwidth_share"] and 100 * r["bandwidth_share"], ".1f"), _g(r["intensity"]), r["bound"],
            ])
    headers = ["model", "tp", "batch", "context", "mode", "ms p50", "p10", "p90", "spread", "vs eager",
               *(["vs hf"] if peer else []), "host ms",
               *(["kernels", "launches", "graphs", "copies"] if cuda else ["aten ops"]),
               "tok/s", "GB/s", "% BW", "FLOP/B", "bound"]
    return tabulate(rows, headers=headers, missingval=MISSING, disable_numparse=True)


def memory_table(doc: dict[str, Any]) -> str:
    cuda = doc["device"] == "cuda"
    shown = [m for m in GRAPH_MODES if m in doc["modes"]]
    rows = []
    for p in doc["points"]:
        mem, modes = p["memory"], p["modes"]
        graphs = [modes.get(m, {}).get("graph_memory_bytes") for m in shown]
        row = [p["model"], p.get("tp", 1), p["batch"], p["context"], p["max_seq_len"],
               _g(mem["parameter_bytes"] / MIB, ".1f"), _g(mem["cache_bytes"] / MIB, ".1f"),
               *(_g(g / MIB, ".1f") if g is not None else None for g in graphs)]
        if cuda:
            row += [_g(mem["after_load"]["allocated"] / MIB, ".1f"),
                    _g(mem["after_cache"]["allocated"] / MIB, ".1f"),
                    _g(mem["after_cache"]["reserved"] / MIB, ".1f"),
                    " / ".join(f"{m} {modes[m]['peak_allocated_bytes'] / MIB:.0f}" for m in modes)]
        rows.append(row)
    headers = ["model", "tp", "batch", "context", "cache slots", "params MiB", "KV cache MiB",
               *(f"{m} MiB" if cuda else f"{m} tape MiB" for m in shown),
               *(["alloc after load", "alloc after cache", "reserved", "peak MiB by mode"] if cuda else [])]
    return tabulate(rows, headers=headers, missingval=MISSING, disable_numparse=True)


def notes(doc: dict[str, Any]) -> list[str]:
    s = doc["scenario"]
    lines = [f"! spread (p90 - p10) / median above {s['max_spread']}: a noisy point",
             "vs eager / vs hf: that mode's median step over this one's (above 1x: this is faster)",
             "bytes count every weight once and the whole static KV cache (cache slots), which "
             "graphrt's masked attention reads at every step"]
    if doc["device"] != "cuda":
        lines.append("host ms equals the step on the CPU, and CPU allocator peaks are not measured")
    if doc["peer_note"]:
        lines.append(f"no hf peer: {doc['peer_note']}")
    if any(p.get("tp", 1) > 1 for p in doc["points"]):
        lines.append("tp > 1: a step's time is its slowest rank's; bytes, FLOPs and memory are one "
                     "rank's share (embeddings, lm_head and norms whole on every rank); no hf peer")
    diverged = sorted({f"{m} ({p['model']} tp {p.get('tp', 1)} batch {p['batch']} context {p['context']})"
                       for p in doc["points"] for m, rec in p["modes"].items()
                       if rec["same_tokens_as_eager"] is False})
    if diverged:
        lines.append("tokens differ from eager's: " + ", ".join(diverged))
    seen = []
    for p in doc["points"]:
        for rec in p["modes"].values():
            seen += [n for n in rec["notes"] if n not in seen]
    return lines + seen


def stopped_line(doc: dict[str, Any]) -> str | None:
    """Where an interrupted run stopped, or None if it did not."""
    at = doc["stopped_at"]
    if at is None:
        return None
    where = at["label"] if at["point"] is None else f"point {at['point']} of {at['of']} ({at['label']})"
    if at["mode"]:
        where += f", mode {at['mode']}"
    return f"interrupted at {where}; {len(doc['points'])} of {at['of']} points finished"


# --- compare -------------------------------------------------------------------------------


def _by_key(doc: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    return {(p["model"], p.get("tp", 1), p["batch"], p["context"], mode): m  # tp: 1 before it was a key
            for p in doc["points"] for mode, m in p["modes"].items()}


def compare(a: dict[str, Any], b: dict[str, Any], a_name: str, b_name: str) -> str:
    """Point by point: A's median step, B's, the change, and each one's speedup over eager."""
    lines = []
    for tag, name, doc in (("A", a_name, a), ("B", b_name, b)):
        partial = " (partial)" if doc["partial"] else ""
        lines.append(f"{tag}: {name} · {doc['scenario']['name']} · {doc['machine']['device_name']} "
                     f"· {doc['dtype']} · {doc['started_at']}{partial}")
    if (a["machine"]["device_name"], a["dtype"]) != (b["machine"]["device_name"], b["dtype"]):
        lines.append("note: different devices or dtypes; the change is not only the code's")
    left, right = _by_key(a), _by_key(b)
    rows = []
    for key in [*left, *(k for k in right if k not in left)]:
        ma, mb = left.get(key), right.get(key)
        ta = ma and ma["step_ms"]["median"]
        tb = mb and mb["step_ms"]["median"]
        change = f"{100 * (tb - ta) / ta:+.1f}%" if ta and tb else None
        noisy = " !" if (ma and ma["wide"]) or (mb and mb["wide"]) else ""
        rows.append([*key, _g(ta), _g(tb), change and change + noisy,
                     _x(ma and ma["speedup_vs_eager"]) if key[-1] != "eager" else None,
                     _x(mb and mb["speedup_vs_eager"]) if key[-1] != "eager" else None])
    lines.append(tabulate(rows, headers=["model", "tp", "batch", "context", "mode", "A ms", "B ms",
                                         "change", "A vs eager", "B vs eager"],
                          missingval=MISSING, disable_numparse=True))
    lines.append("change: B's median step against A's (negative: B is faster); "
                 f"! a noisy point on either side; {MISSING} the point is missing on one side")
    return "\n".join(lines)
