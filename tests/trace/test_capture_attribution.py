"""Given an engine's capture trace beside its serving trace, `graphrt analyze` gives each replayed
kernel the op and module that launched it at capture (graphrt.trace.analysis.engine_capture), and
leaves unattributed what it cannot match.

The ground truth is written here from the raw JSON, apart from the reader: the i-th launch call
inside the capture's stream capture, the outermost CPU op and the innermost `nn.Module` frame open
on its thread when it began. On TraceLens's vLLM and SGLang pairs (tests/data/engines/README.md;
skipped where absent) the replayed kernels are the captured ones in order, so each replayed
kernel's truth is its captured twin's; a piecewise step's k-th graph launch replays the k-th
captured piece."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_traces import engine_trace

from graphrt.cli.main import main
from graphrt.trace import load_trace
from graphrt.trace.analysis.engine_capture import attribute, captures, totals
from graphrt.trace.analysis.timeline import step_timelines

PAIRS = {  # case: (serving trace, capture trace)
    "sglang_decode": ("sglang_Qwen3-8B_decode.json.gz", "capture_traces/bs_32_rank0.json.gz"),
    "vllm_decode_full": ("graph_execution.json.gz",
                         "capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"),
    "vllm_prefilldecode_piecewise": ("graph_execution.json.gz",
                                     "capture_traces/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"),
}
LAUNCH = re.compile(r"hip(Ext)?(Module)?LaunchKernel|cudaLaunchKernel")


def _pair(case: str) -> tuple[Path, Path]:
    return tuple(engine_trace(f"{case}/{name}") for name in PAIRS[case])


def _load(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _open_at(spans: list[dict], call: dict) -> list[dict]:
    """The spans open on the call's thread when it began, outermost first."""
    return sorted((s for s in spans if (s["pid"], s["tid"]) == (call["pid"], call["tid"])
                   and s["ts"] <= call["ts"] <= s["ts"] + s["dur"]), key=lambda s: (s["ts"], -s["dur"]))


def captured_truth(events: list[dict]) -> list[dict]:
    """Per launch call inside a stream capture, in order: its kernel, the outermost CPU op and the
    innermost module (class, `_N` dropped) open around it, and which capture (piece) it is in."""
    begins = sorted((e for e in events if e.get("name", "").endswith("StreamBeginCapture")), key=lambda e: e["ts"])
    ends = sorted((e for e in events if e.get("name", "").endswith("StreamEndCapture")), key=lambda e: e["ts"])
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    modules = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    truth = []
    for piece, (b, e) in enumerate(zip(begins, ends)):
        calls = sorted((c for c in events if c.get("cat") == "cuda_runtime" and LAUNCH.fullmatch(c["name"])
                        and c["tid"] == b["tid"] and b["ts"] <= c["ts"] <= e["ts"]), key=lambda c: c["ts"])
        for c in calls:
            op, module = _open_at(ops, c)[:1], _open_at(modules, c)[-1:]
            truth.append({"kernel": c["args"]["kernel"], "piece": piece,
                          "op": op[0]["name"] if op else "(no op)",
                          "module": re.sub(r"_\d+$", "", module[0]["name"].removeprefix("nn.Module: ")) if module
                          else "(no module)"})
    return truth


def replayed(events: list[dict]) -> list[dict]:
    """The kernels the serving trace's graph launches ran, by start, each with its launch's ordinal."""
    launches = sorted((e for e in events if e.get("name") == "hipGraphLaunch"), key=lambda e: e["ts"])
    ordinal = {g["args"]["correlation"]: k for k, g in enumerate(launches)}
    kernels = [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in ordinal]
    return [{"name": k["name"], "launch": ordinal[k["args"]["correlation"]], "dur": k["dur"]}
            for k in sorted(kernels, key=lambda k: k["ts"])]


def analyze(tmp_path: Path, *paths) -> tuple[str, dict]:
    out = tmp_path / "figures.out"
    result = CliRunner().invoke(main, ["analyze", *map(str, paths), "--json", str(out), "--top", "100"])
    assert result.exit_code == 0, result.output
    return result.stdout, json.loads(out.read_text())


