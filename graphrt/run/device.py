"""The device and dtype that a run's `--device` and `--dtype` resolve to on this machine."""

from __future__ import annotations

import torch

from graphrt.errors import GraphrtError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise GraphrtError("--device cuda: CUDA is not available here (this torch build "
                           f"{torch.__version__} sees no GPU); use --device cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)
