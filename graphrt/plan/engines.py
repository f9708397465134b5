"""What serving engines capture, by their own rules, and the chosen sizes in each engine's option.

Each rule follows the engine's source at the version its comment names, speculative decoding
included (a decode request of several tokens). The rules take the numbers the engine's server has resolved;
graphrt.plan.engine_lists resolves them from what a user passes and the device served on.
"""

from __future__ import annotations

import json
import math

GIB = 1 << 30

# -- vLLM 0.30.0 (the sdist on PyPI) ---------------------------------------------------------------

VLLM = "vLLM (0.30.0)"


def vllm_batch_defaults(device_memory: int, device_name: str) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `vllm serve` left unset: vllm/engine/arg_utils.py,
    EngineArgs.get_batch_defaults, the OPENAI_API_SERVER usage context on a GPU."""
    if device_memory >= 160 * GIB:  # B200, B300
        return 16384, 1024
    if device_memory >= 70 * GIB and "a100" not in device_name.lower():  # H100, H200
        return 8192, 1024
    return 2048, 256


def _vllm_grid(top: int, interactivity: bool) -> set[int]:
    """[1, 2, 4] (1..32 in the interactivity performance mode) + range(8, 256, 8) +
    range(256, top + 1, 16), cut at `top`."""
    sizes = set(range(1, min(top, 32) + 1)) if interactivity else {s for s in (1, 2, 4) if s <= top}
    if top >= 8:
        sizes.update(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes.update(range(256, top + 1, 16))
    return sizes


def vllm_sizes(max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False,
               interactivity: bool = False, query_len: int = 1) -> tuple[int, ...]:
    """vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, cudagraph_capture_sizes unset; sizes
    count tokens, `query_len` a decode request (1 + num_speculative_tokens,
    VllmConfig.uniform_decode_query_len). The largest size is min(2 * max_num_seqs * query_len,
    512; 1024 on data-center Blackwell), at most max_num_batched_tokens; the grid of _vllm_grid up
    to it, and max_num_batched_tokens itself where it is at most the largest. With speculative
    decoding (query_len > 1) the decode sizes are added: query_len times each request count of the
    same grid up to max_num_seqs (at most 512 or 1024, max_num_seqs itself included) that fits
    under the uncut largest size and max_num_batched_tokens."""
    ceiling = 1024 if blackwell else 512
    uncut = min(max_num_seqs * query_len * 2, ceiling)
    top = min(uncut, max_num_batched_tokens)
    sizes = _vllm_grid(top, interactivity)
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    if query_len > 1:
        requests = min(max_num_seqs, ceiling)
        counts = _vllm_grid(requests, False) | {requests}
        sizes.update(n * query_len for n in counts if n * query_len <= min(uncut, max_num_batched_tokens))
    return tuple(sorted(sizes))


def vllm_decode_requests(sizes: tuple[int, ...], max_num_seqs: int, query_len: int = 1) -> tuple[int, ...]:
    """The request counts a uniform decode batch replays a full graph at: model runner V2's
    CudaGraphManager._init_candidates (vllm/v1/worker/gpu/cudagraph_utils.py, the default
    runner) rounds each size up to a multiple of query_len and keeps it where it is at most
    max_num_seqs * query_len and the largest size. A batch pads to the next of them; above the
    largest it runs piecewise graphs (FULL_AND_PIECEWISE) or eagerly."""
    kept = {-(-size // query_len) for size in sizes
            if -(-size // query_len) * query_len <= min(max_num_seqs * query_len, sizes[-1])}
    return tuple(sorted(kept))


# -- SGLang 0.5.23 (the PyPI wheel) ----------------------------------------------------------------

SGLANG = "SGLang (0.5.23)"


def sglang_decode_max_bs(device_memory: int, tp_size: int = 1) -> int:
    """cuda_graph_config[decode].max_bs left unset: sglang/srt/arg_groups/memory_hook.py,
    handle_gpu_memory_settings, by the device's memory in MiB (nvidia-smi's memory.total)."""
    mib, small_tp = device_memory / (1 << 20), tp_size < 4
    if mib < 20 * 1024:  # T4, 4080
        return 8
    if mib < 35 * 1024:  # A10, 4090, 5090
        return 48 if small_tp else 160
    if mib < 60 * 1024:  # A100 40GB, L40
        return 32 if small_tp else 160
    if mib < 160 * 1024:  # H100, A100 80GB; H20, H200
        return 256 if small_tp else 512
    return 512  # B200, MI300


def sglang_sizes(max_bs: int, padding: bool = True, speculative: bool = False) -> tuple[int, ...]:
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


def sglang_pool_clamp(sizes: tuple[int, ...], pool: int) -> tuple[int, ...]:
    """sglang/srt/model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture:
    at start-up the decode runner keeps the sizes its request pool holds (req_to_token_pool.size,
    --max-running-requests where given, kv_cache_configurator.resolve_max_num_reqs), adding the
    pool's size where the list went past it."""
    if sizes[-1] <= pool:
        return sizes
    return (*(s for s in sizes if s < pool), pool)


