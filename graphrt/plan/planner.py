"""`graphrt plan`: which batch sizes to capture, from measured steps and a server's traffic.

Read the traffic; measure every size up to the largest any list needs (a grid, the rest
interpolated); choose the exact optimum under the budget (graphrt.plan.optimize); set it against
the engines' defaults; capture it for real and time a sample of the traffic through it; print
the table and the exports, write the JSON and the frontier's PNG. `graphrt.cli` adds the command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from graphrt.backends.choices import default_buckets
from graphrt.engines.engine import EngineList, ServedOn
from graphrt.errors import GraphrtError
from graphrt.measure import hardware
from graphrt.model.config import ModelConfig
from graphrt.model.resolve import resolve
from graphrt.plan import check, fit, measure_sizes, spread, summary
from graphrt.plan.engine_lists import engine_lists, exports
from graphrt.plan.optimize import Budget, choose, evaluate
from graphrt.plan.traffic import Traffic, read_traffic
from graphrt.run.execute import load
from graphrt.run.machine import resolve_device, resolve_dtype, versions
from graphrt.run.spec import RunSpec
from graphrt.units import GIB, MIB, format_bytes

# 4: per-size rounds and outliers, each row's vs_chosen with its interval, the verdict
FORMAT = "graphrt-plan/4"
# per_size is the same in all (before 4 without rounds, whose figures' uncertainty is then unknown)
MEASUREMENTS_FROM = ("graphrt-plan/1", "graphrt-plan/2", "graphrt-plan/3", FORMAT)


def served_on(device: torch.device, device_memory_gib: float | None) -> tuple[ServedOn, str]:
    """The device the engines' lists are resolved for, and how the plan says so: the device
    planned on, or one of `device_memory_gib` (whose name and chip are then not known)."""
    if device_memory_gib is not None:
        return ServedOn(round(device_memory_gib * GIB), "", False), f"{device_memory_gib:g} GiB (--device-memory)"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (ServedOn(props.total_memory, props.name, props.major == 10),
                f"{format_bytes(props.total_memory, 'GiB')}, {props.name}")
    total = hardware.memory(device).total or 0
    return (ServedOn(total, "", False),
            f"{format_bytes(total, 'GiB')}, this machine's memory (--device-memory to plan for a GPU)")


def _lists(traffic: Traffic, resolved: list[EngineList], checks: tuple[tuple[int, ...], ...]) -> list[EngineList]:
    """Every list the plan is set against: the engines', graphrt's powers of two for the
    traffic's largest batch, and each --check."""
    return [*resolved, EngineList("powers of two", default_buckets(max(traffic)), True, None, {}),
            *(EngineList(f"--check {','.join(map(str, c))}", c, True, None, {}) for c in checks)]


def _covers(traffic: Traffic, lists: list[EngineList]) -> list[int]:
    """The traffic's largest batch, and the size each padded list runs it as: the sizes a
    comparison cannot do without (the largest of them is the largest size measured)."""
    largest = max(traffic)
    return [largest, *(next((s for s in listed.decode_sizes() if s >= largest), largest)
                       for listed in lists if listed.padding)]


def formed(traffic: Traffic, largest: int | None) -> Traffic:
    """The decode steps a server that forms no batch above `largest` (vLLM's max_num_seqs) runs
    the traffic as: a step of b > largest requests as b // largest steps of `largest` and one of
    the rest, the others waiting in its scheduler meanwhile; None: the traffic as it is."""
    if largest is None or max(traffic) <= largest:
        return traffic
    steps: dict[int, int] = {}
    for batch, count in traffic.items():
        full, rest = divmod(batch, largest) if batch > largest else (0, batch)
        for size, times in ((largest, full * count), (rest, count if rest else 0)):
            if times:
                steps[size] = steps.get(size, 0) + times
    return steps


def _baseline(figures: list[measure_sizes.SizeFigures], traffic: Traffic, listed: EngineList) -> summary.Row:
    """A list's row over the steps its server forms of the traffic (see `formed`), its mean
    step per step of the traffic so that rows compare; its eager share of the server's steps."""
    served = formed(traffic, listed.full_graphs_up_to)
    row = summary.baseline(summary.problem_for(figures, served), listed.name, listed.decode_sizes(),
                               max(served), listed.padding, len(listed.sizes) - len(listed.decode_sizes()))
    if served is traffic:
        return row
    steps, run = sum(traffic.values()), sum(served.values())
    plan = replace(row.plan, steps=steps, eager_steps=round(row.plan.eager_steps * steps / run))
    return replace(row, plan=plan)


