"""Which model a name means: a preset, or a checkpoint directory read for graphrt's lean step or
for transformers' own forward (`--impl`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from graphrt.errors import GraphrtError
from graphrt.model.config import IMPLEMENTATIONS, PRESETS, ModelConfig, from_hf_dir, lean_problem, read_config_json
from graphrt.model.hf_config import from_transformers_dir


def resolve(model: str, impl: str = "auto") -> tuple[ModelConfig, Path | None]:
    """A preset by name (no checkpoint: random weights), or a HF model directory and its config.

    `impl` picks the forward: "lean" graphrt's step (refused with the reason where it cannot run
    the model), "hf" transformers' own, "auto" the lean step where it can run the model, else
    transformers'."""
    if impl not in IMPLEMENTATIONS:
        raise GraphrtError(f"--impl must be one of {', '.join(IMPLEMENTATIONS)}, got {impl!r}")
    if model in PRESETS:
        return (replace(PRESETS[model], implementation="hf") if impl == "hf" else PRESETS[model]), None
    if not model.strip():
        raise GraphrtError(f"--model {model!r}: expected a preset ({', '.join(PRESETS)}) or a model directory")
    if "/" not in model and not Path(model).exists():
        raise GraphrtError(f"unknown model {model!r}: not a directory, and not a preset "
                           f"({', '.join(PRESETS)})")
    path = Path(model)
    if impl == "lean" or (impl == "auto" and lean_problem(read_config_json(path)) is None):
        return from_hf_dir(path), path
    return from_transformers_dir(path), path
