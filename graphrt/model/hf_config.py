"""The config of a checkpoint that runs on transformers' own forward: the shapes graphrt reports
(the KV cache, the memory a run needs) read from its `config.json`, and its parameters counted
from its safetensors headers. Torch-free, like graphrt.model.config: transformers checks the
rest of the config itself, when it loads the model."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError
from graphrt.model.config import ModelConfig, read_config_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HEADER_BOUND = 100 << 20  # a safetensors header is JSON of names and shapes: MBs at the most

_SHAPES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")


def _header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> dtype, shape and offsets."""
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > HEADER_BOUND:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise GraphrtError(f"{file}: not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise GraphrtError(f"{file}: not a readable safetensors file (its header is not a JSON object)")
    return header


def tensor_files(path: Path) -> dict[str, Path] | list[Path]:
    """The files of a single-file or sharded safetensors checkpoint: by tensor name where an
    index says, else the one file. Torch-free: what loading the weights and counting them share."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = dict(json.loads(index.read_text())["weight_map"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise GraphrtError(f"{index}: expected JSON with a 'weight_map' object ({e})") from None
        absent = [name for name in sorted(set(weight_map.values())) if not (path / name).is_file()]
        if absent:  # every one of them, not the first: a copy that lost shards lost them together
            raise GraphrtError(f"{index}: names shard(s) {', '.join(absent)}, missing from {path}")
        return {tensor: path / name for tensor, name in weight_map.items()}
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    raise GraphrtError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} in this directory")


def checkpoint_parameters(path: Path) -> int:
    """Elements of every tensor a checkpoint holds, from its headers alone."""
    total = 0
    files = tensor_files(path)
    for file in sorted(set(files.values())) if isinstance(files, dict) else files:
        for name, entry in _header(file).items():
            if name != "__metadata__":
                numel = 1
                for n in entry["shape"]:
                    numel *= n
                total += numel
    return total


def from_transformers_dir(path: Path) -> ModelConfig:
    """A checkpoint's config for transformers' forward: any decoder-only causal LM."""
    raw = read_config_json(path)
    file = path / "config.json"
    if raw.get("is_encoder_decoder"):
        raise GraphrtError(f"{file}: model_type {raw.get('model_type')!r} is an encoder-decoder model; "
                           "graphrt decodes decoder-only causal LMs")
    if not isinstance(raw.get("model_type"), str):
        raise GraphrtError(f"{file}: no model_type, so transformers cannot tell which model it is")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw  # multimodal wrappers
    shapes = {k: text[k] for k in _SHAPES if isinstance(text.get(k), int) and not isinstance(text.get(k), bool)}
    shapes.setdefault("num_key_value_heads", shapes.get("num_attention_heads", 0))
    dtype = raw.get("dtype", raw.get("torch_dtype")) or "bfloat16"
    return ModelConfig(
        name=path.name, **{k: shapes.get(k, 0) for k in _SHAPES[:6]},
        head_dim=shapes.get("head_dim", 0), max_position_embeddings=shapes.get("max_position_embeddings", 32768),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings")),
        torch_dtype=dtype if isinstance(dtype, str) else "bfloat16", model_type=raw["model_type"],
        implementation="hf", parameters=checkpoint_parameters(path), hf_config=raw)
