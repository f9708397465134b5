"""`graphrt analyze` finds a serving engine's steps by its own markers and tells, step by step,
whether each replayed a graph, ran pieces or fell back to eager.

Every figure is set against a count written here from the raw JSON, apart from graphrt's reader:
a step is the innermost engine annotation; its calls are the runtime calls its thread began
inside it; its kernels are those whose correlation is one of those calls'.

Two sources of real traces: the engines' own (TraceLens's vLLM and SGLang test traces, recorded
on MI300 GPUs; tests/data/engines/README.md says where they come from, and these tests skip
where they are absent), and a real CUDA-graph trace (HTA's V100 training trace) whose
`ProfilerStep#N` ranges are renamed here to an engine's decode markers, with one step's graph
launch taken out to plant a decode step that ran eagerly."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from decimal import Decimal
from pathlib import Path

import nsys_runs
import pytest
from click.testing import CliRunner
from docs_pages import ROOT, examples
from engine_traces import engine_trace

from graphrt.cli.main import main
from graphrt.units import MISSING

DATA = Path(__file__).parents[1] / "data"
V100 = DATA / "torch" / "hta-v100-graph-launches.json.gz"
ENGINE_TRACES = {  # TraceLens tests/traces/inference/<case>/<file>
    "vllm_decode_full": "graph_execution.json.gz",
    "vllm_prefilldecode_piecewise": "graph_execution.json.gz",
    "sglang_decode": "sglang_Qwen3-8B_decode.json.gz",
    "sglang_prefilldecode": "sglang_Qwen3-8B_prefilldecode.json.gz",
}
MARKER = re.compile(r"execute_|step\[")
GRAPH_LAUNCH = re.compile(r"(cuda|cu|hip)GraphLaunch")
KERNEL_LAUNCH = re.compile(r"(cudaLaunch|cuLaunch|hipLaunch|hipModuleLaunch|hipExtModuleLaunch)")


# ---------------------------------------------------------------------------------------------
# The count written apart from the reader


def _ns(us) -> int:
    return int((Decimal(repr(us)) * 1000).to_integral_value())


def _busy(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def raw_steps(doc: dict) -> list[dict]:
    """Per step (the innermost engine annotation), by start: the phase and batch its name states
    and what its thread launched inside it."""
    events = doc["traceEvents"]
    marks = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and MARKER.match(e["name"])]
    inside = [m for m in marks if not any(o is not m and o["tid"] == m["tid"] and m["ts"] <= o["ts"]
                                          and o["ts"] + o["dur"] <= m["ts"] + m["dur"] for o in marks)]
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    steps = []
    for m in sorted(inside, key=lambda e: e["ts"]):
        mine = [c for c in calls if (c["pid"], c["tid"]) == (m["pid"], m["tid"]) and m["ts"] <= c["ts"] <= m["ts"] + m["dur"]]
        graphs = [c for c in mine if GRAPH_LAUNCH.match(c["name"])]
        launches = [c for c in mine if KERNEL_LAUNCH.match(c["name"])]
        ids = {c["args"]["correlation"] for c in graphs + launches}
        ran = [k for k in kernels if k["args"].get("correlation") in ids]
        between = []
        if len(graphs) > 1:
            first, last = min(g["ts"] for g in graphs), max(g["ts"] for g in graphs)
            eager_ids = {c["args"]["correlation"] for c in launches if first < c["ts"] < last}
            between = [k for k in ran if k["args"]["correlation"] in eager_ids]
        steps.append({"name": m["name"], **_stated(m["name"]), "graph_launches": len(graphs),
                      "kernel_launches": len(launches), "kernels": len(ran),
                      "mode": "eager" if not graphs else "graph" if len(graphs) == 1 else "piecewise",
                      "gpu_busy_ns": _busy([(_ns(k["ts"]), _ns(k["ts"]) + _ns(k["dur"])) for k in ran]),
                      "between": len(between), "between_ns": sum(_ns(k["dur"]) for k in between)})
    return steps


def _stated(name: str) -> dict:
    """The phase and batch an engine's marker name states, read here on its own."""
    if m := re.search(r"context_(\d+)\(.*?\)_generation_(\d+)\(", name):
        ctx, gen = int(m.group(1)), int(m.group(2))
        return {"phase": "mixed" if ctx and gen else "prefill" if ctx else "decode", "batch": ctx + gen}
    m = re.match(r"step\[(\w+) bs=(\d+)", name)
    return {"phase": {"DECODE": "decode", "EXTEND": "prefill", "MIXED": "mixed"}[m.group(1)], "batch": int(m.group(2))}


