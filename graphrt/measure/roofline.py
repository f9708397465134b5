"""The roofline of one decode step: bytes it must move and FLOPs it must do, from shapes alone.

What is counted, for `rows` sequences (the live batch, or the graph bucket it pads up to) and a
static cache of `seq_len` slots (max_seq_len), everything in the model's dtype:

- weights: every parameter once, except the embedding table, whose lookup reads `rows` rows;
  the lm_head reads its [V, C] matrix once. A tied model reads that shared matrix there, once.
- KV cache: graphrt's attention is static-shape and masked, so each layer reads K and V of
  all `seq_len` slots of every row, however many the mask lets through. This counts what the
  step reads, not what a variable-length attention kernel would; plus the K and V write of one
  position per row and layer.
- FLOPs: 2 x the multiply-accumulates of every matmul: q, k, v, o projections, gate, up and
  down, attention scores (q.k) and outputs (p.v) over all `seq_len` slots for every query head,
  and the lm_head.

Not counted: activations (hidden states, the [B, V] logits), rotary rows and the mask, and
elementwise FLOPs (norms, rotary, softmax, SiLU, bias adds). The byte count is a lower bound,
close while the weights dominate; the [B, V] logits catch up only at batches in the hundreds.

Arithmetic intensity (FLOPs / byte) against the ridge point (peak FLOP/s / peak bytes/s) says
which ceiling binds: below the ridge the step is memory-bound, and its best time is bytes /
bandwidth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphrt.model.config import ModelConfig


@dataclass(frozen=True)
class StepCost:
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int
    linear_flops: int  # q, k, v, o projections and the MLP
    attention_flops: int  # scores and outputs over the static cache length
    lm_head_flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops + self.lm_head_flops

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes


def step_cost(config: ModelConfig, rows: int, seq_len: int, itemsize: int) -> StepCost:
    """What one decode step of `rows` sequences over a `seq_len`-slot cache moves and computes."""
    c, i, d, v = config.hidden_size, config.intermediate_size, config.head_dim, config.vocab_size
    heads, kv_heads, layers = config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers
    table = v * c
    # num_parameters counts a tied matrix once; take out the embedding table, add the lm_head read
    non_embedding = config.num_parameters() - table * (1 if config.tie_word_embeddings else 2)
    weight_elems = non_embedding + table + rows * c
    kv_elems_per_slot = 2 * kv_heads * d  # K and V of one position of one row, one layer
    # multiply-accumulates per row and layer: q and o (C x H*D), k and v (C x K*D), the MLP
    linear_macs = 2 * c * heads * d + 2 * c * kv_heads * d + 3 * c * i
    attention_macs = 2 * heads * seq_len * d  # q.k over S slots, then p.v, per query head
    return StepCost(
        weight_bytes=weight_elems * itemsize,
        kv_read_bytes=layers * rows * seq_len * kv_elems_per_slot * itemsize,
        kv_write_bytes=layers * rows * kv_elems_per_slot * itemsize,
        linear_flops=2 * rows * layers * linear_macs,
        attention_flops=2 * rows * layers * attention_macs,
        lm_head_flops=2 * rows * c * v,
    )


@dataclass(frozen=True)
class Ceilings:
    """The device's bandwidth and FLOP/s ceilings, and where each number comes from."""

    bandwidth: float  # bytes/s
    flops: float  # FLOP/s
    bandwidth_source: str
    flops_source: str

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOPs/byte) where the two ceilings meet."""
        return self.flops / self.bandwidth


def ceilings(dtype: torch.dtype, measured: dict[str, Any]) -> Ceilings:
    """Datasheet peaks where `hardware.measure` found the device in its table; else (and for
    FLOPs outside bf16/fp16, which the table does not give) what was measured here."""
    peak = measured.get("peak")
    copy_bw, matmul = measured["copy_bandwidth"], measured["matmul_flops"]
    matmul_source = f"measured {measured['matmul_dtype']} matmul"
    if peak is None:
        return Ceilings(copy_bw, matmul, "measured copy", matmul_source)
    datasheet = f"datasheet {peak['name']}"
    if dtype in (torch.bfloat16, torch.float16):
        return Ceilings(peak["bandwidth"], peak["bf16_flops"], datasheet, datasheet)
    return Ceilings(peak["bandwidth"], matmul, datasheet, matmul_source)


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: int
    intensity: float  # FLOPs per byte
    ridge: float
    bound: str  # "memory" or "compute"
    achieved_bandwidth: float  # bytes / median step time, bytes/s
    bandwidth_share: float  # of the bandwidth ceiling
    achieved_flops: float
    flops_share: float
    bandwidth_source: str
    flops_source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline(cost: StepCost, step_seconds: float, limits: Ceilings) -> Roofline:
    """Where a step that took `step_seconds` (a median) stands against the device's ceilings."""
    achieved_bw = cost.bytes / step_seconds
    achieved_flops = cost.flops / step_seconds
    return Roofline(
        bytes=cost.bytes, flops=cost.flops, intensity=cost.intensity, ridge=limits.ridge,
        bound="memory" if cost.intensity < limits.ridge else "compute",
        achieved_bandwidth=achieved_bw, bandwidth_share=achieved_bw / limits.bandwidth,
        achieved_flops=achieved_flops, flops_share=achieved_flops / limits.flops,
        bandwidth_source=limits.bandwidth_source, flops_source=limits.flops_source)
