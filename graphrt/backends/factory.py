"""Mode names on the command line -> backends."""

from __future__ import annotations

from graphrt.backends.base import Backend
from graphrt.backends.compiled import CompileBackend
from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.backends.piecewise import ModulePiecewiseBackend, PiecewiseBackend
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.vocab import Mode


def make_backend(mode: Mode, model: Qwen2ForCausalLM, buckets: tuple[int, ...] | None = None,
                 lint: bool = True, annotate: bool = False, probe: bool = False) -> Backend:
    """`annotate`: a graph backend also records graph-node annotations; `probe`: a graph or
    piecewise backend probes every module (GraphBackend)."""
    if mode == Mode.GRAPH:
        return GraphBackend(model, buckets, lint, annotate, probe)
    if mode == Mode.PIECEWISE:
        if not model.config.lean:  # transformers' forward: its breaks found in its module tree
            return ModulePiecewiseBackend(model, buckets, lint, probe=probe)
        return PiecewiseBackend(model, buckets, lint, probe=probe)
    if mode == Mode.COMPILE:
        return CompileBackend(model)
    return EagerBackend(model)