# ---------------------------------------------------------------------------------------------
# Running graphrt


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _save(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def analyze(tmp_path: Path, *args) -> tuple[int, str, str, dict | None]:
    """(exit code, stdout, stderr, the --json figures) of `graphrt analyze ARGS --json ...`."""
    out = tmp_path / "figures.out"
    result = CliRunner().invoke(main, ["analyze", *map(str, args), "--json", str(out)])
    return result.exit_code, result.stdout, result.stderr, json.loads(out.read_text()) if out.exists() else None


def _figures(step: dict) -> dict:
    keys = ("phase", "batch", "mode", "graph_launches", "kernel_launches", "kernels")
    return {k: step[k] for k in keys}


# ---------------------------------------------------------------------------------------------
# The engines' own traces


def _engine_trace(case: str) -> Path:
    return engine_trace(f"{case}/{ENGINE_TRACES[case]}")


@pytest.mark.parametrize("case", list(ENGINE_TRACES))
def test_every_engine_step_is_found_with_the_figures_counted_from_the_raw_json(case, tmp_path):
    path = _engine_trace(case)
    expected = raw_steps(_load(path))
    code, text, _, figures = analyze(tmp_path, path)
    assert code == 0
    (trace,) = figures["traces"]
    assert [s["name"] for s in trace["steps"]] == [s["name"] for s in expected]
    assert [_figures(s) for s in trace["steps"]] == [_figures(s) for s in expected]
    for got, want in zip(trace["steps"], expected):
        assert abs(got["gpu_busy_ns"] - want["gpu_busy_ns"]) <= got["kernels"]  # ns rounding, at most 1 a kernel
        pieces = got["eager_between_pieces"]
        assert (pieces and (pieces["kernels"], pieces["gpu_ns"])) == ((want["between"], want["between_ns"])
                                                                     if want["mode"] == "piecewise" else None)
    # the ledger counts them, first in the text
    assert sum(row["steps"] for row in trace["ledger"]) == len(expected)
    assert text.index("Steps by phase, mode and batch") < text.index("Step by step") < text.index("Kernels per device")


def test_sglangs_step_inside_a_vllm_style_annotation_counts_once_as_sglangs(tmp_path):
    _, text, _, figures = analyze(tmp_path, _engine_trace("sglang_decode"))
    (step,) = figures["traces"][0]["steps"]
    assert (step["marker"], step["engine"]) == ("SGLang step[...]", "SGLang")
    assert "1 step, marked by SGLang step[...]" in text


def test_vllms_piecewise_step_names_what_ran_eagerly_between_its_pieces(tmp_path):
    (step,) = analyze(tmp_path, _engine_trace("vllm_prefilldecode_piecewise"))[3]["traces"][0]["steps"]
    assert step["mode"] == "piecewise" and step["graph_launches"] > 1
    between = step["eager_between_pieces"]
    assert 0 < between["kernels"] < step["kernels"]
    assert between["share_of_gpu_busy"] == pytest.approx(between["gpu_ns"] / step["gpu_busy_ns"])


# ---------------------------------------------------------------------------------------------
# A real CUDA-graph trace with engine markers: the fallback planted


def _profiler_steps(doc: dict) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _graph_launch_in(doc: dict, step: dict) -> dict:
    """The one graph launch a step's thread made inside it."""
    (launch,) = [e for e in doc["traceEvents"] if e.get("name") == "cudaGraphLaunch" and e["tid"] == step["tid"]
                 and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    return launch


def as_decode_steps(batches: list[int | str], eager: int | set[int] = frozenset(),
                    pieces: set[int] = frozenset()) -> dict:
    """The V100 trace with its i-th ProfilerStep renamed to vLLM's marker of a decode step of
    batches[i] (or to batches[i] itself, where it is a name); each step of `eager` has its graph
    launch on its thread (and the kernels that launch ran) taken out, so it launches every
    kernel itself; each step of `pieces` has its graph launch split in two (`_in_pieces`)."""
    doc = _load(V100)
    steps = _profiler_steps(doc)
    for step, batch in zip(steps, batches, strict=True):
        step["name"] = batch if isinstance(batch, str) else f"execute_context_0(0)_generation_{batch}({batch})"
    for i in ({eager} if isinstance(eager, int) else eager):
        launch = _graph_launch_in(doc, steps[i])
        gone = launch["args"]["correlation"]
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e is not launch and not (
            e.get("cat") == "kernel" and e["args"].get("correlation") == gone)]
    for i in pieces:
        _in_pieces(doc, _graph_launch_in(doc, steps[i]))
    return doc


def _in_pieces(doc: dict, launch: dict) -> None:
    """Split a graph launch in two, as a piecewise step launches its pieces: a second launch
    right after the first runs the latter half of its kernels."""
    first = launch["args"]["correlation"]
    second = 1 + max(e["args"]["correlation"] for e in doc["traceEvents"] if "correlation" in e.get("args", {}))
    doc["traceEvents"].append({**launch, "ts": launch["ts"] + launch["dur"], "args": {**launch["args"], "correlation": second}})
    ran = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("correlation") == first),
                 key=lambda e: e["ts"])
    for kernel in ran[len(ran) // 2:]:
        kernel["args"] = {**kernel["args"], "correlation": second}


@pytest.mark.slow
def test_a_decode_step_that_ran_eagerly_among_replays_is_named_with_its_batch(tmp_path):
    doc = as_decode_steps([8, 8, 17, 8, 8, 8], eager=2)
    code, text, _, figures = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))
    assert code == 0
    trace = figures["traces"][0]
    assert [_figures(s) for s in trace["steps"]] == [_figures(s) for s in raw_steps(doc)]
    assert [s["mode"] for s in trace["steps"]] == ["graph", "graph", "eager", "graph", "graph", "graph"]
    assert ("silent fallback: 1 decode step ran eagerly (batch 17: 1 step) while 5 decode steps replayed a graph "
            "(batch 8: 5 steps)") in text
    assert trace["fallback"]["eager_batches"] == [{"batch": 17, "steps": 1}]
    assert trace["fallback"]["eager_step_starts_ns"] == [trace["steps"][2]["start_ns"]]
    assert [(r["phase"], r["mode"], r["batch"], r["steps"]) for r in trace["ledger"]] == [
        ("decode", "graph", 8, 5), ("decode", "eager", 17, 1)]


