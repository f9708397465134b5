"""The rules of graphrt.trace.analysis.modules, each on small hand-built timelines and steps whose right
answer can be worked out by hand: the kind a work item counts under, the idle time in front of
each item, the reference a replay is attributed from, and which replay is set against which
eager step, with what labels and per-step figures (all times in ns)."""

from __future__ import annotations

import pytest

from graphrt.trace.analysis.modules import (NO_MODULE, CaptureRecords, NodeLookup, Reference, Side,
                                            compare_modules, idle_before, replay_modules, work_kind)
from graphrt.trace.analysis.timeline import StepTimeline, Work

LAYER = "model.layers.0 (Qwen2DecoderLayer)"  # kind "other"
ATTN = "model.layers.0.self_attn (Qwen2Attention)"
MLP = "model.layers.0.mlp (Qwen2MLP)"
NORM = "model.norm (Qwen2RMSNorm)"
EAGER, REPLAY = "decode_step[eager]", "replay[bs=1]"


def _step(group: str, work: list[tuple], unit: str = "op") -> StepTimeline:
    """A step from (name, start, end, stack, home) per work item; a replay's items have no stack."""
    pieces = [Work(name, start, end, None, stack, home) for name, start, end, stack, home in work]
    return StepTimeline(group, group, pieces[0].start_ns if pieces else 0, pieces[-1].end_ns if pieces else 0,
                        unit, pieces, [])


def _replay(times: list[tuple[str, int, int]], unit: str = "op") -> StepTimeline:
    return _step(REPLAY, [(name, start, end, (), None) for name, start, end in times], unit)


# ---------------------------------------------------------------------------------------------
# The kind of a work item


@pytest.mark.parametrize("stack, kind", [
    # the innermost module with a kind of its own: a q_proj's kernel is attention
    ((LAYER, ATTN, "model.layers.0.self_attn.q_proj (Linear)"), "attention"),
    # an innermost range of kind "other" gives way to the kind around it
    ((LAYER, NORM, "model.norm.cast (Cast)"), "norm"),
    # only "other" modules around it (a decoder layer's own add): "other"
    ((LAYER,), "other"),
    (("(Qwen2ForCausalLM)", "model (Qwen2Model)"), "other"),
    # a step-level range is no module: as good as no range at all
    (("copy_in",), NO_MODULE),
    ((), NO_MODULE),
    # a step-level range inside a module leaves the module's kind
    ((MLP, "copy_in"), "mlp"),
    (None, "(unattributed)"),
], ids=["q_proj", "inside-norm", "decoder-layer", "model", "step-range", "no-range", "step-range-in-mlp",
        "unattributed"])
def test_a_work_item_counts_under_its_innermost_module_kind_other_than_other(stack, kind):
    assert work_kind(stack) == kind


# ---------------------------------------------------------------------------------------------
# Idle time in front of each item


def test_idle_before_an_item_runs_from_the_latest_end_of_everything_before_it():
    # the second item runs inside the first (another stream): busy until 100, not until 20
    step = _replay([("a", 0, 100), ("b", 10, 20), ("c", 150, 160), ("d", 170, 180)])
    assert idle_before(step) == [0, 0, 50, 10]
    assert idle_before(_replay([])) == []


# ---------------------------------------------------------------------------------------------
# What a replay is attributed from


def test_the_eager_reference_says_which_unit_of_work_it_aligned():
    kernels = _step(EAGER, [("gemm", 0, 10, (ATTN,), 3)], unit="kernel")
    ops = _step(EAGER, [("aten::mm", 0, 10, (ATTN,), 3)], unit="op")
    aligned = "names aligned with the eager step's (longest common subsequence)"
    assert Reference.of_eager(kernels).method == f"kernel {aligned}"
    assert Reference.of_eager(ops).method == f"op {aligned}"


def test_capture_records_attribute_only_the_replay_group_they_were_recorded_for():
    op_step = _replay([("aten::mm", 0, 10)])
    kernel_step = _step(REPLAY, [("gemm", 0, 10, (), None)], unit="kernel")
    # records of another graph (another batch size) say nothing about this one
    other = CaptureRecords(ops={"replay[bs=8]": [("aten::mm", (ATTN,))]}, nodes={"replay[bs=8]": {1: (ATTN,)}})
    assert other.reference(op_step) is None and other.reference(kernel_step) is None
    assert CaptureRecords(ops={REPLAY: []}).reference(op_step) is None  # a capture that recorded no op
    own = CaptureRecords(ops={REPLAY: [("aten::mm", (ATTN,))]}).reference(op_step)
    assert isinstance(own, Reference) and (own.names, own.stacks) == (["aten::mm"], [(ATTN,)])
    assert own.method == "the capture's own records of each op's ranges (TapeGraph.op_ranges)"
    # kernels are looked up by graph node, where the records hold one of the step's nodes
    replayed_node_5 = StepTimeline(REPLAY, REPLAY, 0, 10, "kernel", [Work("gemm", 0, 10, None, (), None, 5)], [])
    assert CaptureRecords(nodes={REPLAY: {5: (ATTN,)}}).reference(replayed_node_5) == NodeLookup({5: (ATTN,)})


# ---------------------------------------------------------------------------------------------
# Both modes' time per module


