"""The machine a run, a trace or a sweep ran on, as its JSON records it: the hardware's facts and,
on CUDA, what a capture and a trace can say of graph nodes there."""

from __future__ import annotations

from typing import Any

import torch

from graphrt.graphs import annotate
from graphrt.measure import hardware


def machine(device: torch.device) -> dict[str, Any]:
    """Facts that make a result comparable with another machine's."""
    facts = hardware.describe(device)
    if device.type == "cuda":  # can a capture record which module each graph node belongs to?
        facts["graph_node_annotations"] = annotate.unavailable() or "available"
        facts["profiler_graph_node_records"] = annotate.profiler_node_ids()  # what a trace can look up
    return facts