@pytest.mark.slow
def test_the_ledger_and_the_fallback_list_batches_smallest_first_and_unstated_last(tmp_path):
    doc = as_decode_steps([16, "decode_step[eager]", 17, 3, 8, 2], eager={1, 2, 3})
    _, text, _, figures = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))
    trace = figures["traces"][0]
    assert [(r["batch"], r["mode"]) for r in trace["ledger"]] == [
        (2, "graph"), (3, "eager"), (8, "graph"), (16, "graph"), (17, "eager"), (None, "eager")]
    assert [b["batch"] for b in trace["fallback"]["eager_batches"]] == [3, 17, None]
    assert f"ran eagerly (batch 3: 1 step, 17: 1 step, {MISSING}: 1 step) while 3 decode steps replayed" in text
    # the unstated batch is a figure not known, in the ledger and the step table as in every table
    assert re.search(rf"^decode +eager +{re.escape(MISSING)} +1 ", text, re.M)
    assert re.search(rf"^1 .* decode +{re.escape(MISSING)} +eager ", text, re.M)


@pytest.mark.slow
def test_without_the_planted_step_no_fallback_is_named(tmp_path):
    code, text, _, figures = analyze(tmp_path, _save(as_decode_steps([8] * 6), tmp_path / "decode.json.gz"))
    assert code == 0 and "silent fallback" not in text and figures["traces"][0]["fallback"] is None