def _per_key(truth: list[dict], kernels: list[dict], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in truth:
        counts[t[key]] = counts.get(t[key], 0) + 1
    return counts


@pytest.mark.parametrize("case", list(PAIRS))
def test_every_replayed_kernel_takes_the_op_and_module_its_captured_twin_was_launched_in(case, tmp_path):
    serving, capture = _pair(case)
    truth, kernels = captured_truth(_load(capture)), replayed(_load(serving))
    assert [t["kernel"] for t in truth] == [k["name"] for k in kernels]  # the replay is the capture, in order
    text, figures = analyze(tmp_path, serving, capture)
    (found,) = figures["capture_attribution"]
    assert found["how"] == {"matched": len(kernels), "between": 0, "unattributed": 0}
    for by in ("op", "module"):
        assert {t["key"]: t["kernels"] for t in found[f"by_{by}"]} == _per_key(truth, kernels, by)
    assert f"100.0% of {len(kernels):,}" in text


def test_each_piece_of_a_piecewise_step_is_the_graph_its_launch_replayed(tmp_path):
    serving, capture = _pair("vllm_prefilldecode_piecewise")
    kernels = replayed(_load(serving))
    (found,) = analyze(tmp_path, serving, capture)[1]["capture_attribution"]
    per_launch = [sum(k["launch"] == n for k in kernels) for n in range(max(k["launch"] for k in kernels) + 1)]
    assert [p["kernels"] for p in found["pieces"]] == per_launch
    # vLLM's compiled graph module hides the layers: the capture's frames name none
    assert {p["layers"] is None for p in found["pieces"]} == {True}


def _attributed(serving: Path, capture: Path):
    """graphrt's attribution of the serving trace's first step from the capture trace."""
    groups = captures(load_trace(capture))
    return attribute(step_timelines(load_trace(serving))[0], groups)


def test_a_graph_captured_whole_spans_every_decoder_layer_its_frames_name(tmp_path):
    serving, capture = _pair("sglang_decode")
    layers = [e["name"].removeprefix("nn.Module: ") for e in sorted(_load(capture), key=lambda e: e["ts"])
              if e.get("cat") == "python_function" and re.fullmatch(r"nn\.Module: \w*DecoderLayer_\d+", e["name"])]
    assert _attributed(serving, capture).layers(0) == (layers[0], layers[-1])


def test_launches_the_capture_lacks_are_left_unattributed_never_given_a_wrong_op(tmp_path):
    serving, capture = _pair("sglang_decode")
    events = _load(capture)
    truth = captured_truth(events)
    launches = sorted((c for c in events if c.get("cat") == "cuda_runtime" and LAUNCH.fullmatch(c["name"])
                       and "kernel" in c.get("args", {})), key=lambda c: c["ts"])
    dropped = {id(c) for c in launches[100:140]}  # 40 launches taken out of the capture
    edited = tmp_path / "capture.json.gz"
    edited.write_bytes(gzip.compress(json.dumps({"traceEvents": [e for e in events if id(e) not in dropped]}).encode()))
    found = _attributed(serving, edited)
    ops = [None if stack is None else next((n.removeprefix("op: ") for n in stack if n.startswith("op: ")), "(no op)")
           for stack in found.attribution.stacks]
    assert ops.count(None) >= 1
    # the replay is the unedited capture in order: each kernel's true op is its twin's
    assert all(op is None or op == t["op"] for op, t in zip(ops, truth))


def test_a_capture_whose_calls_name_no_kernel_attributes_nothing_and_says_why(tmp_path):
    serving, capture = _pair("vllm_decode_full")
    events = _load(capture)
    for e in events:
        if e.get("cat") == "cuda_runtime":
            e.get("args", {}).pop("kernel", None)  # as CUDA's runtime events are
    unnamed = tmp_path / "capture.json.gz"
    unnamed.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    text, figures = analyze(tmp_path, serving, unnamed)
    assert figures["capture_attribution"] == [] and "name no kernel" in text


# ---------------------------------------------------------------------------------------------
# Small traces in the engines' format: where the match is ambiguous


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace(tmp_path: Path, name: str, events: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _one_module_two_ops(tmp_path: Path) -> Path:
    """A capture of one module call in which op_a and then op_b each launch a kernel named k."""
    return _trace(tmp_path, "capture.json", [
        _x("user_annotation", "capture_1_DECODE", 0, 100), _x("python_function", "nn.Module: Block_0", 0, 100),
        _x("cuda_runtime", "hipStreamBeginCapture", 1, 1, correlation=1),
        _x("cpu_op", "op_a", 10, 10), _x("cuda_runtime", "hipLaunchKernel", 12, 1, correlation=2, kernel="k"),
        _x("cpu_op", "op_b", 30, 10), _x("cuda_runtime", "hipLaunchKernel", 32, 1, correlation=3, kernel="k"),
        _x("cuda_runtime", "hipStreamEndCapture", 50, 1, correlation=4)])


def _replay(tmp_path: Path, kernels: int) -> Path:
    return _trace(tmp_path, "serving.json", [
        _x("user_annotation", "step[DECODE bs=1]", 0, 100), _x("cuda_runtime", "hipGraphLaunch", 10, 5, correlation=7),
        *(_x("kernel", "k", 20 + 10 * n, 5, tid=0, correlation=7, device=0) for n in range(kernels))])


def test_a_replayed_kernel_two_captured_ops_could_have_launched_is_unattributed(tmp_path):
    found = _attributed(_replay(tmp_path, 1), _one_module_two_ops(tmp_path))
    assert found.attribution.stacks == [None]


def test_the_same_kernels_replayed_in_full_each_take_their_own_op(tmp_path):
    found = _attributed(_replay(tmp_path, 2), _one_module_two_ops(tmp_path))
    assert found.attribution.stacks == [("Block_0", "op: op_a"), ("Block_0", "op: op_b")]


# ---------------------------------------------------------------------------------------------
# What the capture trace holds, read apart from graphrt: every launch, its graph, its marker


def _markers_and_graphs(events: list[dict]) -> list[tuple[str, int]]:
    """Each engine capture marker (`capture_32_DECODE`) with the stream captures begun inside it."""
    begins = [e for e in events if e.get("name", "").endswith("StreamBeginCapture")]
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and re.fullmatch(r"capture_\d+_\w+", e["name"])), key=lambda e: e["ts"])
    return [(m["name"], sum(b["tid"] == m["tid"] and m["ts"] <= b["ts"] <= m["ts"] + m["dur"] for b in begins))
            for m in marks]


