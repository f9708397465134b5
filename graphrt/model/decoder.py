"""The decoder for Qwen2/2.5, Qwen3 and Llama 3.x: Hugging Face parameter names, a static KV
cache, one lean graph-safe step.

Shapes: B batch, T new tokens (the prompt in prefill, 1 in decode), S max_seq_len, C hidden size,
H query heads, K KV heads, G = H // K query heads per KV head, D head dim, V vocab.

The same `forward(tokens, positions)` serves prefill and decode. Everything that changes from step
to step is a device tensor; no value is read back to the host, so `decode_step` can be captured
as a CUDA graph (docs/design.md, Invariants, 2).

The step is lean, as serving engines make it: q/k/v and gate/up are one GEMM each
(`graphrt.model.packing`), every norm is one `F.rms_norm`, rotary is three elementwise ops for q and k
together, attention is one `F.scaled_dot_product_attention`, and what attention needs from the
positions (an additive mask) is built once per step, not once per layer. The families differ
only by `ModelConfig.family`: q/k/v bias (Qwen2), a norm per head of q and k (Qwen3), the
llama3 rescaling of rotary frequencies (Llama 3.1+).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graphrt.errors import GraphrtError
from graphrt.model.config import Llama3Rope, ModelConfig
from graphrt.model.packing import PackedLinear, pack_checkpoint_names

# elements between the attention mask's rows: 16 bytes in bf16, the alignment the memory-efficient
# SDPA kernel wants of every stride of its bias
MASK_ALIGN = 8


def linear(fan_in: int, fan_out: int) -> nn.Linear:
    """A projection without bias: o_proj, down_proj, lm_head."""
    return nn.Linear(fan_in, fan_out, bias=False)


def register_unsaved(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """A buffer no checkpoint holds (HF's do not): the rotary tables, the KV cache and its
    position index are built, not loaded."""
    module.register_buffer(name, tensor, persistent=False)


class Qwen2RMSNorm(nn.Module):
    """One `F.rms_norm`: on CUDA one fused kernel; on the CPU it reaches the dispatcher
    decomposed (6 ops in fp32).

    It computes in fp32 and multiplies by the weight before the one cast back; HF's RMSNorm
    casts back first and multiplies in the model dtype. In fp32 the two are the same; in bf16
    and fp16 they differ by at most one rounding of the product (F.rms_norm's is the more
    exact), which is the price of one kernel instead of eight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def inverse_frequencies(head_dim: int, theta: float, scaling: Llama3Rope | None) -> torch.Tensor:
    """RoPE's D/2 inverse frequencies, in fp32 on the CPU; rescaled once under `llama3`:
    wavelengths longer than the pretraining context / low_freq_factor are divided by `factor`,
    shorter than context / high_freq_factor kept, and those between interpolated."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device="cpu").float() / head_dim)
    if scaling is None:
        return inv_freq
    context = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    smooth = ((context / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    between = (wavelen >= context / scaling.high_freq_factor) & (wavelen <= context / scaling.low_freq_factor)
    return torch.where(between, smoothed, scaled)


class RotaryTable(nn.Module):
    """cos and signed sin of every position up to S, computed in fp32 and stored in the model's
    dtype (HF casts the same values at every step), gathered by a position tensor in one op."""

    def __init__(self, config: ModelConfig, max_seq_len: int, device: torch.device, dtype: torch.dtype):
        super().__init__()
        inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        freqs = torch.outer(torch.arange(max_seq_len, device="cpu").float(), inv_freq)  # [S, D/2]
        # rotate-half: x * cos + (-x2, x1) * sin; the sign moves into the table, so rotary
        # needs only the halves swapped (see `apply_rotary`)
        cos, sin = freqs.cos().tile(2), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)  # [S, D]
        register_unsaved(self, "cos_sin", torch.stack((cos, sin), dim=1).to(device, dtype))  # [S, 2, D]

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [B, T] -> cos, sin [B, T, 1, D] (the 1 broadcasts over heads)
        both = self.cos_sin[positions]  # [B, T, 2, D]
        return both[:, :, 0:1], both[:, :, 1:2]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]: rotate-half RoPE in three ops (a multiply, a swap of halves, a
    multiply-add); `sin` carries the sign of the first half."""
    first, second = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((second, first), dim=-1), sin)


