"""What serving engines capture by default, and the chosen sizes in each engine's own option.

Each default list follows the engine's source, read where the comment says; where the list
depends on a parameter (the engine's largest batch), `max_batch` is that parameter.
"""

from __future__ import annotations

import json
import math

from graphrt.backends.choices import default_buckets

# vLLM, vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes (main at 000fc94b; the same rule
# is the docstring of CompilationConfig.max_cudagraph_capture_size in vllm/config/compilation.py
# since 0.11): without speculative decoding, max_cudagraph_capture_size =
# min(max_num_seqs * 2, 512) (1024 on data-center Blackwell), also at most
# max_num_batched_tokens; sizes [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16).
VLLM = "vLLM (000fc94b)"
# SGLang 0.5.23 (the PyPI wheel), sglang/srt/arg_groups/cuda_graph_hook.py,
# generate_decode_cuda_graph_batch_sizes, no speculative decoding, padding on:
# [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max_bs + 1, 32), cut at
# max_bs (cuda_graph_config[decode].max_bs), then max_bs itself appended where missing.
SGLANG = "SGLang (0.5.23)"
# TensorRT-LLM, tensorrt_llm/llmapi/llm_args.py, CudaGraphConfig._generate_cuda_graph_batch_sizes
# (1.0): batch_sizes unset and max_batch_size unset -> 128; enable_padding false (its default):
# range(1, 32) + [32, 64, 128] + powers of two 2**8 .. below 2**ceil(log2(max)), cut at max,
# then max itself appended.
TRTLLM = "TensorRT-LLM (1.0)"


def vllm_sizes(max_num_seqs: int, blackwell: bool = False) -> tuple[int, ...]:
    top = min(max_num_seqs * 2, 1024 if blackwell else 512)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += range(8, min(top + 1, 256), 8)
    if top >= 256:
        sizes += range(256, top + 1, 16)
    return tuple(sizes)


def sglang_sizes(max_bs: int) -> tuple[int, ...]:
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    return tuple(sizes if max_bs in sizes else [*sizes, max_bs])


def trtllm_sizes(max_batch_size: int = 128, enable_padding: bool = False) -> tuple[int, ...]:
    sizes = [1, 2, 4, *(i * 8 for i in range(1, 17))] if enable_padding else [*range(1, 32), 32, 64, 128]
    sizes += [2 ** i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]
    sizes = sorted(s for s in sizes if s <= max_batch_size)
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


def defaults(max_batch: int) -> dict[str, tuple[int, ...]]:
    """Each engine's default list for a server whose largest batch is `max_batch` (vLLM's
    max_num_seqs, SGLang's decode max_bs, TensorRT-LLM's max_batch_size); powers of two are
    graphrt's own default."""
    return {VLLM: vllm_sizes(max_batch), SGLANG: sglang_sizes(max_batch),
            TRTLLM: trtllm_sizes(max_batch), "powers of two": default_buckets(max_batch)}


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