# -- TensorRT-LLM: 1.0, and main at 0004396 where its padding rule changed ---------------------------

TRTLLM = "TensorRT-LLM (1.0)"
TRTLLM_NEWER = "TensorRT-LLM (0004396)"


def trtllm_sizes(max_batch_size: int = 128, enable_padding: bool = False, newer: bool = False) -> tuple[int, ...]:
    """tensorrt_llm/llmapi/llm_args.py, CudaGraphConfig._generate_cuda_graph_batch_sizes, for
    cuda_graph_config's max_batch_size (128 where it is unset, 0). 1.0: [1, 2, 4] + multiples of 8
    to 128 with padding, else range(1, 32) + [32, 64, 128]; + powers of two 2**8 .. below
    2**ceil(log2(max)). Newer (pull request 12895, read at main 0004396): with padding, steps of
    64 after 128 instead of the powers of two. Either way cut at the max, the max appended."""
    if enable_padding:
        sizes = [1, 2, 4, *(i * 8 for i in range(1, 17))]
        if newer:
            while sizes[-1] + 64 <= max_batch_size:
                sizes.append(sizes[-1] + 64)
    else:
        sizes = [*range(1, 32), 32, 64, 128]
    if not (newer and enable_padding):
        sizes += [2 ** i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]
    sizes = sorted(s for s in sizes if s <= max_batch_size)
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


TRTLLM_EXECUTOR = {"max_batch_size": 2048, "max_num_tokens": 8192}  # tensorrt_llm/builder.py, BuildConfig


def trtllm_executor_cut(sizes: tuple[int, ...], max_batch_size: int, max_num_tokens: int,
                        enable_padding: bool, max_draft_len: int = 0) -> tuple[int, ...]:
    """tensorrt_llm/_torch/pyexecutor/model_engine.py, _filter_cuda_graph_batch_sizes (pull
    request 4843, in 1.0): the sizes the executor's max_batch_size and max_num_tokens allow, a
    decode request being 1 + max_draft_len tokens (speculative_config's; 0 without it); with
    padding, the first size above them is replaced by that largest batch, so a full batch still
    pads to a graph."""
    top = min(max_batch_size, max_num_tokens // (1 + max_draft_len))
    kept = [s for s in sizes if s <= top]
    if enable_padding and len(kept) < len(sizes) and (not kept or kept[-1] != top):
        kept.append(top)
    return tuple(kept)


def exports(sizes: tuple[int, ...]) -> dict[str, dict]:
    """`sizes` as each engine takes them. Option names as in the engines' sources above:
    vLLM's CompilationConfig.cudagraph_capture_sizes (`--compilation-config`, `-cc`), SGLang's
    cuda_graph_bs_decode (`--cuda-graph-bs-decode`, nargs="+", in 0.5.23; earlier 0.5 releases
    took `--cuda-graph-bs`), TensorRT-LLM's cuda_graph_config.batch_sizes (the YAML of
    `trtllm-serve --extra_llm_api_options`, with enable_padding so a batch runs in the next size
    up, as the plan assumes), graphrt's --buckets."""
    listed = list(sizes)
    vllm = {"cudagraph_capture_sizes": listed}
    trtllm = {"cuda_graph_config": {"enable_padding": True, "batch_sizes": listed}}
    return {
        "vllm": {"compilation_config": vllm, "cli": f"--compilation-config '{json.dumps(vllm)}'"},
        "sglang": {"cuda_graph_bs_decode": listed, "cli": "--cuda-graph-bs-decode " + " ".join(map(str, sizes))},
        "tensorrt_llm": {**trtllm, "yaml": ("cuda_graph_config:\n  enable_padding: true\n"
                                            f"  batch_sizes: {json.dumps(listed)}\n")},
        "graphrt": {"buckets": listed, "cli": "--buckets " + ",".join(map(str, sizes))},
    }