class KVCache(nn.Module):
    """Preallocated K/V for `max_batch` sequences of `max_seq_len` tokens, written in place."""

    def __init__(self, max_batch: int, kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        shape = (max_batch, kv_heads, max_seq_len, head_dim)
        register_unsaved(self, "k", torch.zeros(shape, dtype=dtype, device=device))
        register_unsaved(self, "v", torch.zeros(shape, dtype=dtype, device=device))
        register_unsaved(self, "rows", torch.arange(max_batch, device=device).unsqueeze(1))  # [max_batch, 1]

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, T, K, D] at positions [B, T] of rows 0..B-1; return those rows [B, K, S, D]."""
        b = k.shape[0]
        rows = self.rows[:b]
        # two index tensors around a slice: the indexed shape is [B, T, K, D], as k and v are
        self.k[rows, :, positions] = k
        self.v[rows, :, positions] = v
        return self.k[:b], self.v[:b]


class Qwen2Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c, d, family = config.hidden_size, config.head_dim, config.family
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.groups = config.num_query_groups
        # rows: q heads, then k heads, then v heads (graphrt.model.packing)
        self.qkv_proj = PackedLinear(c, (("q_proj", self.heads * d), ("k_proj", self.kv_heads * d),
                                         ("v_proj", self.kv_heads * d)), bias=family.qkv_bias)
        self.o_proj = linear(self.heads * d, c)
        # Qwen3: an RMSNorm over each head of q and of k, before rotary
        self.q_norm = Qwen2RMSNorm(d, config.rms_norm_eps) if family.qk_norm else None
        self.k_norm = Qwen2RMSNorm(d, config.rms_norm_eps) if family.qk_norm else None
        self.scale = d ** -0.5
        self.cache: KVCache | None = None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, C] -> q [B, T, H, D], k, v [B, T, K, D], rotary applied to q and k."""
        b, t, _ = x.shape
        qkv = self.qkv_proj(x).view(b, t, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split((self.heads, self.kv_heads, self.kv_heads), dim=2)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=2)
        else:
            qk = qkv.narrow(2, 0, self.heads + self.kv_heads)  # q and k side by side: one rotary for both
        q, k = apply_rotary(qk, cos, sin).split((self.heads, self.kv_heads), dim=2)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """The attention core: write k, v at positions [B, T], attend over the cache under the
        additive mask [B, 1, T*G, S] (`attention_mask`); returns the heads side by side
        [B, T, H*D], before o_proj.

        The one part of a step whose cost grows with the context (and which a piecewise
        graph leaves eager); everything before and after it is a projection."""
        b, t, _, d = q.shape
        keys, values = self.cache.update(positions, k, v)  # [B, K, S, D]
        # GQA without copying K/V: the G query heads that share a KV head become T*G query rows
        # against it (row t*G + g), so SDPA sees K heads and needs no `enable_gqa`, which no
        # fused CUDA kernel takes together with a mask (torch falls back to its math path and
        # copies K/V); for T = 1 the reshapes are views
        q = q.reshape(b, t, self.kv_heads, self.groups, d).transpose(1, 2).reshape(b, self.kv_heads, t * self.groups, d)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        return out.view(b, self.kv_heads, t, self.groups, d).transpose(1, 2).reshape(b, t, self.heads * d)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(*self.project(x, cos, sin), positions, mask))


