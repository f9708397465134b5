"""Which module each replayed op belongs to, carried over from an eager step by sequence alignment,
held against the ground truth a TapeGraph keeps: the ranges open at every entry it recorded
(`TapeGraph.op_ranges`), which the alignment never sees.

Both steps are recorded by torch.profiler as `graphrt trace` records them (ranges mirrored as
`record_function`s), for `tiny` (2 layers) and a 4-layer variant, whose identical layers are
what makes a misalignment easy: shifted by one layer, every op name still matches.
"""

import dataclasses
import json
import random

import pytest
import torch

from graphrt.backends.factory import make_backend
from graphrt.graphs.annotate import unavailable
from graphrt.measure import nvtx, range_names
from graphrt.model.config import PRESETS
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.weights import build_model
from graphrt.run.spec import RunSpec
from graphrt.trace import load_trace
from graphrt.trace.analysis.attribution import BETWEEN, MATCHED, UNATTRIBUTED, align, carry_over
from graphrt.trace.analysis.modules import NodeLookup, Reference, compare_modules
from graphrt.trace.analysis.timeline import StepTimeline, step_timelines
from graphrt.trace.record.make_traces import make_traces
from graphrt.trace.record.record_modes import torch_window

CONFIGS = {"tiny": PRESETS["tiny"], "tiny-4-layers": dataclasses.replace(PRESETS["tiny"], num_hidden_layers=4)}


def _profiler_name(overload: str) -> str:
    """`aten.addmm.default` -> `aten::addmm`, as torch.profiler names the op."""
    namespace, name = overload.split(".")[:2]
    return f"{namespace}::{name}"


def _truth(tape, replayed: list[str]) -> list[tuple[str, ...]]:
    """The module stack of each op in a replay trace, from the tape itself: each entry replays
    as its own op, and an entry that has no out= overload is followed by the `copy_` that puts
    its result into the captured tensor."""
    entries = [_profiler_name(n) for n in tape.op_names]
    truth, k = [], 0
    for name in replayed:
        if k < len(entries) and name == entries[k]:
            truth.append(tape.op_ranges[k])
            k += 1
        else:
            assert name == "aten::copy_" and k > 0, name
            truth.append(tape.op_ranges[k - 1])
    assert k == len(entries)
    return truth


def _record(config, device: torch.device, dtype: torch.dtype, out):
    """An eager and a graph backend on one model, two decode steps of each recorded by
    torch.profiler as `graphrt trace` records them; (eager step, replay step, graph backend)."""
    model = build_model(config, device, dtype, seed=0)
    model.setup_cache(1, 16)
    tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
    positions = torch.full((1,), 3, dtype=torch.long, device=device)
    with torch.inference_mode(), nvtx.attach(model):
        eager, graph = make_backend("eager", model, None), make_backend("graph", model, None)
        eager.prepare(1)
        graph.prepare(1)
        for backend, name in ((eager, "eager.json"), (graph, "graph.json")):
            backend.step(tokens, positions)  # warm: the first eager step pays cuBLAS's setup
            with torch_window(device, out / name):
                for _ in range(2):
                    backend.step(tokens, positions)
    (eager_step, _), (replay_step, _) = (step_timelines(load_trace(out / n)) for n in ("eager.json", "graph.json"))
    return eager_step, replay_step, graph


def _trace_on_cuda(out) -> tuple[StepTimeline, StepTimeline, dict[int, tuple[str, ...]]]:
    """qwen2-0.5b, bf16, batch 1, recorded by `graphrt trace --profiler torch`, which records each
    mode in a process of its own: CUPTI 13.0 links a replay's kernels to their cudaGraphLaunch only
    in a process's first profiler session, and this test process has opened many.
    (eager step, replay step, the capture's ranges per graph node where annotated)."""
    spec = RunSpec(model="qwen2-0.5b", device="cuda", dtype="bfloat16", steps=4, mode="both")
    made = make_traces(spec, profiler="torch", out=out)
    assert [m["profiler_session"] for m in made.summary["modes"].values()] == [1, 1]
    (eager_step, *_), (replay_step, *_) = (step_timelines(load_trace(made.path / f"{mode}.json"))
                                           for mode in ("eager", "graph"))
    nodes = made.summary["modes"]["graph"]["node_ranges"].get("replay[bs=1]", {})
    return eager_step, replay_step, {int(node): tuple(stack) for node, stack in nodes.items()}


@pytest.fixture(scope="module", params=list(CONFIGS))
def recorded(request, tmp_path_factory):
    """(eager step timeline, replay step timeline, ground truth per replayed op)."""
    eager_step, replay_step, graph = _record(CONFIGS[request.param], torch.device("cpu"), torch.float32,
                                             tmp_path_factory.mktemp(request.param))
    return eager_step, replay_step, _truth(graph.graphs[1][0], replay_step.names)


