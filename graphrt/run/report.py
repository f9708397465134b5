"""Tables and JSON for a run."""

from __future__ import annotations

from typing import Any

import torch
from tabulate import tabulate

from graphrt.measure import hardware
from graphrt.measure.collective_share import OF, measure_on
from graphrt.measure.roofline import step_cost
from graphrt.model.config import FAMILIES, ModelConfig
from graphrt.run import rank_figures
from graphrt.run.decode import Generation
from graphrt.run.equivalence import compare
from graphrt.run.execute import RunResult
from graphrt.units import MIB, MISSING


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def header(result: RunResult) -> str:
    spec, m = result.spec, result.machine
    experts = f" · experts {result.experts}" if result.experts else ""
    return (f"{result.config.name}{_forward(result.config)}{experts} · {m['device_name']} ({result.device.type}) · "
            f"{_dtype_name(result.dtype)} · batch {spec.batch} · prompt {spec.prompt_len} · "
            f"{spec.steps} steps ({spec.warmup} warmup, not timed) · cache {spec.seq_len} positions"
            + (f"\nrank 0's own figures, of {result.ranks.world} tensor-parallel ranks (all ranks below)"
               if result.ranks else ""))


def _forward(config: ModelConfig) -> str:
    """Whose forward runs, where it is not graphrt's own step."""
    if config.lean:
        return ""
    names = (config.hf_config or {}).get("architectures") or [config.family.architecture]
    return f" · transformers' {names[0]}"


_TIMING_HEADERS = ("mode", "step ms (median)", "p10", "p90", "tokens/s", "GB/s", "% peak",
                   "capture/compile s", "lint s", "graph MiB")
# fixed widths, so that each row can be printed the moment its mode has run
_WIDTHS = (10, *(max(len(h), 9) for h in _TIMING_HEADERS[1:]))


def _cell(value: float | None, width: int) -> str:
    return (MISSING if value is None else f"{value:.3f}").rjust(width)


def bandwidth(result: RunResult, gen: Generation) -> tuple[float | None, float | None]:
    """Bytes a step must move (weights, the whole static KV cache, the new K/V; bench.roofline)
    over the median step: bytes/s, and its share of the device's datasheet bandwidth where known.
    None under tensor parallelism: a rank moves its share, and the roofline counts the model's."""
    if result.ranks is not None and result.ranks.world > 1:
        return None, None
    if result.config.model_type not in FAMILIES:  # the roofline knows the lean families' shapes only
        return None, None
    spec = result.spec
    cost = step_cost(result.config, spec.batch, spec.seq_len, result.dtype.itemsize)
    achieved = cost.bytes / (gen.stats.median / 1e3)
    peak = hardware.peak_for(result.machine["device_name"]) if result.device.type == "cuda" else None
    return achieved, None if peak is None else achieved / peak.bandwidth


def timing_header() -> str:
    """The head of the timing table, whose rows `timing_row` prints one mode at a time."""
    mode, *rest = _TIMING_HEADERS
    head = "  ".join([mode.ljust(_WIDTHS[0]), *(h.rjust(w) for h, w in zip(rest, _WIDTHS[1:]))])
    return head + "\n" + "  ".join("-" * w for w in _WIDTHS)


def timing_row(result: RunResult, mode: str) -> str:
    """One mode's row, printable as soon as that mode has run."""
    gen = result.generations[mode]
    s, prep = gen.stats, gen.prepare
    achieved, share = bandwidth(result, gen)
    values = [s.median, s.p10, s.p90, result.spec.batch * 1e3 / s.median,
              None if achieved is None else achieved / 1e9,
              None if share is None else 100 * share, prep.seconds or None, prep.lint_seconds,
              prep.memory_bytes / MIB if prep.memory_bytes else None]
    return "  ".join([mode.ljust(_WIDTHS[0]), *(_cell(v, w) for v, w in zip(values, _WIDTHS[1:]))])


def launches_table(result: RunResult) -> str:
    """What one step of each mode launches, counted after every mode was timed."""
    cuda = result.device.type == "cuda"
    headers = ["mode", *(["kernels/step", "graph launches/step", "kernel launches/step", "copies/step"]
                         if cuda else ["aten ops/step"])]
    counts = {mode: gen.launches for mode, gen in result.generations.items()}
    if result.reference_launches is not None:  # HF's step on the same config, for scale
        counts["hf eager"] = result.reference_launches
    rows = [[mode, counted and counted.ops,
             *([counted and counted.graph_launches, counted and counted.kernel_launches,
                counted and counted.copies] if cuda else [])]
            for mode, counted in counts.items()]
    table = tabulate(rows, headers=headers, missingval=MISSING)
    if result.reference_note is not None:
        table += f"\n(no hf eager row: {result.reference_note})"
    return table


