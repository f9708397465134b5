"""A model's decode step linted on its own (`graphrt lint --model`): the lint `run` does before
capture (graphrt.backends.graph.lint_decode), and for a model with experts the same for each
experts implementation transformers offers, with whether a graph captures the step and what the
step launches.

    result = lint_model(spec)    # the spec's model, impl, experts, batch, device, dtype, cache length
    result.chosen                # the step `run` would capture: its findings, captured, ops per step
    result.experts               # one StepCheck per implementation (None for a model without experts)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from graphrt.backends.graph import lint_decode, lint_states
from graphrt.errors import first_line
from graphrt.graphs import GraphCaptureError, capture
from graphrt.graphs.findings import Finding
from graphrt.measure.launches import CountedStep, count_steps
from graphrt.model.config import ModelConfig
from graphrt.model.hf_causal import EXPERTS, set_experts
from graphrt.run import execute
from graphrt.run.spec import RunSpec


@dataclass(frozen=True)
class StepCheck:
    """One decode step checked: what the lint found, whether a graph captured it, what it launches."""

    experts: str | None  # its experts implementation; None for a model without experts
    findings: tuple[Finding, ...] = ()
    # why the step did not run at all: transformers refuses the implementation here, or its step
    # fails on this device; None where it ran
    unavailable: str | None = None
    refused: str | None = None  # the capture's refusal of a lint-clean step; None where it took it
    captured: bool = False  # lint-clean, and a graph captured it (CUDA's on CUDA, a TapeGraph elsewhere)
    ops_per_step: int | None = None  # kernels on CUDA, aten ops that do work elsewhere (as `run` counts)


@dataclass(frozen=True)
class ModelLint:
    config: ModelConfig
    architecture: str  # the class whose step is linted: graphrt's lean model or transformers'
    batch: int
    device: torch.device
    dtype: torch.dtype
    chosen: StepCheck  # the step `run` would capture: --experts, else the default
    experts: tuple[StepCheck, ...] | None  # each implementation in EXPERTS' order; None without experts
    default_experts: str | None  # the implementation `run` uses without --experts


def lint_model(spec: RunSpec) -> ModelLint:
    """Load the spec's model with a KV cache of `spec.batch` rows and `spec.seq_len` slots, and
    check its decode step (with experts: once per implementation, the chosen one last, so the
    model is left as `run` would run it)."""
    config, model, device, dtype = execute.load(spec)
    model.setup_cache(spec.batch, spec.seq_len)
    chosen = getattr(model, "experts", None)  # graphrt's lean models have no experts
    architecture = type(getattr(model, "hf", model)).__name__
    if chosen is None:
        check = check_step(model, spec.batch, device, None)
        return ModelLint(config, architecture, spec.batch, device, dtype, check, None, None)
    checks = {name: _check_experts(model, name, spec.batch, device)
              for name in sorted(EXPERTS, key=lambda name: name == chosen)}
    return ModelLint(config, architecture, spec.batch, device, dtype, checks[chosen],
                     tuple(checks[name] for name in EXPERTS), model.default_experts)


def _check_experts(model: nn.Module, experts: str, batch: int, device: torch.device) -> StepCheck:
    """The step on one experts implementation, or why transformers cannot run it here."""
    if (why := set_experts(model.hf, experts)) is not None:
        return StepCheck(experts, unavailable=f"transformers refuses it here ({why})")
    try:
        return check_step(model, batch, device, experts)
    except (RuntimeError, NotImplementedError) as failure:  # a kernel this device or dtype lacks
        return StepCheck(experts, unavailable=f"its step fails here: {first_line(failure)}")


def check_step(model: nn.Module, batch: int, device: torch.device, experts: str | None) -> StepCheck:
    """Lint the step (`lint_decode`), count one step, and where the lint is clean, capture it."""
    report = lint_decode(model, batch)
    step, position = _first_state_step(model, batch)
    model.seek(position)
    ops = count_steps([CountedStep("lint", step)], device)["lint"].ops
    if not report.clean:
        return StepCheck(experts, report.findings, ops_per_step=ops)
    model.seek(position)  # the warmup and the capture write the two slots from here on
    try:
        with torch.inference_mode():
            capture(step, device=device, warmup=1)
    except GraphCaptureError as refusal:
        return StepCheck(experts, refused=f"the capture refused the step: {first_line(refusal)}",
                         ops_per_step=ops)
    return StepCheck(experts, captured=True, ops_per_step=ops)


def _first_state_step(model: nn.Module, batch: int) -> tuple[Callable[[], torch.Tensor], int]:
    """The step on the lint's first state (`lint_states`: the middle of the cache), read by the
    closure as a capture's static inputs; and that state's position."""
    ((tokens, positions), _), position = lint_states(model, batch)

    def step() -> torch.Tensor:
        with torch.inference_mode():
            return model.decode_step(tokens, positions)

    return step, position
