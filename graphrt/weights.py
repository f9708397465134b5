"""Weights: build a model on its device, then load a HF checkpoint or a seeded random init."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from graphrt.config import ModelConfig
from graphrt.errors import GraphrtError
from graphrt.model import Qwen2ForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def build_model(config: ModelConfig, device: torch.device, dtype: torch.dtype,
                checkpoint: str | Path | None = None, seed: int = 0) -> Qwen2ForCausalLM:
    """The model with its weights on `device` in `dtype`: from `checkpoint` or random (`seed`).

    Parameters are first made on the meta device, so no memory is spent twice.
    """
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model.to_empty(device=device).to(dtype)
    if config.tie_word_embeddings:  # to_empty keeps the tie, but be explicit: one tensor
        model.lm_head.weight = model.model.embed_tokens.weight
    if checkpoint is None:
        random_init(model, seed)
    else:
        load_checkpoint(model, checkpoint)
    return model.eval().requires_grad_(False)


def random_init(model: Qwen2ForCausalLM, seed: int) -> None:
    """Randomise every parameter, biases and norm weights too, the same way on every device.

    Norm weights are drawn around 1 and the rest around 0 with std 0.02 (HF's initializer range):
    a reference test that leaves biases at 0 and norms at 1 never exercises them.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        values = torch.randn(p.shape, generator=gen)
        values = 1 + 0.1 * values if "norm" in name else 0.02 * values
        p.data.copy_(values)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a single-file or sharded safetensors checkpoint, on the CPU."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise GraphrtError(f"{index}: expected JSON with a 'weight_map' object ({e})") from None
        files = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise GraphrtError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} in this directory")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        file = path / name
        if not file.is_file():
            raise GraphrtError(f"{index}: names shard {name}, which is missing")
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError) as e:
            raise GraphrtError(f"{file}: not a readable safetensors file ({e})") from None
    return tensors


def load_checkpoint(model: Qwen2ForCausalLM, path: str | Path) -> list[str]:
    """Copy a HF checkpoint into `model`, casting to its dtype; returns the unexpected names.

    Every expected tensor must be present with the expected shape. A tied checkpoint has no
    `lm_head.weight`; an untied one must have it.
    """
    path = Path(path)
    found = _read_tensors(path)
    expected = model.state_dict()
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(found))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise GraphrtError(f"{path}: checkpoint lacks tensor(s) {', '.join(missing[:3])}{more}")
    for name, target in expected.items():
        if found[name].shape != target.shape:
            raise GraphrtError(f"{path}: tensor {name} has shape {tuple(found[name].shape)}, "
                               f"expected {tuple(target.shape)}")
        target.copy_(found[name])
    return sorted(set(found) - set(expected) - {"lm_head.weight"})
