"""Weights: build a model on its device, then load a HF checkpoint or a seeded random init."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from safetensors import SafetensorError, safe_open

from graphrt.errors import GraphrtError
from graphrt.model.config import ModelConfig
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.hf_config import tensor_files
from graphrt.model.sharding import Shard, Slice, parallelize, rank_slices, take



def load_model(config: ModelConfig, device: torch.device, dtype: torch.dtype,
               checkpoint: str | Path | None = None, seed: int = 0, ranks: Shard | None = None,
               experts: str | None = None) -> nn.Module:
    """The model a run decodes: graphrt's lean step (`build_model`), or transformers' own
    forward (graphrt.model.hf_causal) where `config.implementation` says so. `experts` picks
    transformers' experts implementation of a model with experts."""
    if config.lean:
        if experts:
            raise GraphrtError(f"--experts {experts}: {config.name} runs on graphrt's step, which has "
                               "no experts; --experts is for models with experts on transformers' forward")
        return build_model(config, device, dtype, checkpoint, seed, ranks)
    if ranks is not None:
        raise GraphrtError(f"--tp: {config.name} runs on transformers' own forward, which graphrt does "
                           "not shard; leave out --tp")
    from graphrt.model import hf_causal

    if config.hf_config is None:  # a lean family under --impl hf: transformers' model on its tensors
        lean = build_model(replace(config, implementation="lean"), device, dtype, checkpoint, seed)
        return hf_causal.from_lean(lean, config, experts)
    return hf_causal.load_transformers(config, Path(checkpoint), device, dtype, experts)


def build_model(config: ModelConfig, device: torch.device, dtype: torch.dtype,
                checkpoint: str | Path | None = None, seed: int = 0,
                ranks: Shard | None = None) -> Qwen2ForCausalLM:
    """The model with its weights on `device` in `dtype`: from `checkpoint` or random (`seed`).

    Parameters are first made on the meta device, so no memory is spent twice. With `ranks`
    (tensor parallelism), the model holds this rank's share (`parallel.linear`): a checkpoint is
    read slice by slice, and a random init is the single-rank one, sliced.
    """
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
        whole = {name: p.shape for name, p in model.state_dict().items()}  # the HF shapes
        slices = {}
        if ranks is not None:
            slices = rank_slices(config, parallelize(model, config, ranks))
    model.to_empty(device=device).to(dtype)
    if config.tie_word_embeddings:  # to_empty keeps the tie, but be explicit: one tensor
        model.lm_head.weight = model.model.embed_tokens.weight
    if checkpoint is None:
        random_init(model, seed, whole, slices)
    else:
        load_checkpoint(model, checkpoint, whole, slices)
    return model.eval().requires_grad_(False)


def _fill(target: torch.Tensor, pieces: tuple[Slice, ...] | None,
          read: Callable[[Slice | None], torch.Tensor]) -> None:
    """Copy into `target` the whole tensor (`pieces` None) or its pieces, stacked along dim 0."""
    with torch.no_grad():
        target.copy_(read(None) if pieces is None else torch.cat([read(p) for p in pieces]))


def random_init(model: Qwen2ForCausalLM, seed: int, whole: dict[str, torch.Size] | None = None,
                slices: dict[str, tuple[Slice, ...]] | None = None) -> None:
    """Randomise every parameter, biases and norm weights too, the same way on every device.

    Norm weights are drawn around 1 and the rest around 0 with std 0.02 (HF's initializer range):
    a reference test that leaves biases at 0 and norms at 1 never exercises them. Values are
    drawn at each tensor's `whole` shape (default: the parameter's), then its `slices` taken, so
    every rank of a tensor-parallel model holds its slices of the same model.
    """
    gen = torch.Generator().manual_seed(seed)
    # by checkpoint name: a packed projection's parts are views of its rows (graphrt.model.packing)
    tensors = model.state_dict()
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")  # the embedding's
    for name, p in sorted(tensors.items()):
        values = torch.randn((whole or {}).get(name, p.shape), generator=gen)
        values = 1 + 0.1 * values if "norm" in name else 0.02 * values
        _fill(p, (slices or {}).get(name), lambda piece: values if piece is None else take(values, piece))


class _Checkpoint:
    """Tensors of a checkpoint read lazily: whole, or only a slice (safetensors `get_slice`
    reads just those bytes)."""

    def __init__(self, path: Path, stack: contextlib.ExitStack):
        files = tensor_files(path)
        self.handles: dict[str, Any] = {}
        for file in sorted(set(files.values()) if isinstance(files, dict) else files):
            try:
                handle = stack.enter_context(safe_open(file, framework="pt"))
            except (SafetensorError, OSError) as e:
                raise GraphrtError(f"{file}: not a readable safetensors file ({e})") from None
            self.handles.update({name: handle for name in handle.keys()})

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.handles[name].get_slice(name).get_shape())

    def read(self, name: str, piece: Slice | None) -> torch.Tensor:
        if piece is None:
            return self.handles[name].get_tensor(name)
        part = self.handles[name].get_slice(name)
        return part[piece.start:piece.stop] if piece.dim == 0 else part[:, piece.start:piece.stop]


def load_checkpoint(model: Qwen2ForCausalLM, path: str | Path, whole: dict[str, torch.Size] | None = None,
                    slices: dict[str, tuple[Slice, ...]] | None = None) -> list[str]:
    """Copy a HF checkpoint into `model`, casting to its dtype; returns the unexpected names.

    Every expected tensor must be present with the expected shape (`whole`: the HF shapes,
    default the model's own). A tied checkpoint has no `lm_head.weight`; an untied one must have
    it. A parameter with `slices` reads only those.
    """
    path = Path(path)
    expected = model.state_dict()
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    with contextlib.ExitStack() as stack:
        found = _Checkpoint(path, stack)
        missing = sorted(set(expected) - set(found.handles))
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise GraphrtError(f"{path}: checkpoint lacks tensor(s) {', '.join(missing[:3])}{more}")
        for name, target in expected.items():
            shape = tuple((whole or {}).get(name, target.shape))
            if found.shape(name) != shape:
                raise GraphrtError(f"{path}: tensor {name} has shape {found.shape(name)}, "
                                   f"expected {shape}")
            _fill(target, (slices or {}).get(name), lambda piece: found.read(name, piece))
    return sorted(set(found.handles) - set(expected) - {"lm_head.weight"})