def _engine_record(listed: EngineList, traffic: Traffic) -> dict[str, Any]:
    """An engine's list as the plan's JSON holds it, with a note where the plan charges some of
    the traffic's steps as it cannot run them: decode batches the server never forms (above
    vLLM's max_num_seqs), vLLM's piecewise graphs, which it does not measure, and speculative
    decoding, whose verify step it does not measure either."""
    record = {"name": listed.name, "sizes": list(listed.sizes), "padding": listed.padding,
              "full_graphs_up_to": listed.full_graphs_up_to, "assumed": listed.assumed,
              "decode_sizes": list(listed.decode_sizes()), "speculative": listed.speculative, "note": None}
    notes = []
    largest = listed.full_graphs_up_to
    above = sorted(b for b in traffic if largest is not None and b > largest)
    if above:
        runs = sum(sum(formed({b: traffic[b]}, largest).values()) for b in above)
        notes.append(f"its traffic's batches {above[0]}..{above[-1]} ({sum(traffic[b] for b in above)} steps) are above "
                     f"max_num_seqs {largest}, a decode batch it never forms: charged as the {runs} steps of at most "
                     f"{largest} its scheduler runs them as, the mean per traffic step")
    query = 1 + int(listed.assumed.get("speculative_config.num_speculative_tokens", 0))
    full = max(listed.decode_sizes(), default=0)
    piecewise = [b for b in formed(traffic, largest) if full < b and b * query <= listed.sizes[-1]]
    if piecewise and listed.assumed.get("cudagraph_mode") == "FULL_AND_PIECEWISE":
        notes.append(f"its decode batches {min(piecewise)}..{max(piecewise)} replay piecewise graphs "
                     "(FULL_AND_PIECEWISE), which plan does not measure: charged as eager steps, an upper bound")
    if listed.speculative:
        notes.append("under speculative decoding a decode step verifies draft tokens too; plan measures one-token "
                     "steps: this row's figures are for its batch sizes, not for that verify step")
    record["note"] = "; ".join(notes) or None
    return record


def _load_measurements(path: str, model: str, device: str, dtype: str) -> list[dict]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GraphrtError(f"--measurements {path}: cannot read a plan's JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") not in MEASUREMENTS_FROM:
        raise GraphrtError(f"--measurements {path}: not a `graphrt plan --json` result ({FORMAT})")
    theirs = (doc.get("model"), doc.get("device"), doc.get("dtype"))
    if theirs != (model, device, dtype):
        raise GraphrtError(f"--measurements {path}: measured {' · '.join(map(str, theirs))}, "
                           f"this plan is for {model} · {device} · {dtype}")
    return doc.get("per_size", [])


def _fits(spec: RunSpec, config: ModelConfig, grid: str, keep: list[int],
          tell: Callable[[str], None]) -> tuple[int, ...]:
    """The sizes to measure up to `spec.batch` (keeping `keep`: the traffic's largest batch, then
    the sizes lists run it as), listed only once the largest fits on its own; say what measuring
    them takes, and refuse it where the device has too little free."""
    device = resolve_device(spec.device)
    where = hardware.device_name(device) if device.type == "cuda" else "this machine"
    itemsize, free = resolve_dtype(spec.dtype, device).itemsize, hardware.memory(device).free
    fit.check_largest(config, spec.batch, keep[0], spec.prompt_len, spec.steps, itemsize, free, where)
    sizes = measure_sizes.grid(spec.batch, grid, keep)
    needed = fit.fit(config, sizes, spec.prompt_len, spec.steps, itemsize, free, where)
    tell(needed.describe())
    needed.check()
    return sizes


