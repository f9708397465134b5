"""TensorRT-LLM: the step markers its PyTorch backend writes, how it resolves its capture sizes
(1.0, and main at 0004396 where its padding rule changed), and the option that takes a plan's list.

Markers: `PyExecutor._forward_step`, an NVTX range in the `TensorRT-LLM` domain (Nsight Systems
traces only): `_forward_step: 1 ctx reqs, 7 gen reqs`, `[Executor] _forward_step: …`,
`[Executor] _forward_step 42: …`, and since its per-iteration context-token log (2026)
`[Executor] _forward_step 42: 1 ctx reqs, 512 ctx tokens, 7 gen reqs`.
"""

from __future__ import annotations

import json
import math
import re

from graphrt.engines.engine import COUNT, FLAG, Engine, EngineList, Value
from graphrt.engines.step_marker import ANNOTATION, Marker, count, phase_of
from graphrt.errors import GraphrtError

NAME = "TensorRT-LLM"
LISTED, LISTED_NEWER = "TensorRT-LLM (1.0)", "TensorRT-LLM (0004396)"  # the versions its rules were read at
# its LLM API's fields, dotted inside cuda_graph_config and speculative_config
SETTINGS = {"max_batch_size": COUNT, "max_num_tokens": COUNT,
            "cuda_graph_config.max_batch_size": COUNT, "cuda_graph_config.enable_padding": FLAG,
            "speculative_config.max_draft_len": COUNT}
EXECUTOR = {"max_batch_size": 2048, "max_num_tokens": 8192}  # tensorrt_llm/builder.py, BuildConfig

_FORWARD_STEP = re.compile(r"(?:\[Executor\] )?_forward_step(?: \d+)?: (\d+) ctx reqs, (?:(\d+) ctx tokens, )?"
                           r"(\d+) gen reqs", re.ASCII)


def read_marker(name: str) -> Marker | None:
    """The marker `name` is in TensorRT-LLM's forms, or None."""
    if not (m := _FORWARD_STEP.fullmatch(name)):
        return None
    c, _, g = m.groups()
    c, g = count("ctx reqs", c), count("gen reqs", g)
    return Marker(NAME, "TensorRT-LLM _forward_step", ANNOTATION, phase_of(c, g), c + g)


def capture_sizes(max_batch_size: int = 128, enable_padding: bool = False, newer: bool = False) -> tuple[int, ...]:
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


def executor_cut(sizes: tuple[int, ...], max_batch_size: int, max_num_tokens: int,
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


def capture_lists(given: dict[str, Value]) -> list[EngineList]:
    """TensorRT-LLM's: cuda_graph_config's list (its max_batch_size 128 where unset, padding off
    by default), cut by the executor's max_batch_size and max_num_tokens (trtllm-serve's defaults,
    BuildConfig's 2048 and 8192, where unset), a decode request being 1 +
    speculative_config.max_draft_len tokens; the newer padding rule's list beside 1.0's where the
    two differ. Without padding a batch replays only at a captured size."""
    max_bs = given.get("cuda_graph_config.max_batch_size", 128)
    padding = given.get("cuda_graph_config.enable_padding", False)
    drafts = given.get("speculative_config.max_draft_len", 0)
    executor = {name: given.get(name, default) for name, default in EXECUTOR.items()}
    if executor["max_num_tokens"] < 1 + drafts:
        raise GraphrtError(f"--engine-setting: TensorRT-LLM's max_num_tokens {executor['max_num_tokens']} holds no "
                           f"decode request of 1 + max_draft_len {drafts} tokens; expected "
                           f"tensorrt_llm.max_num_tokens of at least {1 + drafts}")
    assumed = {"cuda_graph_config.max_batch_size": max_bs, "cuda_graph_config.enable_padding": padding, **executor}
    if drafts:
        assumed["speculative_config.max_draft_len"] = drafts
    lists: list[EngineList] = []
    for name, newer in ((LISTED, False), (LISTED_NEWER, True)):
        sizes = executor_cut(capture_sizes(max_bs, padding, newer), executor["max_batch_size"],
                             executor["max_num_tokens"], padding, drafts)
        if not lists or sizes != lists[0].sizes:
            lists.append(EngineList(name, sizes, padding, None, assumed, speculative=bool(drafts)))
    return lists


def export(sizes: tuple[int, ...]) -> dict:
    """`sizes` as cuda_graph_config.batch_sizes: the YAML of `trtllm-serve --extra_llm_api_options`,
    with enable_padding so a batch runs in the next size up, as the plan assumes."""
    config = {"cuda_graph_config": {"enable_padding": True, "batch_sizes": list(sizes)}}
    return {**config, "yaml": f"cuda_graph_config:\n  enable_padding: true\n  batch_sizes: {json.dumps(list(sizes))}\n"}


ENGINE = Engine(NAME, read_marker, re.compile(r"(\[Executor\] )?_forward_step( [0-9]+)?:"),
                "TensorRT-LLM's _forward_step: N ctx reqs, N gen reqs",
                key="tensorrt_llm", settings=SETTINGS, resolve=lambda given, _device, _len: capture_lists(given),
                export=export)
