"""Tiny seeded checkpoints of architectures transformers ships, made and saved by transformers
itself: the models graphrt runs on transformers' own forward, with no download.

Every architecture shares one tiny shape (2 layers, 4 query heads over 2 KV heads of 16, a
vocabulary of 512); what each adds is what makes it that architecture (experts, sliding-window
layers). Every parameter is drawn from one seeded generator: transformers' own init leaves
norms at 1 and biases at 0, which would never exercise them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
# sliding-window layers, one of each kind, with a window shorter than the tests' decodes
# (a prompt of 6 and 6 steps reach position 12), so the window really drops tokens
SLIDING = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])

# model_type -> what it adds to SHAPE
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "mistral": dict(sliding_window=None),  # full attention in every layer
    "gemma3_text": SLIDING,
    "phi3": dict(pad_token_id=0),  # its default pad id is outside a vocabulary of 512
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, **SLIDING),
}
# the families graphrt's lean step runs too: transformers' forward on them is `--impl hf`
LEAN = ("qwen2", "qwen3", "llama")
WITH_EXPERTS = ("qwen3_moe", "mixtral", "gpt_oss")


def randomized(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """`model` with every parameter drawn from a seeded generator, biases and norms too: norms
    around 1, the rest around 0 with std 0.02 (transformers' own init leaves biases at 0 and
    norms at 1, which would never exercise them)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.02 * noise)
    return model


def hf_model(model_type: str, seed: int = 0) -> torch.nn.Module:
    """transformers' causal LM of `model_type` at the tiny shape, every parameter randomised."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **SHAPE, **ARCHITECTURES.get(model_type, {}))
    return randomized(transformers.AutoModelForCausalLM.from_config(config).eval(), seed)


def save_checkpoint(model_type: str, directory: Path, seed: int = 0) -> Path:
    """`hf_model(model_type, seed)` saved as transformers saves it (config.json, model.safetensors)."""
    hf_model(model_type, seed).save_pretrained(directory)
    return directory


def reference(directory: Path) -> torch.nn.Module:
    """The checkpoint loaded by transformers itself, fp32: the implementation graphrt is checked
    against. A model with experts runs transformers' per-expert loop, the plainest of its
    experts implementations and the one graphrt never picks by default."""
    transformers = pytest.importorskip("transformers")
    experts = {"experts_implementation": "eager"} if directory.name in WITH_EXPERTS else {}
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **experts).eval()


def greedy_generate(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' greedy `generate` with its static cache: the `new_tokens` ids [B, N] after `prompt` [B, T]."""
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                         do_sample=False, cache_implementation="static", pad_token_id=0)
    return out[:, prompt.shape[1]:]


def lack_grouped_mm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Be a device without grouped_mm: transformers' check for it fails as it fails there."""
    transformers = pytest.importorskip("transformers")

    def unavailable(self):
        raise ImportError("grouped_mm needs a newer torch on this device")

    monkeypatch.setattr(transformers.PreTrainedModel, "_grouped_mm_can_dispatch", unavailable)
