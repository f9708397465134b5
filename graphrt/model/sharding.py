"""Tensor parallelism for the model: parallel linears, one all-reduce each, and which slice of
every Hugging Face tensor a rank holds (Megatron's split, as vLLM and gpt-fast make it).

With N ranks, H query heads, K KV heads and I intermediate features:

    qkv_proj (packed)     column-parallel by heads: rank r holds query heads [r*H/N, (r+1)*H/N)
                          and the KV heads they read, K/N of them, or (K < N) the one KV head
                          its query heads share, replicated on N/K ranks; packed as the whole
                          model packs them (q rows, then k, then v: graphrt.model.packing)
    gate_up_proj (packed) column-parallel by features: I/N gate rows, then I/N up rows
    o_proj, down          row-parallel (the matching input columns), then one all-reduce each:
                          two all-reduces per layer, and nothing else communicates
    embeddings, lm_head,  replicated. Every rank needs the full logits for its greedy pick;
    norms                 replicated, each computes the same bits, so every rank picks the same
                          token with no broadcast, and a step holds no all-gather. The price is
                          the vocabulary's memory on every rank (vocab-parallel would divide it).

The model is built as usual and `parallelize` swaps these projections for rank-sized ones, so
the model's code knows nothing of ranks. A packed projection's `state_dict()` shows each part
under its checkpoint name as a view of its rows, so `rank_slices` speaks HF names only: per
part, which slice of the HF tensor it holds. The loader (`weights.load_checkpoint`) copies each
slice into its part's rows, and a seeded random init that equals the single-rank one is drawn
whole and sliced the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from graphrt.errors import GraphrtError
from graphrt.model.config import ModelConfig
from graphrt.model.packing import PackedLinear


def all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum `x` over the ranks of `group`: a functional collective, waited right here, inside
    the step, so a graph that captures it also captures its end."""
    ops = torch.ops._c10d_functional
    return ops.wait_tensor(ops.all_reduce(x, "sum", group))


class AllReduce(nn.Module):
    """The sum over the ranks, as a module of its own: whatever instruments modules (NVTX ranges,
    probes) sees the collective apart from the GEMM before it, and the model stays unaware of it."""

    def __init__(self, group: str):
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(x, self.group)


class Shard(Protocol):
    """Where a rank stands, as the model needs it: rank `rank` of `world`, and the name of the
    process group its collectives take (graphrt.parallel.ranks.Ranks is one)."""

    rank: int
    world: int
    group: str


class ColumnParallelLinear(PackedLinear):
    """A packed projection holding this rank's rows of each part (its heads or features): the
    rank's share of the output, no communication."""


class RowParallelLinear(nn.Linear):
    """A projection holding this rank's columns of the weight (the inputs its heads or features
    produced): partial sums, added over the ranks by one all-reduce. No bias (o_proj and
    down_proj have none; a bias would be added N times)."""

    def __init__(self, in_features: int, out_features: int, group: str):
        super().__init__(in_features, out_features, bias=False)
        self.all_reduce = AllReduce(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(F.linear(x, self.weight))


@dataclass(frozen=True)
class Split:
    """What rank `rank` of `world` holds: query heads [q_start, q_start + heads), KV heads
    [kv_start, kv_start + kv_heads), intermediate features [i_start, i_start + features)."""

    rank: int
    world: int
    heads: int
    q_start: int
    kv_heads: int
    kv_start: int
    features: int
    i_start: int


def split(config: ModelConfig, rank: int, world: int) -> Split:
    """Rank `rank`'s share; refuses a `world` that does not divide the heads and features."""
    h, k, i = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    # every rank holds whole heads and as many features: query heads and features divide by the
    # ranks; KV heads divide by them (K >= N) or divide them (K < N: a KV head replicated)
    wrong = []
    if h % world:
        wrong.append(f"its {h} query heads")
    if k % world and world % k:
        wrong.append(f"its {k} KV heads (nor do they divide --tp)")
    if i % world:
        wrong.append(f"its {i} intermediate features")
    if wrong:
        raise GraphrtError(f"--tp {world} does not divide {config.name}'s heads and features: "
                           f"not {', nor '.join(wrong)}")
    heads, features = h // world, i // world
    # K >= N: K/N KV heads each; K < N: the one KV head this rank's query heads share
    kv_heads = max(k // world, 1)
    kv_start = rank * kv_heads if k >= world else rank * heads // config.num_query_groups
    return Split(rank, world, heads, rank * heads, kv_heads, kv_start, features, rank * features)


def rank_shapes(config: ModelConfig, share: Split) -> ModelConfig:
    """The model as one rank holds it: its query and KV heads and features, the rest whole (what
    a rank's step reads and computes, for its roofline)."""
    return replace(config, num_attention_heads=share.heads, num_key_value_heads=share.kv_heads,
                   intermediate_size=share.features, head_dim=config.head_dim)


@dataclass(frozen=True)
class Slice:
    """Rows (dim 0) or columns (dim 1) [start, stop) of the HF tensor `name`."""

    name: str
    dim: int
    start: int
    stop: int


def rank_slices(config: ModelConfig, share: Split) -> dict[str, tuple[Slice, ...]]:
    """Per sharded tensor (HF name), the slices of the HF tensor it holds, concatenated along
    dim 0 in this order. Tensors not named are held whole."""
    d = config.head_dim
    q = (share.q_start * d, (share.q_start + share.heads) * d)
    kv = (share.kv_start * d, (share.kv_start + share.kv_heads) * d)
    i = (share.i_start, share.i_start + share.features)
    slices: dict[str, tuple[Slice, ...]] = {}
    for n in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        kinds = ("weight", "bias") if config.family.qkv_bias else ("weight",)
        rows = {f"{attn}.{proj}.{kind}": part for proj, part in (("q_proj", q), ("k_proj", kv), ("v_proj", kv))
                for kind in kinds}
        rows.update({f"{mlp}.gate_proj.weight": i, f"{mlp}.up_proj.weight": i})
        for name, (start, stop) in rows.items():
            slices[name] = (Slice(name, 0, start, stop),)
        for proj, (start, stop) in {f"{attn}.o_proj": q, f"{mlp}.down_proj": i}.items():
            slices[f"{proj}.weight"] = (Slice(f"{proj}.weight", 1, start, stop),)
    return slices


def take(full: torch.Tensor, piece: Slice) -> torch.Tensor:
    """`piece` of the whole tensor `full`."""
    return full.narrow(piece.dim, piece.start, piece.stop - piece.start)


def parallelize(model: nn.Module, config: ModelConfig, ranks: Shard) -> Split:
    """Swap every layer's projections for this rank's parallel ones (before weights are made:
    on the meta device); returns the rank's share."""
    share = split(config, ranks.rank, ranks.world)
    c, d = config.hidden_size, config.head_dim
    q, kv = share.heads * d, share.kv_heads * d
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.heads, attn.kv_heads, attn.groups = share.heads, share.kv_heads, share.heads // share.kv_heads
        attn.qkv_proj = ColumnParallelLinear(c, (("q_proj", q), ("k_proj", kv), ("v_proj", kv)),
                                             bias=config.family.qkv_bias)
        attn.o_proj = RowParallelLinear(q, c, ranks.group)
        mlp.gate_up_proj = ColumnParallelLinear(c, (("gate_proj", share.features), ("up_proj", share.features)))
        mlp.down_proj = RowParallelLinear(share.features, c, ranks.group)
    return share
