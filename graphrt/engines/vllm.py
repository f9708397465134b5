"""vLLM: the step markers it writes, how `vllm serve` resolves its capture sizes (0.30.0, the
sdist on PyPI), and the option that takes a plan's list.

Markers: V1's `Worker.annotate_profile` (vllm/v1/worker/gpu_worker.py), a `record_function`
under torch.profiler, an NVTX range under the CUDA profiler: `execute_new_2_cached_30` (0.12,
0.13: new and running requests; running ones may be decoding or still prefilling in chunks, so
only an all-new step has a phase); `execute_context_2(14721)_generation_30(30)` (0.14 on: context
requests and their tokens, generation requests and theirs); with `detailed_trace_annotation`
(0.26 on) `execute_14751_context_2(sq14721sk…sqsq…sqsk…)_generation_30(sq30sk…sqsq…sqsk…)`.
Recorded with stack, its model runner's `execute_model` is a python function inside it
(`vllm/v1/worker/gpu_model_runner.py(3380): execute_model`): a step where no annotation is.
"""

from __future__ import annotations

import json
import re

from graphrt.engines.engine import COUNT, Engine, EngineList, Kind, ServedOn, Value
from graphrt.engines.step_marker import ANNOTATION, RUNNER_FUNCTION, Marker, count, phase_of
from graphrt.errors import GraphrtError
from graphrt.units import GIB
from graphrt.vocab import Phase

NAME = "vLLM"
LISTED = "vLLM (0.30.0)"  # the version its capture-list rules were read at
SETTINGS = {"max_num_seqs": COUNT, "max_num_batched_tokens": COUNT, "max_model_len": COUNT,
            "performance_mode": Kind("choice", ("balanced", "interactivity", "throughput")),
            "cudagraph_mode": Kind("choice", ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")),
            "speculative_config.num_speculative_tokens": COUNT}

# -- its step markers ----------------------------------------------------------------------------

# digits are ASCII only (re.ASCII): `\d` would take other scripts' digits too, which no engine writes
_NEW_CACHED = re.compile(r"execute_new_(\d+)_cached_(\d+)", re.ASCII)
_CONTEXT_GENERATION = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)", re.ASCII)
_DETAILED = re.compile(r"execute_(\d+)_context_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)"
                       r"_generation_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)", re.ASCII)
_RUNNER_FUNCTION = re.compile(r".*model_runner\.py\(\d+\): execute_model")


def is_runner_function(name: str) -> bool:
    """A python function (torch.profiler with stack) that is the model runner's step:
    `…/gpu_model_runner.py(N): execute_model`."""
    return name.endswith(": execute_model") and _RUNNER_FUNCTION.fullmatch(name) is not None


def read_marker(name: str) -> Marker | None:
    """The marker `name` is in one of vLLM's forms, or None."""
    if m := _CONTEXT_GENERATION.fullmatch(name):
        c, ct, g, gt = map(count, ("context", "context tokens", "generation", "generation tokens"), m.groups())
        return Marker(NAME, "vLLM execute_context_…_generation_…", ANNOTATION, phase_of(c, g), c + g, ct + gt)
    if m := _DETAILED.fullmatch(name):
        total, c, _, g, _ = map(count, ("tokens", "context", "sq", "generation", "sq"), m.groups())
        return Marker(NAME, "vLLM execute_N_context_…_generation_…", ANNOTATION, phase_of(c, g), c + g, total)
    if m := _NEW_CACHED.fullmatch(name):
        new, cached = map(count, ("new", "cached"), m.groups())
        phase = Phase.PREFILL if new and not cached else Phase.IDLE if not new and not cached else Phase.UNKNOWN
        return Marker(NAME, "vLLM execute_new_…_cached_…", ANNOTATION, phase, new + cached)
    if is_runner_function(name):
        return Marker(NAME, "vLLM model runner execute_model (python function)", RUNNER_FUNCTION)
    return None


# -- its capture list ----------------------------------------------------------------------------