@pytest.mark.slow
def test_fail_on_eager_decode_exits_non_zero_naming_the_eager_steps(tmp_path):
    planted = _save(as_decode_steps([8, 8, 17, 8, 8, 8], eager=2), tmp_path / "planted" / "decode.json.gz")
    code, _, err, _ = analyze(tmp_path, planted, "--fail-on-eager-decode")
    assert code == 1 and err.strip() == f"error: 1 of 6 decode steps ran eagerly (batch 17) in {planted}"
    clean = _save(as_decode_steps([8] * 6), tmp_path / "clean" / "decode.json.gz")
    assert analyze(tmp_path, clean, "--fail-on-eager-decode")[0] == 0


def test_fail_on_eager_decode_refuses_to_pass_traces_it_cannot_tell_about(tmp_path):
    code, _, err, _ = analyze(tmp_path, V100, "--fail-on-eager-decode")  # ProfilerStep#N: no decode step it can name
    assert code == 1 and "cannot tell whether decode ran without graphs" in err


@pytest.mark.slow
def test_an_eager_step_is_set_against_the_replays_of_its_own_batch(tmp_path):
    doc = as_decode_steps([8] * 6, eager=2)
    _, text, _, figures = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))
    (comparison,) = figures["comparisons"]
    assert (comparison["baseline"], comparison["other"]) == ("decode bs=8 (eager)", "decode bs=8 (graph)")
    assert [(r["batch"], r["mode"], r["steps"]) for r in figures["traces"][0]["ledger"]] == [
        (8, "eager", 1), (8, "graph", 5)]  # within a batch, eager first
    metrics = {m["metric"]: (m["baseline"], m["other"]) for m in comparison["metrics"]}
    assert metrics["graph_launches"] == (0, 1)
    assert "decode bs=8 (graph) against decode bs=8 (eager) (median per step)" in text


@pytest.mark.slow
def test_an_eager_step_is_set_against_the_pieces_of_its_own_batch_too(tmp_path):
    doc = as_decode_steps([8] * 6, eager=0, pieces={3})
    figures = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))[3]
    assert [(r["mode"], r["steps"]) for r in figures["traces"][0]["ledger"]] == [
        ("eager", 1), ("piecewise", 1), ("graph", 4)]
    assert [(c["baseline"], c["other"]) for c in figures["comparisons"]] == [
        ("decode bs=8 (eager)", "decode bs=8 (graph)"), ("decode bs=8 (eager)", "decode bs=8 (piecewise)")]


@pytest.mark.slow
def test_eager_steps_of_one_trace_are_set_against_replays_of_their_batch_in_another(tmp_path):
    eager = _save(as_decode_steps([8] * 6, eager=set(range(6))), tmp_path / "eager" / "fallback.json.gz")
    graph = _save(as_decode_steps([8] * 6), tmp_path / "graph" / "replayed.json.gz")
    figures = analyze(tmp_path, eager, graph)[3]
    assert [(c["baseline"], c["other"]) for c in figures["comparisons"]] == [
        ("fallback.json.gz: decode bs=8 (eager)", "replayed.json.gz: decode bs=8 (graph)")]


@pytest.mark.slow
def test_an_engine_marker_inside_a_profiler_step_makes_the_step_and_keeps_to_its_thread(tmp_path):
    doc = _load(V100)
    for step in _profiler_steps(doc):  # SGLang's marker round the main thread's work of each step
        doc["traceEvents"].append({**step, "name": "step[DECODE bs=8]", "ts": step["ts"] + 1, "dur": step["dur"] - 2})
    trace = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))[3]["traces"][0]
    assert [s["name"] for s in trace["steps"]] == ["step[DECODE bs=8]"] * 6
    # the profiler step held the backward thread's graph launch too; the engine's step does not
    assert [s["graph_launches"] for s in trace["steps"]] == [1] * 6
    assert [_figures(s) for s in trace["steps"]] == [_figures(s) for s in raw_steps(doc)]


