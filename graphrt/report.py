"""Tables and JSON for a run."""

from __future__ import annotations

from typing import Any

import torch
from tabulate import tabulate

from graphrt.equivalence import compare
from graphrt.runner import RunResult

MIB = 1 << 20


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def header(result: RunResult) -> str:
    spec, m = result.spec, result.machine
    return (f"{result.config.name} · {m['device_name']} ({result.device.type}) · "
            f"{_dtype_name(result.dtype)} · batch {spec.batch} · prompt {spec.prompt_len} · "
            f"{spec.steps} steps ({spec.warmup} warmup, not timed) · cache {spec.seq_len} positions")


def table(result: RunResult) -> str:
    cuda = result.device.type == "cuda"
    rows = []
    for mode, gen in result.generations.items():
        s = gen.stats
        rows.append([mode, s.median, s.p10, s.p90, result.spec.batch * 1e3 / s.median,
                     gen.launches.ops, *([gen.launches.host_launches] if cuda else []),
                     gen.prepare.seconds or None,
                     gen.prepare.memory_bytes / MIB if gen.prepare.memory_bytes else None])
    headers = ["mode", "step ms (median)", "p10", "p90", "tokens/s",
               *(["kernels/step", "launches/step"] if cuda else ["aten ops/step"]),
               "capture/compile s", "graph MiB"]
    return tabulate(rows, headers=headers, floatfmt=".3f", missingval="-")


def summary_lines(result: RunResult) -> list[str]:
    """Speedup and equivalence, each against eager."""
    gens = result.generations
    lines = []
    eager = gens.get("eager")
    if eager is None:
        return lines
    for mode, gen in gens.items():
        if mode == "eager":
            continue
        lines.append(f"speedup {mode} vs eager: {eager.stats.median / gen.stats.median:.2f}x "
                     "(median step)")
    lines += [compare(eager, gen).describe() for mode, gen in gens.items() if mode != "eager"]
    lines += [f"note: {note}" for gen in gens.values() for note in gen.prepare.notes]
    return lines


def to_dict(result: RunResult) -> dict[str, Any]:
    """Every figure of the run, plus the prompt and generated ids so any run can be checked."""
    spec = result.spec
    modes = {}
    for mode, gen in result.generations.items():
        s = gen.stats
        modes[mode] = {
            "step_ms": {"median": s.median, "p10": s.p10, "p90": s.p90, "mean": s.mean, "n": s.n},
            "samples_ms": gen.step_ms,
            "tokens_per_s": spec.batch * 1e3 / s.median,
            "ops_per_step": gen.launches.ops,
            "host_launches_per_step": gen.launches.host_launches,
            "prepare_s": gen.prepare.seconds,
            "graph_memory_bytes": gen.prepare.memory_bytes,
            "generated_ids": gen.tokens.tolist(),
        }
        if mode != "eager" and "eager" in result.generations:
            eq = compare(result.generations["eager"], gen)
            modes[mode]["equivalence"] = {
                "identical": eq.identical, "first_divergence": eq.first_divergence,
                "max_abs_logit_diff": eq.max_abs_logit_diff, "compared_steps": eq.compared_steps}
    return {
        "model": result.config.name,
        "config": result.config.to_hf_dict(),
        "dtype": _dtype_name(result.dtype),
        "batch": spec.batch, "prompt_len": spec.prompt_len, "steps": spec.steps,
        "warmup": spec.warmup, "max_seq_len": spec.seq_len, "seed": spec.seed,
        "machine": result.machine,
        "prompt_ids": result.prompt.tolist(),
        "modes": modes,
    }
