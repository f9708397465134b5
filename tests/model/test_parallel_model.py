"""Tensor-parallel decode on two gloo ranks: each rank holds exactly its slices of the HF
tensors, generates the single-process model's tokens, and replays its graphs bitwise like eager."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rank_pool import CHECKPOINTS, PROMPT, STEPS, decoded_models
from safetensors.torch import load_file

from graphrt.backends.eager import EagerBackend
from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS, from_hf_dir
from graphrt.model.sharding import split
from graphrt.model.weights import build_model
from graphrt.run.decode import decode

ALL_REDUCE = "_c10d_functional.all_reduce.default"


@pytest.fixture(scope="module")
def launched(rank_pool) -> tuple[dict[str, str], dict[int, dict]]:
    """The models (tiny's random weights, then a directory per checkpoint of tests/rank_pool.py)
    and, per rank, what tests/ranks.tp_decode returned for each."""
    return decoded_models(rank_pool.made), rank_pool.results("tp_decode")


@pytest.fixture(params=["tiny", *CHECKPOINTS])
def decoded(request, launched):
    """(model, config, the single-process model, its eager decode, per rank what tp_decode
    returned for the model)."""
    models, per_rank = launched
    model = models[request.param]
    config = PRESETS["tiny"] if model == "tiny" else from_hf_dir(model)
    whole = build_model(config, torch.device("cpu"), torch.float32, checkpoint=None if model == "tiny" else model)
    whole.setup_cache(PROMPT.shape[0], PROMPT.shape[1] + STEPS)
    reference = decode(EagerBackend(whole), PROMPT, STEPS)
    return model, config, whole, reference, {rank: per_rank[rank][model] for rank in per_rank}


@pytest.mark.processes
def test_two_ranks_generate_the_single_process_tokens_with_logits_within_summation_error(decoded):
    _, config, _, reference, per_rank = decoded
    for rank in (0, 1):
        eager = per_rank[rank]["eager"]
        assert torch.equal(eager["tokens"], reference.tokens)
        # Only the order of fp32 sums differs: o_proj and down_proj add two partial dot products
        # instead of one, 2 reordered sums per layer, each moving its result by a few units in
        # the last place (2^-24 relative). Norms keep the residual stream at scale 1 and lm_head
        # carries relative errors to the logits about unchanged, so allow 16 such units per
        # reordered sum at the logits' scale (measured: 2 units on tiny).
        logits = torch.stack(reference.logits)
        bound = 16 * 2 * config.num_hidden_layers * 2.0 ** -24 * logits.abs().max()
        assert (eager["logits"] - logits).abs().max() <= bound


@pytest.mark.processes
def test_graph_and_piecewise_replays_equal_eager_bitwise_on_every_rank(decoded):
    per_rank = decoded[4]
    for rank in (0, 1):
        eager = per_rank[rank]["eager"]
        for mode in ("graph", "piecewise"):
            assert torch.equal(per_rank[rank][mode]["tokens"], eager["tokens"])
            assert torch.equal(per_rank[rank][mode]["logits"], eager["logits"]), (rank, mode)


@pytest.mark.processes
def test_each_ranks_tape_holds_two_all_reduces_per_layer(decoded):
    _, config, _, _, per_rank = decoded
    for rank in (0, 1):
        assert per_rank[rank]["tape"].count(ALL_REDUCE) == 2 * config.num_hidden_layers
        # each in a range of its own, so a trace tells its time from the GEMM before it
        for name, ranges in zip(per_rank[rank]["tape"], per_rank[rank]["tape_ranges"]):
            assert (name == ALL_REDUCE) == (ranges[-1].endswith(".all_reduce (AllReduce)")), (name, ranges)


def _expected_slices(config, rank: int) -> dict[str, tuple[int, slice]]:
    """Which rows (dim 0) or columns (dim 1) of each HF tensor rank `rank` of 2 holds, by the
    head arithmetic of Megatron's split, written out here independently of graphrt's."""
    d, heads, inter = config.head_dim, config.num_attention_heads // 2, config.intermediate_size // 2
    biases = ("weight", "bias") if config.model_type == "qwen2" else ("weight",)
    q = slice(rank * heads * d, (rank + 1) * heads * d)
    if config.num_key_value_heads >= 2:
        per = config.num_key_value_heads // 2
        kv = slice(rank * per * d, (rank + 1) * per * d)
    else:  # one KV head, held whole by both ranks
        kv = slice(0, d)
    i = slice(rank * inter, (rank + 1) * inter)
    expected = {}
    for n in range(config.num_hidden_layers):
        a, m = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        for name, rows in ((f"{a}.q_proj", q), (f"{a}.k_proj", kv), (f"{a}.v_proj", kv)):
            expected.update({f"{name}.{kind}": (0, rows) for kind in biases})
        expected.update({f"{m}.gate_proj.weight": (0, i), f"{m}.up_proj.weight": (0, i),
                         f"{a}.o_proj.weight": (1, q), f"{m}.down_proj.weight": (1, i)})
    return expected


@pytest.mark.processes
def test_each_rank_holds_its_slices_of_the_checkpoints_tensors(decoded):
    model, config, whole, _, per_rank = decoded
    hf = load_file(f"{model}/model.safetensors") if model != "tiny" else whole.state_dict()
    for rank in (0, 1):
        mine, expected = per_rank[rank]["parameters"], _expected_slices(config, rank)
        assert set(mine) == set(whole.state_dict())
        for name, held in mine.items():
            source = hf.get(name, hf["model.embed_tokens.weight"] if name == "lm_head.weight" else None)
            if name in expected:
                dim, part = expected[name]
                source = source[part] if dim == 0 else source[:, part]
            assert torch.equal(held, source), (rank, name)
        # its share, not the whole model: the layers' projections are halved, or (one KV head) less
        held = sum(t.numel() for n, t in mine.items() if n in expected)
        total = sum(t.numel() for n, t in whole.state_dict().items() if n in expected)
        assert held <= 0.6 * total


# (query heads, KV heads, intermediate features, --tp) -> what each rank holds, or what is refused:
# world sizes below, at and above the KV heads, and each part that does not divide on its own
@pytest.mark.parametrize("heads, kv_heads, features, world, refused", [
    (8, 4, 96, 2, None),                # KV heads above --tp: 2 each
    (8, 4, 96, 4, None),                # KV heads equal to --tp: 1 each
    (8, 2, 96, 4, None),                # KV heads below --tp, dividing it: one shared by 2 ranks
    (8, 4, 96, 8, None),                # 1 query head a rank, each KV head on 2 ranks
    (12, 4, 96, 3, "its 4 KV heads"),   # 3 neither divides 4 KV heads nor is divided by them
    (8, 4, 100, 8, "its 100 intermediate features"),  # heads divide, features do not
    (8, 4, 100, 4, None),               # ... but 100 / 4 does
    (6, 2, 96, 4, "its 6 query heads"),
])
def test_a_tp_is_refused_naming_each_part_it_does_not_divide(heads, kv_heads, features, world, refused):
    config = replace(PRESETS["tiny"], num_attention_heads=heads, num_key_value_heads=kv_heads,
                     intermediate_size=features, head_dim=16)
    if refused:
        with pytest.raises(GraphrtError, match=f"--tp {world} does not divide") as error:
            split(config, 0, world)
        assert refused in str(error.value)
        assert str(error.value).count("its ") == 1  # the parts that do divide are not blamed
        return
    shares = [split(config, rank, world) for rank in range(world)]
    # every query head and feature held once; every KV head held, each by world / K ranks or 1
    assert sorted(q for s in shares for q in range(s.q_start, s.q_start + s.heads)) == list(range(heads))
    assert sorted(f for s in shares for f in range(s.i_start, s.i_start + s.features)) == list(range(features))
    held = [kv for s in shares for kv in range(s.kv_start, s.kv_start + s.kv_heads)]
    assert sorted(set(held)) == list(range(kv_heads)) and len(held) == max(world, kv_heads)
    # and each rank's query heads read the KV head(s) it holds: query head q reads KV head q // G
    groups = heads // kv_heads
    for s in shares:
        assert {q // groups for q in range(s.q_start, s.q_start + s.heads)} <= set(range(s.kv_start, s.kv_start + s.kv_heads))