def ranks_table(result: RunResult) -> str:
    """A tensor-parallel run, per mode: the slowest rank's step, how far apart the ranks are, and
    per rank the share of a profiled step in collectives and what it launches per step."""
    rows = []
    for mode, ranks in result.per_rank.items():
        s = rank_figures.slowest(ranks)
        rows.append([mode, s.median, s.p10, s.p90, rank_figures.spread_ms(ranks),
                     " / ".join(MISSING if r.collective_share is None else f"{100 * r.collective_share:.1f}"
                                for r in ranks),
                     " / ".join(MISSING if r.ops is None else str(r.ops) for r in ranks)])
    what = "kernels" if result.device.type == "cuda" else "aten ops"
    headers = ["mode", "step ms (slowest rank)", "p10", "p90", "rank spread ms", "collective % per rank",
               f"{what}/step per rank"]
    table = tabulate(rows, headers=headers, floatfmt=".3f", missingval=MISSING, disable_numparse=[5, 6])
    return f"{table}\ncollective %: {OF[measure_on(result.device.type)]}, in one more step of each mode"


def ranks_lines(result: RunResult) -> list[str]:
    """Whether every rank generated the same tokens in every mode."""
    lines = []
    for mode, ranks in result.per_rank.items():
        differ = [r.rank for r in ranks if r.tokens != ranks[0].tokens]
        lines.append(f"{mode}: ranks' tokens identical" if not differ else
                     f"{mode}: rank(s) {', '.join(map(str, differ))} generated other tokens than rank 0")
    return lines


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
    for mode, gen in gens.items():
        if mode != "eager":
            lines.append(compare(eager, gen, result.dtype).describe())
            if mode in result.localizations:
                lines.append(f"  {result.localizations[mode].describe()}")
    said: dict[str, list[str]] = {}  # a note, and the modes that give it
    for mode, gen in gens.items():
        for note in gen.prepare.notes:
            said.setdefault(note, []).append(mode)
    lines += [f"note: {' and '.join(modes)}: {note}" for note, modes in said.items()]
    return lines


def refused_lines(result: RunResult) -> list[str]:
    """The modes that could not capture the step, each with why."""
    return [f"{mode}: not run: {why}" for mode, why in result.refused.items()]


def to_dict(result: RunResult) -> dict[str, Any]:
    """Every figure of the run, plus the prompt and generated ids so any run can be checked."""
    spec = result.spec
    modes = {}
    for mode, gen in result.generations.items():
        s = gen.stats
        achieved, share = bandwidth(result, gen)
        modes[mode] = {
            "step_ms": {"median": s.median, "p10": s.p10, "p90": s.p90, "mean": s.mean, "n": s.n},
            "samples_ms": gen.step_ms,
            "tokens_per_s": spec.batch * 1e3 / s.median,
            "achieved_bandwidth": achieved,  # bytes/s
            "bandwidth_share_of_peak": share,  # None where the device has no datasheet peak
            "ops_per_step": gen.launches and gen.launches.ops,
            "host_launches_per_step": gen.launches and gen.launches.host_launches,
            "graph_launches_per_step": gen.launches and gen.launches.graph_launches,
            "kernel_launches_per_step": gen.launches and gen.launches.kernel_launches,
            # cudaMemcpy*/cudaMemset* calls: a graph step's copy-in is work no launch count shows
            "copies_per_step": gen.launches and gen.launches.copies,
            "counted_in_profiler_session": gen.launches and gen.launches.profiler_session,
            "prepare_s": gen.prepare.seconds,
            "lint_s": gen.prepare.lint_seconds,
            "capture_setup_s": gen.prepare.capture_setup_seconds,
            "graph_memory_bytes": gen.prepare.memory_bytes,
            "graph_memory_per_bucket": {str(bs): m for bs, m in gen.prepare.buckets.items()},
            "generated_ids": gen.tokens.tolist(),
        }
        if mode != "eager" and "eager" in result.generations:
            eq = compare(result.generations["eager"], gen, result.dtype)
            modes[mode]["equivalence"] = {
                "identical": eq.identical, "first_divergence": eq.first_divergence,
                "max_abs_logit_diff": eq.max_abs_logit_diff, "compared_steps": eq.compared_steps,
                "differs": eq.differs, "first_differing_step": eq.first_step}
            if mode in result.localizations:
                modes[mode]["localization"] = result.localizations[mode].as_dict()
    ranks = {mode: [{"rank": r.rank, "samples_ms": list(r.step_ms), "ops_per_step": r.ops,
                     "collective_share": r.collective_share,
                     "collective_share_of": OF[r.collective_share_of], "generated_ids": [list(t) for t in r.tokens]}
                    for r in per_rank]
             for mode, per_rank in result.per_rank.items()}
    return {
        "model": result.config.name,
        "tp": result.ranks.world if result.ranks else 1,
        "ranks": ranks,  # every rank's figures, per mode (tensor-parallel runs)
        "config": result.config.to_hf_dict(),
        "dtype": _dtype_name(result.dtype),
        "batch": spec.batch, "prompt_len": spec.prompt_len, "steps": spec.steps,
        "warmup": spec.warmup, "max_seq_len": spec.seq_len, "seed": spec.seed,
        "machine": result.machine,
        # the rows as given (a padded batch holds pad ids after the shorter ones)
        "prompt_ids": [list(row) for row in spec.prompt_ids] or result.prompt.tolist(),
        "modes": modes,
        "refused": dict(result.refused),  # mode -> why it did not run (its capture refused the step, ...)
        "implementation": "graphrt" if result.config.lean else "transformers",
        "experts": result.experts,  # transformers' experts implementation; None without experts
        # HF transformers' eager step on the same config and weights (None without transformers)
        "hf_ops_per_step": result.reference_launches and result.reference_launches.ops,
    }