class Qwen2MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = PackedLinear(c, (("gate_proj", i), ("up_proj", i)))  # rows: gate, then up
        self.down_proj = linear(i, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Qwen2Attention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = Qwen2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = Qwen2RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self._mlp_block(x + self.self_attn(self.input_layernorm(x), positions, mask, cos, sin))

    # The same layer in the three parts a piecewise step runs it in: `qkv` and `finish` around
    # `self_attn.attend`. `forward` is exactly finish(x, attend(*qkv(x, ...), ...)).

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The residual stream x [B, T, C] -> this layer's q, k, v (see `Qwen2Attention.project`)."""
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] and the attention core's output [B, T, H*D] -> the layer's output."""
        return self._mlp_block(x + self.self_attn.o_proj(attended))

    def _mlp_block(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen2RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen2ForCausalLM(nn.Module):
    """State-dict compatible with HF's `Qwen2ForCausalLM`, `Qwen3ForCausalLM` or
    `LlamaForCausalLM`, as `config.model_type` says: the packed projections save and load
    under the checkpoint's own names (`graphrt.model.packing`).

    Build it (on the `meta` device for big models), load or initialise the weights, then call
    `setup_cache` before the first forward: the rotary table and KV cache live on the weights'
    device.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary: RotaryTable | None = None
        self.max_batch = self.max_seq_len = 0
        self.fixed_batch = False  # the cache takes any batch up to max_batch
        self.register_load_state_dict_pre_hook(pack_checkpoint_names)

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Allocate the KV cache [max_batch, K, max_seq_len, D] per layer and the rotary table."""
        cfg, weight = self.config, self.lm_head.weight
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.rotary = RotaryTable(cfg, max_seq_len, weight.device, weight.dtype)
        register_unsaved(self, "seq_index", torch.arange(max_seq_len, device=weight.device))
        for layer in self.model.layers:
            # the layer's own KV heads: all of them, or a tensor-parallel rank's share
            layer.self_attn.cache = KVCache(max_batch, layer.self_attn.kv_heads, max_seq_len,
                                            cfg.head_dim, weight.dtype, weight.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions [B, T] -> logits [B, T, V]; writes K/V at `positions`."""
        x, mask, cos, sin = self.embed(tokens, positions)
        for layer in self.model.layers:
            x = layer(x, positions, mask, cos, sin)
        return self.head(x)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens, positions [B, T] -> the residual stream x [B, T, C], the attention mask
        [B, 1, T*G, S] and rotary cos, sin [B, T, 1, D]: what every layer reads, made once."""
        if self.rotary is None:
            raise GraphrtError("the model has no KV cache yet: call setup_cache(max_batch, max_seq_len) first")
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rotary(positions)
        return x, self.attention_mask(positions, x.dtype), cos, sin

    def attention_mask(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """positions [B, T] -> the additive mask [B, 1, T*G, S] that `Qwen2Attention.attend`
        gives SDPA: 0 where the query at position p may see a cache slot (0..p), -inf elsewhere,
        built on the device. Additive, since SDPA turns a boolean mask into this in every layer.

        Laid out as the fused CUDA kernels take it: every row its own memory (no stride-0
        broadcast of one row over a group's query rows, which cuDNN reads as a real layout), and
        rows MASK_ALIGN elements apart (the memory-efficient kernel copies a mask whose strides
        are not, in every layer). The head dim is a plain size-1 broadcast, which every backend takes."""
        b, t = positions.shape
        s = self.seq_index.numel()
        # one row per (query, head of its group), in attend's order t*G + g; the layers' own G
        # (a tensor-parallel rank holding one replicated KV head has fewer query heads per group)
        groups = self.model.layers[0].self_attn.groups
        seen = self.seq_index <= positions.unsqueeze(-1)  # [B, T, S]
        seen = seen[:, None, :, None].expand(b, 1, t, groups, s).reshape(b, 1, t * groups, s)
        row = -(-s // MASK_ALIGN) * MASK_ALIGN
        mask = torch.zeros(b, 1, t * groups, row, dtype=dtype, device=seen.device)[..., :s]
        return mask.masked_fill_(~seen, -math.inf)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's output [B, T, C] -> logits [B, T, V]."""
        return self.lm_head(self.model.norm(x))

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Eager, any prompt length: tokens [B, T] fill cache slots 0..T-1; logits [B, T, V]."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return self(tokens, positions)

    def kv_cache_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the KV cache: each layer's K and V."""
        return [t for layer in self.model.layers for t in (layer.self_attn.cache.k, layer.self_attn.cache.v)]

    def seek(self, position: int) -> None:
        """Nothing to move: the step writes the cache at its `positions` input. (A model whose
        cache keeps its own write position moves it here: graphrt.model.hf_causal.)"""

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The one step every backend runs: tokens [B, 1], positions [B] -> logits [B, V]."""
        return self(tokens, positions.unsqueeze(1))[:, -1]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> next token ids [B, 1], on the device."""
    return logits.argmax(dim=1, keepdim=True)
