"""The machine a run, a trace, a sweep or a plan runs on: the device and dtype its `--device` and
`--dtype` resolve to here, and, as its JSON records it, the hardware's facts, on CUDA what a
capture and a trace can say of graph nodes there, and the versions it ran with."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from graphrt.errors import GraphrtError
from graphrt.graphs import annotate
from graphrt.measure import hardware


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


def machine(device: torch.device) -> dict[str, Any]:
    """Facts that make a result comparable with another machine's."""
    facts = hardware.describe(device)
    if device.type == "cuda":  # can a capture record which module each graph node belongs to?
        facts["graph_node_annotations"] = annotate.unavailable() or "available"
        facts["profiler_graph_node_records"] = annotate.profiler_node_ids()  # what a trace can look up
    return facts


def versions() -> dict[str, str | None]:
    """The versions of graphrt and what it measures with, as a result records them (None: not installed)."""
    found = {}
    for package in ("graphrt", "torch", "transformers", "matplotlib", "nvtx"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    found["torch"] = torch.__version__  # the running one, local build tag included
    return found