def _attribute(eager_step, replayed: list[str]):
    return carry_over(eager_step.names, [w.stack for w in eager_step.work], [w.home for w in eager_step.work],
                      replayed)


def _score(stacks, truth) -> tuple[int, int, int]:
    """(right, wrong, unattributed), judged by the innermost module."""
    right = sum(s is not None and s[-1:] == t[-1:] for s, t in zip(stacks, truth))
    unattributed = sum(s is None for s in stacks)
    return right, len(truth) - right - unattributed, unattributed


def test_replayed_ops_take_the_module_the_tape_recorded_them_in(recorded):
    eager_step, replay_step, truth = recorded
    assert eager_step.name == "decode_step[eager]" and replay_step.name == "replay[bs=1]"
    assert all(w.stack == () for w in replay_step.work)  # no range fires under replay
    attribution = _attribute(eager_step, replay_step.names)
    right, wrong, unattributed = _score(attribution.stacks, truth)
    assert wrong == 0
    # a tape copies back the result of a composite op it recorded whole (rms_norm, attention):
    # eager has no such copy to align it with
    copies = replay_step.names.count("aten::copy_")
    assert right >= 0.99 * (len(truth) - copies)
    assert attribution.counts()[UNATTRIBUTED] == unattributed


def test_an_inserted_copy_and_a_missing_op_do_not_shift_the_rest(recorded):
    eager_step, replay_step, truth = recorded
    names, truth = list(replay_step.names), list(truth)
    def first_in_mlp(layer: int) -> int:
        return next(j for j, stack in enumerate(truth) if any(s.startswith(f"model.layers.{layer}.mlp ") for s in stack))

    # drop the first op of the last layer's MLP; add a copy after the first op of layer 0's MLP
    last = {s.split(".")[2].split(" ")[0] for stack in truth for s in stack if s.startswith("model.layers.")}
    dropped = first_in_mlp(max(map(int, last)))
    del names[dropped], truth[dropped]
    inserted = first_in_mlp(0) + 1
    names.insert(inserted, "aten::copy_")
    truth.insert(inserted, truth[inserted - 1])

    attribution = _attribute(eager_step, names)
    right, wrong, _ = _score(attribution.stacks, truth)
    assert wrong == 0
    # the copy sits between two Linear calls (gate_proj, up_proj): no one module call holds it
    assert attribution.how[inserted] == UNATTRIBUTED
    # (nor any copy a tape adds after a composite op, which eager does not issue either)
    rest = [j for j in range(len(names)) if names[j] != "aten::copy_"]
    assert _score([attribution.stacks[j] for j in rest], [truth[j] for j in rest])[0] == len(rest)
    # Lined up by position instead, everything between the two edits lands one op off.
    by_position = [eager_step.work[j].stack if j < len(eager_step.work) else None for j in range(len(names))]
    assert _score(by_position, truth)[1] > 10


def test_the_share_attributed_is_reported_with_how(recorded):
    eager_step, replay_step, truth = recorded
    found = compare_modules([eager_step], [replay_step], "eager", "replay")
    assert found.items == len(truth)
    assert found.how[MATCHED] + found.how[BETWEEN] + found.how[UNATTRIBUTED] == len(truth)
    assert found.share == pytest.approx(1 - found.how[UNATTRIBUTED] / len(truth))
    # per kind, the replay's op time and the gaps before its ops add up to the step's span
    span = max(w.end_ns for w in replay_step.work) - replay_step.work[0].start_ns
    assert sum(r.replay.total_ns for r in found.by_kind) == pytest.approx(span)
    assert {r.key for r in found.by_kind} >= {"attention", "mlp", "norm", "lm_head"}


def _lcs_length(a, b) -> int:
    """The textbook dynamic programme, row by row."""
    previous = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(previous[j] + 1 if x == y else max(previous[j + 1], row[j]))
        previous = row
    return previous[-1]


