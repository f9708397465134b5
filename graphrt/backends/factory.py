"""Mode names on the command line -> backends."""

from __future__ import annotations

from graphrt.backends import Backend
from graphrt.backends.compiled import CompileBackend
from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.backends.piecewise import PiecewiseBackend
from graphrt.errors import GraphrtError
from graphrt.model.decoder import Qwen2ForCausalLM

MODES = ("eager", "piecewise", "graph", "compile")
GROUPS = {"both": ("eager", "graph"), "all": ("eager", "piecewise", "graph", "compile")}


def expand_modes(mode: str) -> tuple[str, ...]:
    """`both` and `all` name several modes, a comma list (`eager,piecewise,graph`) its own;
    the others one."""
    if mode in GROUPS:
        return GROUPS[mode]
    names = tuple(mode.split(","))
    if all(name in MODES for name in names) and len(set(names)) == len(names):
        return names
    raise GraphrtError(f"--mode must be one of {', '.join((*MODES, *GROUPS))} or a comma list of "
                       f"distinct modes, got {mode!r}")


def make_backend(mode: str, model: Qwen2ForCausalLM, buckets: tuple[int, ...] | None = None,
                 lint: bool = True, annotate: bool = False, probe: bool = False) -> Backend:
    """`annotate`: a graph backend also records graph-node annotations; `probe`: a graph or
    piecewise backend probes every module (GraphBackend)."""
    if mode == "graph":
        return GraphBackend(model, buckets, lint, annotate, probe)
    if mode == "piecewise":
        return PiecewiseBackend(model, buckets, lint, probe=probe)
    if mode == "compile":
        return CompileBackend(model)
    return EagerBackend(model)
