"""What serving engines capture, by their own rules, and the chosen sizes in each engine's option.

Each rule follows the engine's source at the version its comment names, for one decode token per
request (no speculative decoding). The rules take the numbers the engine's server has resolved;
graphrt.bench.engine_lists resolves them from what a user passes and the device served on.
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


def vllm_sizes(max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False,
               interactivity: bool = False) -> tuple[int, ...]:
    """vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, cudagraph_capture_sizes unset: the
    largest size is min(2 * max_num_seqs, 512; 1024 on data-center Blackwell), at most
    max_num_batched_tokens; sizes [1, 2, 4] (1..32 in the interactivity performance mode) +
    range(8, 256, 8) + range(256, max + 1, 16), and max_num_batched_tokens itself where it is at
    most the largest."""
    top = min(max_num_seqs * 2, 1024 if blackwell else 512, max_num_batched_tokens)
    sizes = set(range(1, min(top, 32) + 1)) if interactivity else {s for s in (1, 2, 4) if s <= top}
    if top >= 8:
        sizes.update(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes.update(range(256, top + 1, 16))
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


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


def sglang_sizes(max_bs: int, padding: bool = True) -> tuple[int, ...]:
    """sglang/srt/arg_groups/cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes: every
    size 1..max_bs with padding disabled, else [1, 2, 4, 8, 12] + range(16, 257, 8) +
    range(272, 512, 16) + range(512, max_bs + 1, 32); cut at max_bs, max_bs itself appended."""
    if not padding:
        return tuple(range(1, max_bs + 1))
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    return tuple(sizes if max_bs in sizes else [*sizes, max_bs])


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


def trtllm_executor_cut(sizes: tuple[int, ...], max_batch_size: int, max_num_tokens: int,
                        enable_padding: bool) -> tuple[int, ...]:
    """tensorrt_llm/_torch/pyexecutor/model_engine.py, _filter_cuda_graph_batch_sizes (pull
    request 4843, in 1.0): the sizes the executor's max_batch_size and max_num_tokens allow (a
    decode request is one token); with padding, the first size above them is replaced by that
    largest batch, so a full batch still pads to a graph."""
    top = min(max_batch_size, max_num_tokens)
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