@pytest.mark.parametrize("case", list(PAIRS))
def test_each_captured_launch_is_read_with_its_graph_and_marker(case, tmp_path):
    serving, capture = _pair(case)
    events = _load(capture)
    groups = captures(load_trace(capture))
    assert [(g.name, g.graphs) for g in groups] == _markers_and_graphs(events)
    truth = captured_truth(events)
    assert [(launch.kernel, launch.graph) for g in groups for launch in g.launches] == \
        [(t["kernel"], t["piece"]) for t in truth]
    (found,) = analyze(tmp_path, serving, capture)[1]["capture_attribution"]
    assert (found["capture"], found["source"]) == (groups[0].name, str(capture))


@pytest.mark.parametrize("case", list(PAIRS))
def test_totals_are_each_ops_and_modules_kernels_and_gpu_time_a_step_most_first(case):
    serving, capture = _pair(case)
    truth, kernels = captured_truth(_load(capture)), replayed(_load(serving))
    found = _attributed(serving, capture)
    for by in ("op", "module"):
        gpu_us: dict[str, float] = {}
        for t, k in zip(truth, kernels):
            gpu_us[t[by]] = gpu_us.get(t[by], 0) + k["dur"]
        rows = totals([found], by)
        assert {r.key: r.gpu_ns / 1e3 for r in rows} == pytest.approx(gpu_us, abs=0.01)
        assert [r.gpu_ns for r in rows] == sorted((r.gpu_ns for r in rows), reverse=True)
        assert totals([found, found], by) == rows  # the mean a step: the same step twice is that step


# ---------------------------------------------------------------------------------------------
# Two threads capturing at once; pieces that name their layers; launches outside any op or module


def _launch(ts: float, kernel: str, tid: int = 1) -> dict:
    return _x("cuda_runtime", "hipLaunchKernel", ts, 1, tid=tid, correlation=int(ts * 10), kernel=kernel)