def _three_module_steps() -> tuple[StepTimeline, list[StepTimeline]]:
    """An eager step of three ops in three module calls, and two replays of it.

    eager:   mm    0-100  attention       busy 100, gap   0 -> 100
             mul 150-200  mlp             busy  50, gap  50 -> 100
             rsqrt 300-450 norm           busy 150, gap 100 -> 250
    replay 1: mm 1000-1030, mul 1040-1050, rsqrt 1050-1060
    replay 2: mm 2000-2050, mul 2050-2060, rsqrt 2070-2080
    per replay step: attention busy 40 gap 0; mlp busy 10 gap 5; norm busy 10 gap 5
    """
    eager = _step(EAGER, [("aten::mm", 0, 100, (LAYER, ATTN), 1), ("aten::mul", 150, 200, (LAYER, MLP), 2),
                          ("aten::rsqrt", 300, 450, (NORM,), 3)])
    replays = [_replay([("aten::mm", 1000, 1030), ("aten::mul", 1040, 1050), ("aten::rsqrt", 1050, 1060)]),
               _replay([("aten::mm", 2000, 2050), ("aten::mul", 2050, 2060), ("aten::rsqrt", 2070, 2080)])]
    return eager, replays


def test_each_module_gets_its_work_busy_and_idle_time_per_step_in_both_modes():
    eager, replays = _three_module_steps()
    found = compare_modules([eager], replays, "eager", "replay")
    assert (found.eager, found.replay, found.unit, found.items) == ("eager", "replay", "op", 3)
    assert (found.eager_steps, found.replay_steps) == (1, 2)
    assert found.how == {"matched": 3, "between": 0, "unattributed": 0}
    assert {r.key: (r.eager, r.replay) for r in found.by_kind} == {
        "attention": (Side(1, 100, 0), Side(1, 40, 0)),
        "mlp": (Side(1, 50, 50), Side(1, 10, 5)),
        "norm": (Side(1, 150, 100), Side(1, 10, 5)),
        # the decoder layer holds attention and mlp, but its kind is "other" and claims neither
    }
    layer = next(r for r in found.by_name if r.key == LAYER)
    assert (layer.eager, layer.replay) == (Side(2, 150, 50), Side(2, 50, 5))
    assert layer.removed_ns == 200 - 55


def test_modules_are_listed_by_eager_time_then_replay_time_then_name():
    eager, replays = _three_module_steps()
    found = compare_modules([eager], replays, "eager", "replay")
    # eager totals: norm 250, layer 200, attention 100, mlp 100; attention and mlp tie in eager,
    # and attention's replay (40) outlasts mlp's (15)
    assert [(r.key, r.eager.total_ns, r.replay.total_ns) for r in found.by_name] == [
        (NORM, 250, 15), (LAYER, 200, 55), (ATTN, 100, 40), (MLP, 100, 15)]
    # a tie in both modes falls to the name
    alike = _step(EAGER, [("aten::mm", 0, 10, (MLP,), 1), ("aten::mm", 10, 20, (ATTN,), 2)])
    again = compare_modules([alike], [_replay([("aten::mm", 0, 10), ("aten::mm", 10, 20)])], "e", "r")
    assert [r.key for r in again.by_name] == [MLP, ATTN]


# ---------------------------------------------------------------------------------------------
# Which replay is set against which eager step


def test_a_single_replay_step_is_set_against_the_eager_step_of_its_trace():
    eager, replays = _three_module_steps()
    (found,) = replay_modules([("", [eager, replays[0]])])  # no capture records at all
    # one trace, so no trace label in front of the group
    assert (found.eager, found.replay) == (EAGER, REPLAY)
    assert (found.eager_steps, found.replay_steps, found.items) == (1, 1, 3)
    assert found.method == "op names aligned with the eager step's (longest common subsequence)"
    assert {r.key: r.replay for r in found.by_kind}["attention"] == Side(1, 30, 0)


def test_a_replay_is_set_only_against_an_eager_step_of_its_own_unit_of_work():
    eager, replays = _three_module_steps()
    gpu_replay = _step(REPLAY, [("gemm", 0, 10, (), None)], unit="kernel")
    # the GPU trace's replay has no eager step of kernels to align with and no records: left out;
    # the CPU trace's replay still gets its own eager step
    found = replay_modules([("gpu.json", [gpu_replay]), ("cpu.json", [eager, *replays])])
    assert [(f.eager, f.replay, f.unit) for f in found] == [
        ("cpu.json: decode_step[eager]", "cpu.json: replay[bs=1]", "op")]


def test_capture_records_attribute_a_replay_that_has_no_eager_step():
    step = _replay([("aten::mm", 0, 40), ("aten::mul", 50, 60)])
    records = CaptureRecords(ops={REPLAY: [("aten::mm", (LAYER, ATTN)), ("aten::mul", (LAYER, MLP))]})
    (found,) = replay_modules([("cpu.json", [step])], [records])
    assert (found.eager, found.replay, found.eager_steps, found.replay_steps) == (
        "no eager step", "cpu.json: replay[bs=1]", 0, 1)
    assert found.method == "the capture's own records of each op's ranges (TapeGraph.op_ranges)"
    assert {r.key: (r.eager, r.replay) for r in found.by_kind} == {
        "attention": (Side(), Side(1, 40, 0)), "mlp": (Side(), Side(1, 10, 10))}
    assert [(r.key, r.replay.total_ns) for r in found.by_name] == [(LAYER, 60), (ATTN, 40), (MLP, 20)]
