"""Replayed kernels attributed by their graph node: where the capture annotated its nodes
(`CudaGraph.node_ranges`, kept by `graphrt trace` in summary.json), each kernel of a replay is
looked up by the `graph node id` the profiler gives it. Exact: a kernel whose node the capture
did not annotate is unattributed, never guessed, and the lookup is preferred to aligning the
replay with an eager step.

The traces are built here as torch.profiler writes them; the figures expected are worked out in
the test from the kernels' own times.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict

import pytest

from graphrt.io import write_json
from graphrt.trace.record.record_modes import RecordedMode

US = 1000  # ns per µs
GRAPH = 9 << 32  # the exec graph's id in a toolsId's upper 32 bits

ROOT = ("(Qwen2ForCausalLM)", "model (Qwen2Model)", "model.layers.0 (Qwen2DecoderLayer)")
STACKS = {  # what the capture recorded per node, and the kind it makes the node's kernel
    GRAPH | 1: (("(Qwen2ForCausalLM)", "model (Qwen2Model)", "model.embed_tokens (Embedding)"), "embedding"),
    GRAPH | 2: ((*ROOT, "model.layers.0.self_attn (Qwen2Attention)",
                 "model.layers.0.self_attn.q_proj (Linear)"), "attention"),
    GRAPH | 3: ((*ROOT, "model.layers.0.self_attn (Qwen2Attention)"), "attention"),
    GRAPH | 4: ((*ROOT, "model.layers.0.mlp (Qwen2MLP)", "model.layers.0.mlp.down_proj (Linear)"), "mlp"),
    GRAPH | 5: ((), "(no module)"),  # issued in the capture outside every module
    GRAPH | 6: (("(Qwen2ForCausalLM)", "lm_head (Linear)"), "lm_head"),
}
UNKNOWN = GRAPH | 99  # a node the capture did not annotate

# One replay: (node, kernel name, start µs after the graph launch, duration µs) per kernel; the
# second replay's kernels run longer, so a per-step mean differs from either step.
REPLAY = [(GRAPH | 1, "gather", 10, 2), (GRAPH | 2, "gemm", 13, 4), (GRAPH | 3, "softmax", 17, 1),
          (GRAPH | 4, "gemm", 20, 5), (UNKNOWN, "fill", 25, 1), (GRAPH | 5, "add", 27, 1),
          (GRAPH | 6, "gemm", 30, 6)]
SLOWER = 1.5


def _event(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _replays(steps: int = 2) -> tuple[list[dict], list[list[tuple[int, int, str]]]]:
    """Chrome events of `steps` graph replays, and per step what the test expects of each kernel:
    (start ns, end ns, kind)."""
    events, expected = [], []
    for s in range(steps):
        t, scale = 1000.0 * s, SLOWER ** s
        events.append(_event("user_annotation", "replay[bs=1]", t, 60.0, 3, 3))
        events.append(_event("cuda_runtime", "cudaGraphLaunch", t + 2, 5.0, 3, 3, correlation=s + 1))
        kernels = []
        for node, name, start, dur in REPLAY:
            at, length = t + start * scale, dur * scale
            events.append(_event("kernel", name, at, length, 0, 7, device=0, stream=7, correlation=s + 1,
                                 **{"graph id": 9, "graph node id": node}))
            kind = STACKS[node][1] if node in STACKS else "(unattributed)"
            kernels.append((round(at * US), round((at + length) * US), kind))
        expected.append(kernels)
    return events, expected


def _eager_step() -> list[dict]:
    """One eager step launching the replay's kernels one by one, all inside the final norm's
    range: aligned with it, every replayed kernel would be a norm's."""
    t = 5000.0
    events = [_event("user_annotation", "decode_step[eager]", t, 200.0, 3, 3),
              _event("user_annotation", "model.norm (Qwen2RMSNorm)", t + 1, 190.0, 3, 3)]
    for j, (_, name, _, dur) in enumerate(REPLAY):
        correlation = 100 + j
        events.append(_event("cuda_runtime", "cudaLaunchKernel", t + 5 + 20 * j, 4.0, 3, 3, correlation=correlation))
        events.append(_event("kernel", name, t + 10 + 20 * j, dur, 0, 7, device=0, stream=7, correlation=correlation))
    return events