def test_alignment_is_a_longest_common_subsequence():
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 15))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 15))]
        matched = align(a, b)
        pairs = [(i, j) for j, i in enumerate(matched) if i is not None]
        assert all(a[i] == b[j] for i, j in pairs)
        assert [i for i, _ in pairs] == sorted({i for i, _ in pairs})  # in order, each used once
        assert len(pairs) == _lcs_length(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_replay_kernels_take_their_modules_from_the_eager_step(tmp_path):
    """qwen2-0.5b, bf16, batch 1: the replay's kernels come from one cudaGraphLaunch, yet nearly
    all get a module, and each kind keeps the kernels it has in eager, now without the gaps."""
    eager_step, replay_step, _ = _trace_on_cuda(tmp_path)
    assert eager_step.unit == replay_step.unit == "kernel"
    assert [c.kind for c in replay_step.launches].count("graph") == 1
    found = compare_modules([eager_step], [replay_step], "eager", "replay")
    print(f"\nreplay attribution: {found.share:.1%} of {found.items} kernels ({found.how})")
    for row in found.by_kind:
        print(f"{row.key:>14}: kernels {row.eager.work:5.0f} eager {row.replay.work:5.0f} replay; GPU "
              f"{row.eager.busy_ns / 1e3:8.1f} / {row.replay.busy_ns / 1e3:8.1f} µs; with the gaps before "
              f"them {row.eager.total_ns / 1e3:8.1f} / {row.replay.total_ns / 1e3:8.1f} µs")
    assert found.share >= 0.95
    kinds = {row.key: row for row in found.by_kind}
    for kind in ("attention", "mlp", "norm", "lm_head"):
        assert kinds[kind].replay.work == pytest.approx(kinds[kind].eager.work, rel=0.05), kind
        assert 0.5 < kinds[kind].replay.busy_ns / kinds[kind].eager.busy_ns < 2, kind
    assert sum(r.replay.gap_ns for r in found.by_kind) < sum(r.eager.gap_ns for r in found.by_kind)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_replay_kernels_are_looked_up_by_the_node_their_capture_annotated(tmp_path):
    """qwen2-0.5b, bf16, batch 1, captured with graph-node annotations: every kernel the replay
    runs came from a node the capture gave a stack of the model's module ranges, and looked up by
    node, each kind has the kernels it has in the eager step, whose ranges fired live."""
    if reason := unavailable():
        pytest.skip(f"{reason}; this test runs with cuda.bindings >= 13.1 on a CUDA 13.1+ driver")
    eager_step, replay_step, node_ranges = _trace_on_cuda(tmp_path)
    nodes = [w.node for w in replay_step.work]
    assert None not in nodes and set(nodes) <= node_ranges.keys()
    with torch.device("meta"):
        model = Qwen2ForCausalLM(PRESETS["qwen2-0.5b"])
    modules = {range_names.module_range_name(name, m) for name, m in model.named_modules()}
    stacks = [node_ranges[n] for n in nodes]
    assert all(stack and set(stack) <= modules for stack in stacks)
    for stack in stacks:  # nested as the modules are: each range a submodule of the one around it
        qualnames = [range_names.parse_range_name(name)[0] for name in stack]
        assert all(outer == "" or inner.startswith(outer + ".") for outer, inner in zip(qualnames, qualnames[1:]))

    found = compare_modules([eager_step], [replay_step], "eager", "replay", NodeLookup(node_ranges))
    assert found.share == 1.0
    kinds = {row.key: row for row in found.by_kind}
    for kind in ("attention", "mlp", "norm", "lm_head"):
        assert kinds[kind].replay.work == pytest.approx(kinds[kind].eager.work, rel=0.05), kind


def test_a_trace_of_a_tape_replay_is_attributed_from_the_capture_alone(cli, tmp_path, tiny_torch_traces):
    """`graphrt trace` keeps what the capture recorded beside the trace (summary.json), so the
    replay trace needs no eager step; and the eager alignment puts every op where it does."""
    out = tmp_path / "figures.json"
    result = cli("analyze", tiny_torch_traces / "graph.json", "--json", out)
    assert result.exit_code == 0, result.output
    (found,) = json.loads(out.read_text())["replay_modules"]
    assert "TapeGraph.op_ranges" in found["method"] and found["eager_steps"] == 0
    assert found["attributed_share"] == 1.0

    entries = json.loads((tiny_torch_traces / "summary.json").read_text())["modes"]["graph"]["captured_ops"]
    captured = Reference.of_capture(entries["replay[bs=1]"])
    eager_step = step_timelines(load_trace(tiny_torch_traces / "eager.json"))[0]
    for replay_step in step_timelines(load_trace(tiny_torch_traces / "graph.json")):
        from_capture = carry_over(captured.names, captured.stacks, captured.calls, replay_step.names)
        from_eager = _attribute(eager_step, replay_step.names)
        # the copies a tape adds after a composite op only the capture knows where to put
        kept = [j for j, name in enumerate(replay_step.names) if name != "aten::copy_"]
        assert [from_capture.stacks[j] for j in kept] == [from_eager.stacks[j] for j in kept]
        assert from_capture.attributed == len(replay_step.work)
