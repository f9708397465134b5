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

from graphrt.cli.main import main
from graphrt.trace import load_trace
from graphrt.trace.analysis.engine_capture import attribute, captures
from graphrt.trace.analysis.timeline import step_timelines

ENGINES = Path(__file__).parents[1] / "data" / "engines"
PAIRS = {  # case: (serving trace, capture trace)
    "sglang_decode": ("sglang_Qwen3-8B_decode.json.gz", "capture_traces/bs_32_rank0.json.gz"),
    "vllm_decode_full": ("graph_execution.json.gz",
                         "capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"),
    "vllm_prefilldecode_piecewise": ("graph_execution.json.gz",
                                     "capture_traces/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"),
}
LAUNCH = re.compile(r"hip(Ext)?(Module)?LaunchKernel|cudaLaunchKernel")


def _pair(case: str) -> tuple[Path, Path]:
    paths = tuple(ENGINES / case / name for name in PAIRS[case])
    for path in paths:
        if not path.is_file():
            pytest.skip(f"{path} is not here (tests/data/engines/README.md says where it comes from)")
    return paths


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