def _by_kind(steps: list[list[tuple[int, int, str]]]) -> dict[str, tuple[float, float, float]]:
    """Per kind, per step (the mean): kernels, their GPU time, and the idle time in front of
    each (from the latest end of the kernels before it to its start)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])
    for kernels in steps:
        busy_until = None
        for start, end, kind in sorted(kernels):
            gap = 0 if busy_until is None else max(0, start - busy_until)
            busy_until = end if busy_until is None else max(busy_until, end)
            row = totals[kind]
            row[0], row[1], row[2] = row[0] + 1, row[1] + end - start, row[2] + gap
    return {kind: tuple(x / len(steps) for x in row) for kind, row in totals.items()}


def _summary(node_ranges: dict) -> dict:
    """summary.json as `graphrt trace` writes it for a graph recording."""
    recorded = RecordedMode("graph", warmup_steps=1, recorded_steps=2, ops_per_step=None, node_ranges=node_ranges)
    return {"modes": {"graph": {**asdict(recorded), "files": {"chrome": "graph.json"}}}}


ANNOTATED = {"replay[bs=1]": {str(node): list(stack) for node, (stack, _) in STACKS.items()}}


def _trace_dir(tmp_path, node_ranges: dict | None, eager: bool = True):
    events, expected = _replays()
    (tmp_path / "graph.json").write_text(json.dumps({"traceEvents": events}))
    if eager:
        (tmp_path / "eager.json").write_text(json.dumps({"traceEvents": _eager_step()}))
    if node_ranges is not None:
        write_json(tmp_path / "summary.json", _summary(node_ranges))
    return expected


def _analyze(cli, tmp_path) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    result = cli("analyze", tmp_path, "--json", out)
    assert result.exit_code == 0, result.output
    (found,) = json.loads(out.read_text())["replay_modules"]
    return result.stdout, found


def test_each_replayed_kernel_takes_the_stack_its_node_was_captured_in(cli, tmp_path):
    expected = _by_kind(_trace_dir(tmp_path, ANNOTATED, eager=False))
    _, found = _analyze(cli, tmp_path)
    assert "graph-node annotations" in found["method"] and found["eager_steps"] == 0
    assert found["how"] == {"matched": 6, "between": 0, "unattributed": 1}
    assert found["attributed_share"] == pytest.approx(6 / 7)
    figures = {r["key"]: (r["replay"]["work"], r["replay"]["busy_ns"], r["replay"]["gap_ns"])
               for r in found["by_kind"]}
    assert figures.keys() == expected.keys()
    for kind, row in expected.items():
        assert figures[kind] == pytest.approx(row), kind
    by_name = {r["key"]: r["replay"]["work"] for r in found["by_name"]}
    # the attention block holds its own kernel and q_proj's; the layer holds the MLP's too
    assert by_name["model.layers.0.self_attn (Qwen2Attention)"] == 2
    assert by_name["model.layers.0 (Qwen2DecoderLayer)"] == 3


def test_a_kernel_whose_node_the_capture_did_not_annotate_is_unattributed(cli, tmp_path):
    _trace_dir(tmp_path, ANNOTATED, eager=False)
    _, found = _analyze(cli, tmp_path)
    unattributed = {r["key"]: r["replay"]["work"] for r in found["by_kind"]}["(unattributed)"]
    assert unattributed == 1  # the fill, and nothing else
    assert sum(r["replay"]["work"] for r in found["by_kind"]) == len(REPLAY)


def test_the_node_lookup_is_preferred_to_aligning_with_the_eager_step(cli, tmp_path):
    expected = _by_kind(_trace_dir(tmp_path, ANNOTATED))
    stdout, found = _analyze(cli, tmp_path)
    assert found["eager_steps"] == 1 and "graph-node annotations" in found["method"]
    assert found["method"] in stdout
    replay = {r["key"]: r["replay"]["work"] for r in found["by_kind"] if r["replay"]["work"]}
    assert replay == {kind: row[0] for kind, row in expected.items()}
    assert "norm" not in replay  # where the alignment would have put every one of them


def test_without_node_records_the_eager_alignment_attributes_the_replay(cli, tmp_path):
    _trace_dir(tmp_path, node_ranges=None)
    _, found = _analyze(cli, tmp_path)
    assert "aligned with the eager step" in found["method"]
    assert {r["key"]: r["replay"]["work"] for r in found["by_kind"] if r["replay"]["work"]} == {"norm": len(REPLAY)}


def test_node_records_of_another_graph_leave_the_alignment_to_it(cli, tmp_path):
    other = {"replay[bs=1]": {str((4 << 32) | n): ["model.norm (Qwen2RMSNorm)"] for n in range(1, 7)}}
    _trace_dir(tmp_path, other)
    _, found = _analyze(cli, tmp_path)
    assert "aligned with the eager step" in found["method"]


@pytest.mark.parametrize("node_ranges, said", [
    ({"replay[bs=1]": {"seven": ["model.norm (Qwen2RMSNorm)"]}}, "invalid literal for int()"),
    ({"replay[bs=1]": {"5": "model.norm (Qwen2RMSNorm)"}}, "is not a list of range names"),
    ({"replay[bs=1]": [["model.norm (Qwen2RMSNorm)"]]}, "'list' object has no attribute 'items'"),
])
def test_bad_node_records_in_summary_json_are_one_line_naming_the_field(cli, tmp_path, node_ranges, said):
    _trace_dir(tmp_path, node_ranges)
    result = cli("analyze", tmp_path)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'summary.json'}: modes.graph.node_ranges is not what "
                           "graphrt trace writes (per replay step, {graph node id: [range names]})")
    assert said in line


def test_a_summary_that_is_not_json_is_one_line(cli, tmp_path):
    _trace_dir(tmp_path, node_ranges=None)
    (tmp_path / "summary.json").write_text('{"modes": ')
    result = cli("analyze", tmp_path)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'summary.json'}: not a summary graphrt trace wrote")
