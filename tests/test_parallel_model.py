"""Tensor-parallel decode on two gloo ranks: each rank holds exactly its slices of the HF
tensors, generates the single-process model's tokens, and replays its graphs bitwise like eager."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import ranks
from graphrt.backends.eager import EagerBackend
from graphrt.config import PRESETS, from_hf_dir
from graphrt.engine import decode
from graphrt.parallel.launch import launch
from graphrt.weights import build_model

from conftest import save_reference

STEPS = 6
ALL_REDUCE = "_c10d_functional.all_reduce.default"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A HF checkpoint with every parameter random, tied embeddings, and one KV head: fewer
    KV heads than ranks, so each rank holds a copy of it."""
    config = replace(PRESETS["tiny"], name="one-kv-head", num_key_value_heads=1, tie_word_embeddings=True)
    directory = tmp_path_factory.mktemp("one-kv-head")
    save_reference(config, directory)
    return directory


@pytest.fixture(scope="module", params=["tiny", "checkpoint"])
def decoded(request, checkpoint):
    """(model, prompt, the single-process eager decode, per rank what tests/ranks.tp_decode
    returned), one launch per model."""
    model = "tiny" if request.param == "tiny" else str(checkpoint)
    config = PRESETS["tiny"] if model == "tiny" else from_hf_dir(model)
    prompt = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    whole = build_model(config, torch.device("cpu"), torch.float32, checkpoint=None if model == "tiny" else model)
    whole.setup_cache(2, 5 + STEPS)
    reference = decode(EagerBackend(whole), prompt, STEPS)
    return model, config, whole, reference, launch(ranks.tp_decode, [model, prompt, STEPS], 2)


def test_two_ranks_generate_the_single_process_tokens_with_logits_within_summation_error(decoded):
    _, config, _, reference, per_rank = decoded
    for rank in (0, 1):
        eager = per_rank[rank]["eager"]
        assert torch.equal(eager["tokens"], reference.tokens)
        # Only the order of fp32 sums differs: o_proj and down_proj add two partial dot products
        # instead of one. Each sum of n terms moves by at most n * 2^-24 of the sum of |terms|;
        # with n <= 128, |terms| summing to O(1) per residual element and 2 such sums per layer,
        # that is ~1e-5 per layer, carried to the logits through lm_head (64 terms of 0.02 weights).
        bound = 2 * config.num_hidden_layers * 128 * 2.0 ** -24 * 64
        assert (eager["logits"] - torch.stack(reference.logits)).abs().max() <= bound


def test_graph_and_piecewise_replays_equal_eager_bitwise_on_every_rank(decoded):
    per_rank = decoded[4]
    for rank in (0, 1):
        eager = per_rank[rank]["eager"]
        for mode in ("graph", "piecewise"):
            assert torch.equal(per_rank[rank][mode]["tokens"], eager["tokens"])
            assert torch.equal(per_rank[rank][mode]["logits"], eager["logits"]), (rank, mode)


def test_each_ranks_tape_holds_two_all_reduces_per_layer(decoded):
    _, config, _, _, per_rank = decoded
    for rank in (0, 1):
        assert per_rank[rank]["tape"].count(ALL_REDUCE) == 2 * config.num_hidden_layers
        # each in a range of its own, so a trace tells its time from the GEMM before it
        for name, ranges in zip(per_rank[rank]["tape"], per_rank[rank]["tape_ranges"]):
            assert (name == ALL_REDUCE) == (ranges[-1:] == ("all_reduce[group=0]",)), (name, ranges)


def _expected_slices(config, rank: int) -> dict[str, tuple[int, slice]]:
    """Which rows (dim 0) or columns (dim 1) of each HF tensor rank `rank` of 2 holds, by the
    head arithmetic of Megatron's split, written out here independently of graphrt's."""
    d, heads, inter = config.head_dim, config.num_attention_heads // 2, config.intermediate_size // 2
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
            expected[f"{name}.weight"] = expected[f"{name}.bias"] = (0, rows)
        expected.update({f"{m}.gate_proj.weight": (0, i), f"{m}.up_proj.weight": (0, i),
                         f"{a}.o_proj.weight": (1, q), f"{m}.down_proj.weight": (1, i)})
    return expected


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