def batch_defaults(device_memory: int, device_name: str) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `vllm serve` left unset: vllm/engine/arg_utils.py,
    EngineArgs.get_batch_defaults, the OPENAI_API_SERVER usage context on a GPU."""
    if device_memory >= 160 * GIB:  # B200, B300
        return 16384, 1024
    if device_memory >= 70 * GIB and "a100" not in device_name.lower():  # H100, H200
        return 8192, 1024
    return 2048, 256


def _grid(top: int, interactivity: bool) -> set[int]:
    """[1, 2, 4] (1..32 in the interactivity performance mode) + range(8, 256, 8) +
    range(256, top + 1, 16), cut at `top`."""
    sizes = set(range(1, min(top, 32) + 1)) if interactivity else {s for s in (1, 2, 4) if s <= top}
    if top >= 8:
        sizes.update(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes.update(range(256, top + 1, 16))
    return sizes


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False,
                  interactivity: bool = False, query_len: int = 1) -> tuple[int, ...]:
    """vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, cudagraph_capture_sizes unset; sizes
    count tokens, `query_len` a decode request (1 + num_speculative_tokens,
    VllmConfig.uniform_decode_query_len). The largest size is min(2 * max_num_seqs * query_len,
    512; 1024 on data-center Blackwell), at most max_num_batched_tokens; the grid of _grid up
    to it, and max_num_batched_tokens itself where it is at most the largest. With speculative
    decoding (query_len > 1) the decode sizes are added: query_len times each request count of the
    same grid up to max_num_seqs (at most 512 or 1024, max_num_seqs itself included) that fits
    under the uncut largest size and max_num_batched_tokens."""
    ceiling = 1024 if blackwell else 512
    uncut = min(max_num_seqs * query_len * 2, ceiling)
    top = min(uncut, max_num_batched_tokens)
    sizes = _grid(top, interactivity)
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    if query_len > 1:
        requests = min(max_num_seqs, ceiling)
        counts = _grid(requests, False) | {requests}
        sizes.update(n * query_len for n in counts if n * query_len <= min(uncut, max_num_batched_tokens))
    return tuple(sorted(sizes))


def decode_requests(sizes: tuple[int, ...], max_num_seqs: int, query_len: int = 1) -> tuple[int, ...]:
    """The request counts a uniform decode batch replays a full graph at: model runner V2's
    CudaGraphManager._init_candidates (vllm/v1/worker/gpu/cudagraph_utils.py, the default
    runner) rounds each size up to a multiple of query_len and keeps it where it is at most
    max_num_seqs * query_len and the largest size. A batch pads to the next of them; above the
    largest it runs piecewise graphs (FULL_AND_PIECEWISE) or eagerly."""
    kept = {-(-size // query_len) for size in sizes
            if -(-size // query_len) * query_len <= min(max_num_seqs * query_len, sizes[-1])}
    return tuple(sorted(kept))


def capture_list(given: dict[str, Value], device: ServedOn, max_model_len: int) -> EngineList:
    """vLLM 0.30.0's `vllm serve` (vllm/engine/arg_utils.py,
    _set_default_max_num_seqs_and_batched_tokens_args, with chunked prefill on, its default):
    unset limits take the device's defaults, doubled in the throughput performance mode; an unset
    max_num_batched_tokens is at most max_num_seqs * max_model_len, an unset max_num_seqs at most
    max_num_batched_tokens; max_num_batched_tokens below max_num_seqs is refused
    (vllm/config/scheduler.py, SchedulerConfig.__post_init__). Under speculative decoding a decode
    request is 1 + num_speculative_tokens tokens and the sizes count tokens (capture_sizes).
    In FULL_AND_PIECEWISE (the default cudagraph_mode) and FULL_DECODE_ONLY a decode batch, never
    above max_num_seqs, replays a full graph at the sizes decode_requests gives."""
    tokens, seqs = batch_defaults(device.memory, device.name)
    mode = given.get("performance_mode", "balanced")
    doubled = 2 if mode == "throughput" else 1
    tokens = given.get("max_num_batched_tokens", tokens * doubled)
    seqs = given.get("max_num_seqs", seqs * doubled)
    max_model_len = given.get("max_model_len", max_model_len)
    if "max_num_batched_tokens" not in given:
        tokens = min(seqs * max_model_len, tokens)
    if "max_num_seqs" not in given:
        seqs = min(seqs, tokens)
    if tokens < seqs:
        raise GraphrtError(f"--engine-setting: vLLM refuses max_num_batched_tokens {tokens} below max_num_seqs "
                           f"{seqs} ({_given_or_default(given, 'max_num_batched_tokens')}, "
                           f"{_given_or_default(given, 'max_num_seqs')}); expected vllm.max_num_batched_tokens "
                           f"of at least {seqs}")
    drafts = given.get("speculative_config.num_speculative_tokens", 0)
    sizes = capture_sizes(seqs, tokens, device.blackwell, mode == "interactivity", 1 + drafts)
    assumed = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "max_model_len": max_model_len,
               "performance_mode": mode, "cudagraph_mode": given.get("cudagraph_mode", "FULL_AND_PIECEWISE")}
    if drafts:
        assumed["speculative_config.num_speculative_tokens"] = drafts
    return EngineList(LISTED, sizes, True, seqs, assumed, decode_requests(sizes, seqs, 1 + drafts), bool(drafts))


def _given_or_default(given: dict[str, Value], name: str) -> str:
    return f"{name} given" if name in given else f"{name} by default"


def export(sizes: tuple[int, ...]) -> dict:
    """`sizes` as CompilationConfig.cudagraph_capture_sizes (`--compilation-config`, `-cc`)."""
    config = {"cudagraph_capture_sizes": list(sizes)}
    return {"compilation_config": config, "cli": f"--compilation-config '{json.dumps(config)}'"}


ENGINE = Engine(NAME, read_marker, re.compile(r"execute_(new_|context_|[0-9]+_context_)"),
                "vLLM's execute_context_N(T)_generation_N(T), execute_T_context_… or execute_new_N_cached_N",
                runner_function=is_runner_function, key="vllm", settings=SETTINGS,
                resolve=lambda given, device, max_model_len: [capture_list(given, device, max_model_len)],
                export=export)