def _two_threads(tmp_path: Path) -> Path:
    """Thread 1 captures two pieces under `capture_2_PIECEWISE`, each over three decoder layers (a
    launch of piece 1 outside any module), with no CPU op around any launch; thread 2 captures one
    unmarked graph that begins first, ends last and launches `z` inside thread 1's first piece."""
    frames = [_x("python_function", "nn.Module: Model_0", 0, 150)] + [
        _x("python_function", f"nn.Module: DecoderLayer_{n}", start, 10)
        for n, start in enumerate((5, 20, 35, 85, 100, 115))]
    return _trace(tmp_path, "capture.json", [
        _x("user_annotation", "capture_2_PIECEWISE", 0, 200), *frames,
        _x("cuda_runtime", "hipStreamBeginCapture", 0.5, 0.1, tid=2, correlation=1),
        _launch(15, "z", tid=2),
        _x("cuda_runtime", "hipStreamEndCapture", 300, 1, tid=2, correlation=2),
        _x("cuda_runtime", "hipStreamBeginCapture", 1, 1, correlation=3),
        _launch(8, "k0"), _launch(23, "k1"), _launch(38, "k2"),
        _x("cuda_runtime", "hipStreamEndCapture", 70, 1, correlation=4),
        _x("cuda_runtime", "hipStreamBeginCapture", 80, 1, correlation=5),
        _launch(88, "k3"), _launch(103, "k4"), _launch(118, "k5"), _launch(155, "k6"),
        _x("cuda_runtime", "hipStreamEndCapture", 160, 1, correlation=6)])


def _two_pieces_replayed(tmp_path: Path) -> Path:
    kernels = [("k0", 7), ("k1", 7), ("k2", 7), ("k3", 8), ("k4", 8), ("k5", 8), ("k6", 8)]
    return _trace(tmp_path, "serving.json", [
        _x("user_annotation", "step[DECODE bs=2]", 0, 200),
        _x("cuda_runtime", "hipGraphLaunch", 10, 5, correlation=7), _x("cuda_runtime", "hipGraphLaunch", 45, 2, correlation=8),
        *(_x("kernel", name, 20 + 10 * n, 5, tid=0, correlation=c, device=0) for n, (name, c) in enumerate(kernels))])


def test_captures_on_two_threads_at_once_are_told_apart_by_thread_and_ordered_by_start(tmp_path):
    groups = captures(load_trace(_two_threads(tmp_path)))
    assert [(g.name, g.graphs, [launch.kernel for launch in g.launches]) for g in groups] == [
        ("graph 0", 1, ["z"]), ("capture_2_PIECEWISE", 2, ["k0", "k1", "k2", "k3", "k4", "k5", "k6"])]


def test_each_piece_spans_the_decoder_layers_its_own_kernels_were_launched_in(tmp_path):
    found = _attributed(_two_pieces_replayed(tmp_path), _two_threads(tmp_path))
    assert found.group.name == "capture_2_PIECEWISE"
    assert found.layers(0) == ("DecoderLayer_0", "DecoderLayer_2")
    assert found.layers(1) == ("DecoderLayer_3", "DecoderLayer_5")
    assert {t.key: t.kernels for t in totals([found], "op")} == {"(no op)": 7}
    assert {t.key: t.kernels for t in totals([found], "module")} == {"DecoderLayer": 6, "(no module)": 1}


def test_a_capture_that_launched_nothing_holds_no_launch(tmp_path):
    capture = _trace(tmp_path, "capture.json", [
        _x("cuda_runtime", "hipStreamBeginCapture", 1, 1, correlation=1),
        _x("cuda_runtime", "hipMemcpyAsync", 5, 1, correlation=2),
        _x("cuda_runtime", "hipStreamEndCapture", 10, 1, correlation=3)])
    assert [(g.name, g.graphs, g.launches) for g in captures(load_trace(capture))] == [("graph 0", 1, [])]


def test_an_eager_step_has_nothing_to_attribute(tmp_path):
    eager = _trace(tmp_path, "serving.json", [
        _x("user_annotation", "step[DECODE bs=1]", 0, 100), _x("cuda_runtime", "hipLaunchKernel", 10, 5, correlation=7),
        _x("kernel", "k", 20, 5, tid=0, correlation=7, device=0)])
    assert _attributed(eager, _one_module_two_ops(tmp_path)) is None


def test_between_captures_that_match_alike_the_first_is_taken(tmp_path):
    capture = _trace(tmp_path, "capture.json", [
        _x("user_annotation", f"capture_{n}_DECODE", 100 * n, 50) for n in (1, 2)] + [
        event for n in (1, 2) for event in (
            _x("cuda_runtime", "hipStreamBeginCapture", 100 * n + 1, 1, correlation=10 * n),
            _launch(100 * n + 10, "k"),
            _x("cuda_runtime", "hipStreamEndCapture", 100 * n + 20, 1, correlation=10 * n + 1))])
    assert _attributed(_replay(tmp_path, 1), capture).group.name == "capture_1_DECODE"