@pytest.mark.slow
def test_a_directory_of_rank_files_shows_the_ranks_side_by_side(tmp_path):
    for rank in (0, 1):
        doc = as_decode_steps([8] * 6)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        _save(doc, tmp_path / "run" / f"trace-rank-{rank}.pt.trace.json.gz")
    code, text, _, figures = analyze(tmp_path, tmp_path / "run")
    assert code == 0 and f"== {tmp_path / 'run'}: 2 ranks" in text
    assert [(r["rank"], [g["name"] for g in r["step_groups"]]) for r in figures["ranks"]] == [
        (0, ["decode bs=8 (graph)"]), (1, ["decode bs=8 (graph)"])]


def test_the_manual_shows_what_analyze_prints_of_sglangs_trace(tmp_path):
    (example,) = [e for e in examples(ROOT / "docs" / "traces.md") if e.command.startswith("graphrt analyze sglang_")]
    folder = _engine_trace("sglang_decode").parent
    _, text, _, _ = analyze(tmp_path, *(folder / p for p in example.command.split()[2:]))
    printed = text.splitlines()
    # a line cut short with "..." shows the start of a printed line
    missing = [line for line in example.shown if not any(
        out.startswith(line.removesuffix("...").rstrip()) if line.endswith("...") else out == line for out in printed)]
    assert not missing


def test_without_an_annotation_vllms_runner_function_makes_the_step(tmp_path):
    doc = _load(_engine_trace("vllm_decode_full"))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "user_annotation"]
    (step,) = analyze(tmp_path, _save(doc, tmp_path / "decode.json.gz"))[3]["traces"][0]["steps"]
    (runner,) = [e for e in doc["traceEvents"] if e.get("cat") == "python_function"
                 and e["name"].endswith("gpu_model_runner.py(3380): execute_model")]
    assert (step["name"], step["phase"], step["batch"], step["mode"]) == (runner["name"], "unknown", None, "graph")
    assert step["dur_ns"] == _ns(runner["dur"])


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM: NVTX ranges in its own domain, in Nsight Systems traces

TRTLLM_SCRIPT = """
import time
import nvtx
# as TensorRT-LLM's PyExecutor._forward_step marks each iteration (tensorrt_llm._utils.nvtx_range)
for i, (ctx, tokens, gen) in enumerate([(2, 512, 0), (0, 0, 8), (0, 0, 8), (1, 128, 7)]):
    with nvtx.annotate(f"[Executor] _forward_step {i}: {ctx} ctx reqs, {tokens} ctx tokens, {gen} gen reqs",
                       color="grey", domain="TensorRT-LLM"):
        with nvtx.annotate("_update_requests", domain="TensorRT-LLM"):
            time.sleep(0.002)
"""


@pytest.mark.processes
@pytest.mark.nsys
def test_tensorrt_llms_nvtx_step_ranges_make_its_steps_in_an_nsight_systems_trace(tmp_path):
    if shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems CLI) not on PATH")
    script = tmp_path / "executor.py"
    script.write_text(TRTLLM_SCRIPT)
    nsys_runs.profile(script, tmp_path / "executor", "-t", "nvtx,osrt")
    export = nsys_runs.export(tmp_path / "executor.nsys-rep", tmp_path / "executor.sqlite")
    code, text, err, figures = analyze(tmp_path, export, "--fail-on-eager-decode")
    steps = figures["traces"][0]["steps"]
    assert [(s["engine"], s["phase"], s["batch"]) for s in steps] == [
        ("TensorRT-LLM", "prefill", 2), ("TensorRT-LLM", "decode", 8), ("TensorRT-LLM", "decode", 8),
        ("TensorRT-LLM", "mixed", 8)]
    # no launch call recorded (a CPU): how each step ran cannot be told, and the gate says so
    assert {s["mode"] for s in steps} == {"unknown"}
    assert code == 1 and "cannot tell whether decode ran without graphs" in err


@pytest.mark.slow
def test_steps_caps_the_step_list_and_zero_leaves_the_ledger_alone(tmp_path):
    path = _save(as_decode_steps([8] * 6), tmp_path / "decode.json.gz")
    _, two, _, figures = analyze(tmp_path, path, "--steps", "2")
    assert "Step by step (the first 2 of 6; every step is in --json)" in two
    assert len(figures["traces"][0]["steps"]) == 6
    _, none, _, _ = analyze(tmp_path, path, "--steps", "0")
    assert "Steps by phase, mode and batch" in none and "Step by step" not in none