def make_plan(options: dict[str, Any], say: Callable[[int, int, str], None] = lambda *_: None,
              tell: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The plan document (see docs/plan.md). Before anything is loaded, `tell`
    hears what the measuring will take (and a measuring the device cannot hold is refused);
    `say(done, total, label)` hears of the measuring as it goes, from the first size on."""
    traffic = read_traffic(options["traffic"])
    config, _ = resolve(options["model"])
    if not config.lean:
        raise GraphrtError(f"--model {options['model']}: {config.name} runs on transformers' StaticCache, which "
                           "holds one batch size, and plan captures every size on one cache: it measures "
                           "graphrt's own step (the qwen2, qwen3 and llama families) only")
    device_facts, device_said = served_on(resolve_device(options["device"]), options["device_memory"])
    resolved = engine_lists(options["engine_setting"], device_facts, config.max_position_embeddings)
    lists = _lists(traffic, resolved, options["check"])
    top = max(_covers(traffic, lists))
    spec = RunSpec(model=options["model"], device=options["device"], dtype=options["dtype"], batch=top,
                   prompt_len=options["prompt_len"], steps=options["steps"], warmup=options["warmup"],
                   seed=options["seed"])
    if spec.seq_len > config.max_position_embeddings:  # before the memory check blames the batch for it
        raise GraphrtError(f"--prompt-len {spec.prompt_len:,} + --steps {spec.steps:,} = {spec.seq_len:,} "
                           f"positions exceed {config.name}'s max_position_embeddings {config.max_position_embeddings:,}")
    if not options["measurements"]:
        sizes = _fits(spec, config, options["grid"], _covers(traffic, lists), tell)
    config, model, device, dtype = load(spec)
    dtype_name = str(dtype).removeprefix("torch.")
    if options["measurements"]:
        measured = measure_sizes.from_records(
            _load_measurements(options["measurements"], config.name, device.type, dtype_name),
            options["measurements"])
    else:
        measured = measure_sizes.measure(model, sizes, spec.steps, spec.warmup, spec.prompt_len,
                                         spec.seed, options["rounds"], on_measure=say)
    figures = measure_sizes.interpolate(measured, top)
    problem = summary.problem_for(figures, traffic)
    budget = Budget(options["max_graphs"],
                    None if options["memory"] is None else round(options["memory"] * MIB),
                    None if options["capture_seconds"] is None else round(options["capture_seconds"] * 1e6))
    said = " ".join(f"--{name.replace('_', '-')} {options[name]:g}" for name in ("max_graphs", "memory", "capture_seconds")
                    if options[name] is not None)
    chosen, frontier = choose(problem, budget, said or None)
    rows = [summary.Row("chosen", chosen),
            *(_baseline(figures, traffic, listed) for listed in lists),
            summary.Row("all eager", evaluate(problem, ()))]
    compared, verdict = spread.compare(problem, measured, chosen.sizes,
                                            [(r.plan.sizes, r.padding) for r in rows[1:]])
    doc: dict[str, Any] = {
        "format": FORMAT, "model": config.name, "device": device.type, "dtype": dtype_name,
        "machine": hardware.describe(device), "versions": versions(),
        "graphs": "cuda" if device.type == "cuda" else "tape",
        "timing": {"steps": spec.steps, "warmup": spec.warmup, "prompt_len": spec.prompt_len,
                   "rounds": options["rounds"]},
        "traffic": {str(b): n for b, n in traffic.items()},
        "budget": {"max_graphs": options["max_graphs"], "memory_mib": options["memory"],
                   "capture_seconds": options["capture_seconds"]},
        "served_on": {"memory_bytes": device_facts.memory, "name": device_facts.name,
                      "blackwell": device_facts.blackwell, "said": device_said},
        "engines": [_engine_record(listed, traffic) for listed in resolved],
        "per_size": measure_sizes.to_records(figures),
        "chosen": summary.row_dict(rows[0]),
        "baselines": [{**summary.row_dict(r), "vs_chosen": vs.as_dict()} for r, vs in zip(rows[1:], compared)],
        "verdict": verdict.as_dict(),
        "frontier": summary.frontier_dicts(frontier),
        "export": exports(chosen.sizes),
        "check": None,
    }
    if options["verify"]:
        model.setup_cache(top, spec.prompt_len + spec.steps)
        doc["check"] = check.check(model, figures, chosen.sizes, chosen.memory_bytes, traffic,
                                        options["verify_steps"], spec.prompt_len, spec.seed).as_dict()
    return doc
