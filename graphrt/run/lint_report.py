"""What `graphrt lint` prints and writes of a model's lint (graphrt.run.model_lint): the
findings of the step `run` would capture by module, the experts table, the verdict; the --json
document. Torch-free: the types are only named."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabulate import tabulate

from graphrt.units import MISSING

if TYPE_CHECKING:
    from graphrt.graphs.findings import Finding
    from graphrt.run.model_lint import ModelLint, StepCheck


def _forward(result: ModelLint) -> str:
    return "graphrt's lean step" if result.config.lean else "transformers' forward"


def report_lines(result: ModelLint) -> list[str]:
    """The header, the findings of the step `run` would capture by module, the experts table."""
    chosen, unit = result.chosen, _unit(result)
    experts = f" · experts {chosen.experts}" if chosen.experts else ""
    lines = [f"{result.config.name} · {_forward(result)} ({result.architecture}) · {result.device.type} · "
             f"{str(result.dtype).removeprefix('torch.')} · batch {result.batch}{experts}"]
    count = len(chosen.findings)
    lines.append(f"lint: {count or 'no'} finding{'s' * (count != 1)}"
                 + (f"; {chosen.ops_per_step} {unit} per step" if chosen.ops_per_step is not None else ""))
    lines += _by_module(chosen.findings)
    if result.experts is not None:
        lines += ["", *_experts_table(result, unit)]
    lines.append(_verdict(chosen))
    return lines


def _unit(result: ModelLint) -> str:
    return "kernels" if result.device.type == "cuda" else "ops"


def _by_module(findings: tuple[Finding, ...]) -> list[str]:
    """Findings under the module they ran in (its path and class), modules in order of first finding."""
    modules: dict[str, list[Finding]] = {}
    for finding in findings:
        modules.setdefault(finding.module, []).append(finding)
    return [line for module, found in modules.items()
            for line in (module, *(f"  {f.op + ': ' if f.op else ''}{f.message}" for f in found))]


def _experts_table(result: ModelLint, unit: str) -> list[str]:
    """Each implementation: whether a graph captures the step, what it launches, the lint's
    count; then why each one a graph cannot capture is refused (its first finding)."""
    rows, why = [], []
    for check in result.experts:
        name = check.experts + (" (default)" if check.experts == result.default_experts else "")
        ran = check.unavailable is None
        rows.append((name, ("yes" if check.captured else "no") if ran else MISSING,
                     MISSING if check.ops_per_step is None else check.ops_per_step,
                     len(check.findings) if ran else MISSING))
        if not check.captured:
            why.append(f"{check.experts}: {check.unavailable or check.refused or _first(check.findings)}")
    table = tabulate(rows, headers=("experts", "graph captures", f"{unit} per step", "lint findings"),
                     tablefmt="simple", disable_numparse=True)
    graph = "a CUDA graph" if unit == "kernels" else "a TapeGraph"
    return [f"experts implementations (graph captures: the lint is clean and {graph} took the step):",
            *table.splitlines(), *why]


def _first(findings: tuple[Finding, ...]) -> str:
    more = len(findings) - 1
    return f"{findings[0]}" + (f" (and {more} more finding{'s' * (more > 1)})" if more else "")


def _verdict(chosen: StepCheck) -> str:
    """One line for the step `run` would capture; its exit status follows it."""
    if chosen.captured:
        return ("verdict: clean: the lint finds nothing a graph would replay differently from eager, and "
                "a graph captures the step (graphrt run --mode eager,graph compares their tokens)")
    if chosen.findings:
        count = len(chosen.findings)
        return (f"verdict: a graph would replay the step differently from eager ({count} finding"
                f"{'s' * (count != 1)}): graphrt run refuses graph and piecewise for it")
    return f"verdict: no graph takes the step: {chosen.unavailable or chosen.refused}"


def _finding_dict(finding: Finding) -> dict:
    return {"kind": finding.kind, "module": finding.module, "op": finding.op, "text": str(finding)}


def _check_dict(check: StepCheck, default: str | None) -> dict:
    return {"implementation": check.experts, "default": check.experts == default,
            "captures": check.captured, "ops_per_step": check.ops_per_step,
            "findings": [_finding_dict(f) for f in check.findings],
            "refused": check.unavailable or check.refused}


def to_dict(model: str, result: ModelLint) -> dict:
    """The --json document: the step `run` would capture, and each experts implementation."""
    chosen = result.chosen
    return {
        "model": model, "implementation": "graphrt" if result.config.lean else "transformers",
        "architecture": result.architecture, "device": result.device.type,
        "dtype": str(result.dtype).removeprefix("torch."), "batch": result.batch,
        "experts_implementation": chosen.experts, "ops_per_step": chosen.ops_per_step, "ops_unit": _unit(result),
        "findings": [_finding_dict(f) for f in chosen.findings], "clean": not chosen.findings,
        "captures": chosen.captured,
        "experts": None if result.experts is None else [_check_dict(c, result.default_experts)
                                                        for c in result.experts],
    }
