"""The decode step is lean: what one layer dispatches, counted on the CPU in fp32, and what is
made once per step rather than once per layer. Counts, not times: they change only when the
step's structure does."""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import FAMILY_CONFIGS

from graphrt.measure.opcount import op_names
from graphrt.model.weights import build_model

CPU = torch.device("cpu")
GEMMS = ("aten.linear.default", "aten.mm.default", "aten.addmm.default")
ATTENTION = "aten.scaled_dot_product_attention.default"

# Non-view ops per layer (fp32, CPU, inference mode, as graphrt counts a step): 2 norms (one
# `aten.rms_norm` each), 4 GEMMs (qkv, o, gate_up, down), rotary 3, two cache writes, one
# attention op, silu and its product, two residual adds. Qwen3 adds its two per-head norms and
# the concatenation of normed q and k. (Outside inference mode rms_norm reaches the dispatcher
# decomposed, 6 ops in fp32; on CUDA it is one kernel either way.)
OPS_PER_LAYER = {"qwen2-untied": 16, "qwen2-tied": 16, "qwen3": 19, "llama3": 16}
OPS_PER_STEP_OUTSIDE_LAYERS = 8  # embedding, rotary gather, mask (4), final norm, lm_head


def step_ops(config, layers: int) -> list[str]:
    model = build_model(replace(config, num_hidden_layers=layers), CPU, torch.float32, seed=0)
    model.setup_cache(2, 16)
    tokens, positions = torch.tensor([[1], [2]]), torch.tensor([3, 7])
    with torch.inference_mode():  # as graphrt counts a step
        model.prefill(torch.ones(2, 8, dtype=torch.long))
        return op_names(lambda: model.decode_step(tokens, positions))


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_a_layer_dispatches_at_most_its_pinned_ops(family):
    one, two = step_ops(FAMILY_CONFIGS[family], 1), step_ops(FAMILY_CONFIGS[family], 2)
    per_layer = Counter(two) - Counter(one)
    assert per_layer.total() <= OPS_PER_LAYER[family], per_layer
    assert len(one) - per_layer.total() <= OPS_PER_STEP_OUTSIDE_LAYERS


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_a_layer_is_four_gemms_and_one_attention_op(family):
    one, two = step_ops(FAMILY_CONFIGS[family], 1), step_ops(FAMILY_CONFIGS[family], 2)
    per_layer = Counter(two) - Counter(one)
    assert sum(per_layer[g] for g in GEMMS) == 4  # q/k/v and gate/up packed
    assert per_layer[ATTENTION] == 1
    assert per_layer["aten.rms_norm.default"] == (4 if family == "qwen3" else 2)
    assert not {"aten.repeat_interleave.self_int", "aten.where.self", "aten._softmax.default"} & set(per_layer)


def test_what_attention_needs_from_the_positions_is_made_once_per_step():
    # the mask compares positions with the slot index; rotary gathers cos/sin by position
    ops = Counter(step_ops(FAMILY_CONFIGS["qwen2-untied"], 3))
    assert ops["aten.le.Tensor"] == 1
    assert ops["aten.index.Tensor"] == 1
