"""SGLang: the step markers it writes, how its server resolves its decode capture sizes (0.5.23,
the PyPI wheel), and the option that takes a plan's list.

Markers: `build_step_span_name` (0.5.11 on; model_runner.py, then utils/profile_utils.py):
`step[EXTEND bs=2 toks=14721]`, `step[DECODE bs=64]`, `step[MIXED bs=2]`, `step[IDLE bs=0]`,
`step[TARGET_VERIFY bs=8]`, any ForwardMode by name; 0.5.19 on may append aggregates
(`c=1 g=1 c_sq=… g_sq=…`, `forward_id=…`); 0.5.20 on names the target's verify step `VERIFY`
and every draft runner's step `DRAFT`; a frozen-KV draft loop writes
`step[DRAFT_LOOP raw_bs=3 bs=4 topk=1]` (3 real rows in a graph of 4).
"""

from __future__ import annotations

import re

from graphrt.engines.engine import COUNT, FLAG, Engine, EngineList, Kind, ServedOn, Value
from graphrt.engines.step_marker import ANNOTATION, FIELDS, Marker, count, phase_of
from graphrt.units import MIB
from graphrt.vocab import Phase

NAME = "SGLang"
LISTED = "SGLang (0.5.23)"  # the version its capture-list rules were read at
# 0.5.23's built-in --speculative-algorithm values (sglang/srt/arg_groups/fields/spec.py)
SPECULATIVE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
SETTINGS = {"max_running_requests": COUNT, "cuda_graph_max_bs_decode": COUNT,
            "disable_cuda_graph_padding": FLAG, "tp_size": COUNT,
            "speculative_algorithm": Kind("choice", SPECULATIVE)}

# -- its step markers ----------------------------------------------------------------------------

_STEP = re.compile(r"step\[([A-Z][A-Z_0-9]*)((?: [a-z_]+=\d+)*)\]", re.ASCII)
# ForwardMode (and its stage names) by the phase they are
_PHASES = {"EXTEND": Phase.PREFILL, "SPLIT_PREFILL": Phase.PREFILL, "DECODE": Phase.DECODE, "MIXED": Phase.MIXED,
           "IDLE": Phase.IDLE, "TARGET_VERIFY": Phase.VERIFY, "VERIFY": Phase.VERIFY, "DRAFT": Phase.DRAFT,
           "DRAFT_EXTEND": Phase.DRAFT, "DRAFT_EXTEND_V2": Phase.DRAFT, "DRAFT_LOOP": Phase.DRAFT}


def read_marker(name: str) -> Marker | None:
    """The marker `name` is in SGLang's form, or None."""
    if not (m := _STEP.fullmatch(name)):
        return None
    stage, rest = m.groups()
    given = dict(FIELDS.findall(rest))  # others (c_sqsq=…) may pass any bound: only these are counts
    f = {k: count(k, v) for k, v in given.items() if k in ("bs", "raw_bs", "toks", "c", "g", "c_sq", "g_sq")}
    form = "SGLang step[...]"
    if stage == "DRAFT_LOOP":  # raw_bs real rows in a graph of bs
        return Marker(NAME, form, ANNOTATION, Phase.DRAFT, f.get("raw_bs"), padded_to=f.get("bs"))
    phase = _PHASES.get(stage, Phase.UNKNOWN)
    if stage == "MIXED" and "c" in f and "g" in f:
        phase = phase_of(f["c"], f["g"])
    sums = [f[k] for k in ("c_sq", "g_sq") if k in f]
    tokens = f.get("toks") if "toks" in f else sum(sums) if sums else None
    return Marker(NAME, form, ANNOTATION, phase, f.get("bs"), tokens)


# -- its capture list ----------------------------------------------------------------------------

