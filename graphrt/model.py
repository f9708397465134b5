"""Qwen2 for decoding: Hugging Face parameter names, a static KV cache, one graph-safe step.

Shapes: B batch, T new tokens (the prompt in prefill, 1 in decode), S max_seq_len, C hidden size,
H query heads, K KV heads, G = H // K query heads per KV head, D head dim, V vocab.

The same `forward(tokens, positions)` serves prefill and decode. Everything that changes from step
to step is a device tensor; no value is read back to the host, so `decode_step` can be captured
as a CUDA graph (DESIGN.md, invariant 2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graphrt.config import ModelConfig
from graphrt.errors import GraphrtError


def linear(fan_in: int, fan_out: int, *, bias: bool = False) -> nn.Linear:
    """A projection; Qwen2's have no bias, except q, k and v's."""
    return nn.Linear(fan_in, fan_out, bias=bias)


def register_unsaved(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """A buffer no checkpoint holds (HF's do not): the rotary tables, the KV cache and its
    position index are built, not loaded."""
    module.register_buffer(name, tensor, persistent=False)


class Qwen2RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in fp32, cast back, then scale: HF's order, which matters in bf16
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryTable(nn.Module):
    """cos/sin of every position up to S, in fp32, gathered by a position tensor."""

    def __init__(self, head_dim: int, theta: float, max_seq_len: int, device: torch.device):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
        freqs = torch.outer(torch.arange(max_seq_len, device=device).float(), inv_freq)
        angles = freqs.tile(2)  # [S, D]: the same angles for both halves (not interleaved)
        register_unsaved(self, "cos", angles.cos())
        register_unsaved(self, "sin", angles.sin())

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [B, T] -> cos, sin [B, T, 1, D] (the 1 broadcasts over heads)
        return self.cos[positions].unsqueeze(2).to(dtype), self.sin[positions].unsqueeze(2).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]: rotate-half RoPE."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache(nn.Module):
    """Preallocated K/V for `max_batch` sequences of `max_seq_len` tokens, written in place."""

    def __init__(self, max_batch: int, kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        shape = (max_batch, kv_heads, max_seq_len, head_dim)
        register_unsaved(self, "k", torch.zeros(shape, dtype=dtype, device=device))
        register_unsaved(self, "v", torch.zeros(shape, dtype=dtype, device=device))

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, T, K, D] at positions [B, T] of rows 0..B-1; return those rows [B, K, S, D]."""
        rows = torch.arange(k.shape[0], device=k.device).unsqueeze(1)  # [B, 1]
        # two index tensors around a slice: the indexed shape is [B, T, K, D], as k and v are
        self.k[rows, :, positions] = k
        self.v[rows, :, positions] = v
        return self.k[: k.shape[0]], self.v[: k.shape[0]]


class Qwen2Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = linear(c, self.heads * d, bias=True)
        self.k_proj = linear(c, self.kv_heads * d, bias=True)
        self.v_proj = linear(c, self.kv_heads * d, bias=True)
        self.o_proj = linear(self.heads * d, c)
        self.scale = d ** -0.5
        self.cache: KVCache | None = None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, C] -> q [B, T, H, D], k, v [B, T, K, D], rotary applied to q and k."""
        b, t, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, t, self.heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim), cos, sin)
        return q, k, self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """The attention core: write k, v at positions [B, T], attend over the cache under
        mask [B, T, S]; returns the heads side by side [B, T, H*D], before o_proj.

        The one part of a step whose cost grows with the context (and which a piecewise
        graph leaves eager); everything before and after it is a projection."""
        b, t, _, d = q.shape
        k_heads, g = self.kv_heads, self.heads // self.kv_heads
        keys, values = self.cache.update(positions, k, v)  # [B, K, S, D]

        # GQA without copying K/V: the G query heads that share a KV head become G*T rows
        # against it (broadcasting K/V over G instead would copy the whole cache every step)
        q = q.view(b, t, k_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, k_heads, g * t, d)
        scores = (q @ keys.mT).view(b, k_heads, g, t, -1) * self.scale  # [B, K, G, T, S]
        scores = scores.masked_fill(~mask[:, None, None], -math.inf)
        # softmax in fp32, as HF's eager attention; a CPU computes it in fp32 whatever the dtype,
        # so only a GPU run tells the two apart
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # pragma: no mutate (CPU)
        out = probs.view(b, k_heads, g * t, -1) @ values  # [B, K, G*T, D]
        return out.view(b, k_heads, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, self.heads * d)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(*self.project(x, cos, sin), positions, mask))


class Qwen2MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c, i = config.hidden_size, config.intermediate_size
        self.gate_proj = linear(c, i)
        self.up_proj = linear(c, i)
        self.down_proj = linear(i, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
    """State-dict compatible with HF's `Qwen2ForCausalLM`.

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

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Allocate the KV cache [max_batch, K, max_seq_len, D] per layer and the rotary table."""
        cfg, weight = self.config, self.lm_head.weight
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, max_seq_len, weight.device)
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
        [B, T, S] and rotary cos, sin [B, T, 1, D]: what every layer reads."""
        if self.rotary is None:
            raise GraphrtError("the model has no KV cache yet: call setup_cache(max_batch, max_seq_len) first")
        # query at position p sees cache slots 0..p: the mask is built on the device
        mask = self.seq_index <= positions.unsqueeze(-1)  # [B, T, S]
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rotary(positions, x.dtype)
        return x, mask, cos, sin

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's output [B, T, C] -> logits [B, T, V]."""
        return self.lm_head(self.model.norm(x))

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Eager, any prompt length: tokens [B, T] fill cache slots 0..T-1; logits [B, T, V]."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return self(tokens, positions)

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The one step every backend runs: tokens [B, 1], positions [B] -> logits [B, V]."""
        return self(tokens, positions.unsqueeze(1))[:, -1]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> next token ids [B, 1], on the device."""
    return logits.argmax(dim=1, keepdim=True)