def decode_max_bs(device_memory: int, tp_size: int = 1) -> int:
    """cuda_graph_config[decode].max_bs left unset: sglang/srt/arg_groups/memory_hook.py,
    handle_gpu_memory_settings, by the device's memory in MiB (nvidia-smi's memory.total)."""
    mib, small_tp = device_memory / MIB, tp_size < 4
    if mib < 20 * 1024:  # T4, 4080
        return 8
    if mib < 35 * 1024:  # A10, 4090, 5090
        return 48 if small_tp else 160
    if mib < 60 * 1024:  # A100 40GB, L40
        return 32 if small_tp else 160
    if mib < 160 * 1024:  # H100, A100 80GB; H20, H200
        return 256 if small_tp else 512
    return 512  # B200, MI300


def capture_sizes(max_bs: int, padding: bool = True, speculative: bool = False) -> tuple[int, ...]:
    """sglang/srt/arg_groups/cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes: every
    size 1..max_bs with padding disabled; else [1, 2, 4, 8, 12] + range(16, 257, 8) +
    range(272, 512, 16) + range(512, max_bs + 1, 32); with a --speculative-algorithm, its own
    list, less padding at small sizes: 1..8 + range(10, 33, 2) + range(40, 65, 4) +
    range(72, 257, 8) + range(272, max_bs + 1, 16). Cut at max_bs, max_bs itself appended."""
    if not padding:
        return tuple(range(1, max_bs + 1))
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    return tuple(sizes if max_bs in sizes else [*sizes, max_bs])


def pool_clamp(sizes: tuple[int, ...], pool: int) -> tuple[int, ...]:
    """sglang/srt/model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture:
    at start-up the decode runner keeps the sizes its request pool holds (req_to_token_pool.size,
    --max-running-requests where given, kv_cache_configurator.resolve_max_num_reqs), adding the
    pool's size where the list went past it."""
    if sizes[-1] <= pool:
        return sizes
    return (*(s for s in sizes if s < pool), pool)


def capture_list(given: dict[str, Value], device: ServedOn) -> EngineList:
    """SGLang 0.5.23's server (memory_hook.handle_gpu_memory_settings): the decode max batch from
    --cuda-graph-max-bs-decode, else the device's memory tier, cut to --max-running-requests
    where that is smaller; with a --speculative-algorithm, its own list. At start-up its runner
    cuts the list to its request pool (pool_clamp): --max-running-requests where
    given, else 48 under every built-in speculative algorithm but UNO (speculative_hook,
    _handle_eagle_family and its siblings), else sized from the KV cache (at least 2048 requests
    unless the cache holds under 4096 tokens; not known here, so not cut)."""
    tp_size = given.get("tp_size", 1)
    algorithm = given.get("speculative_algorithm")
    max_bs = given.get("cuda_graph_max_bs_decode")
    if max_bs is None:
        max_bs = decode_max_bs(device.memory, tp_size)
        if "max_running_requests" in given:
            max_bs = min(max_bs, given["max_running_requests"])
    padding = not given.get("disable_cuda_graph_padding", False)
    assumed: dict[str, Value] = {"tp_size": tp_size, "cuda_graph_max_bs_decode": max_bs,
                                 "disable_cuda_graph_padding": not padding}
    pool = given.get("max_running_requests", 48 if algorithm not in (None, "UNO") else None)
    if algorithm is not None:
        assumed["speculative_algorithm"] = algorithm
    if pool is not None:
        assumed["max_running_requests"] = pool
    sizes = capture_sizes(max_bs, padding, algorithm is not None)
    if pool is not None:
        sizes = pool_clamp(sizes, pool)
    return EngineList(LISTED, sizes, True, None, assumed, speculative=algorithm is not None)


def export(sizes: tuple[int, ...]) -> dict:
    """`sizes` as cuda_graph_bs_decode (`--cuda-graph-bs-decode`, nargs="+", in 0.5.23; earlier
    0.5 releases took `--cuda-graph-bs`)."""
    return {"cuda_graph_bs_decode": list(sizes), "cli": "--cuda-graph-bs-decode " + " ".join(map(str, sizes))}


ENGINE = Engine(NAME, read_marker, re.compile(r"step\["), "SGLang's step[MODE bs=N key=N …]",
                key="sglang", settings=SETTINGS, resolve=lambda given, device, _: [capture_list(given, device)],
                export=export)
