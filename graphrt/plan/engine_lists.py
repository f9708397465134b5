"""Each engine's default capture list as its server resolves it: from the settings a user passes
(graphrt.plan.engine_settings) and the device it serves on, by the rules of graphrt.plan.engines.

A list says what it assumed (the settings as resolved, given or defaulted), so a plan's reader
can tell which server each row stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.plan import engines
from graphrt.plan.engine_settings import Settings, Value
from graphrt.errors import GraphrtError


@dataclass(frozen=True)
class ServedOn:
    """What an engine reads of the device it serves on."""

    memory: int  # bytes
    name: str  # as the device names itself; "" where unknown
    blackwell: bool  # data-center Blackwell (compute capability 10.x)


@dataclass(frozen=True)
class EngineList:
    """One engine's capture list, as its server resolves it."""

    name: str  # the row's name, with the version its rule was read at
    sizes: tuple[int, ...]  # as the engine captures them (vLLM's count tokens, the others' requests)
    padding: bool  # a batch pads up to the next size (else it replays only at a captured size)
    # the largest decode batch the server forms (vLLM's max_num_seqs); None: every size it captures
    full_graphs_up_to: int | None
    assumed: dict[str, Value]  # every setting the list depends on, as resolved
    decode: tuple[int, ...] | None = None  # decode batches (requests) replayed as one graph; None: sizes
    speculative: bool = False  # a decode request verifies draft tokens too

    def decode_sizes(self) -> tuple[int, ...]:
        """The batch sizes (requests) a decode step can replay as one graph."""
        return self.sizes if self.decode is None else self.decode


def said(assumed: dict[str, Value]) -> str:
    """Settings as `name value, ...`, true and false as the engines' YAML spells them."""
    return ", ".join(f"{name} {str(value).lower() if isinstance(value, bool) else value}"
                     for name, value in assumed.items())


def vllm_list(given: dict[str, Value], device: ServedOn, max_model_len: int) -> EngineList:
    """vLLM 0.30.0's `vllm serve` (vllm/engine/arg_utils.py,
    _set_default_max_num_seqs_and_batched_tokens_args, with chunked prefill on, its default):
    unset limits take the device's defaults, doubled in the throughput performance mode; an unset
    max_num_batched_tokens is at most max_num_seqs * max_model_len, an unset max_num_seqs at most
    max_num_batched_tokens; max_num_batched_tokens below max_num_seqs is refused
    (vllm/config/scheduler.py, SchedulerConfig.__post_init__). Under speculative decoding a decode
    request is 1 + num_speculative_tokens tokens and the sizes count tokens (engines.vllm_sizes).
    In FULL_AND_PIECEWISE (the default cudagraph_mode) and FULL_DECODE_ONLY a decode batch, never
    above max_num_seqs, replays a full graph at the sizes engines.vllm_decode_requests gives."""
    tokens, seqs = engines.vllm_batch_defaults(device.memory, device.name)
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
    sizes = engines.vllm_sizes(seqs, tokens, device.blackwell, mode == "interactivity", 1 + drafts)
    assumed = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "max_model_len": max_model_len,
               "performance_mode": mode, "cudagraph_mode": given.get("cudagraph_mode", "FULL_AND_PIECEWISE")}
    if drafts:
        assumed["speculative_config.num_speculative_tokens"] = drafts
    return EngineList(engines.VLLM, sizes, True, seqs, assumed,
                      engines.vllm_decode_requests(sizes, seqs, 1 + drafts), bool(drafts))


def _given_or_default(given: dict[str, Value], name: str) -> str:
    return f"{name} given" if name in given else f"{name} by default"


def sglang_list(given: dict[str, Value], device: ServedOn) -> EngineList:
    """SGLang 0.5.23's server (memory_hook.handle_gpu_memory_settings): the decode max batch from
    --cuda-graph-max-bs-decode, else the device's memory tier, cut to --max-running-requests
    where that is smaller; with a --speculative-algorithm, its own list. At start-up its runner
    cuts the list to its request pool (engines.sglang_pool_clamp): --max-running-requests where
    given, else 48 under every built-in speculative algorithm but UNO (speculative_hook,
    _handle_eagle_family and its siblings), else sized from the KV cache (at least 2048 requests
    unless the cache holds under 4096 tokens; not known here, so not cut)."""
    tp_size = given.get("tp_size", 1)
    algorithm = given.get("speculative_algorithm")
    max_bs = given.get("cuda_graph_max_bs_decode")
    if max_bs is None:
        max_bs = engines.sglang_decode_max_bs(device.memory, tp_size)
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
    sizes = engines.sglang_sizes(max_bs, padding, algorithm is not None)
    if pool is not None:
        sizes = engines.sglang_pool_clamp(sizes, pool)
    return EngineList(engines.SGLANG, sizes, True, None, assumed, speculative=algorithm is not None)


def trtllm_lists(given: dict[str, Value]) -> list[EngineList]:
    """TensorRT-LLM's: cuda_graph_config's list (its max_batch_size 128 where unset, padding off
    by default), cut by the executor's max_batch_size and max_num_tokens (trtllm-serve's defaults,
    BuildConfig's 2048 and 8192, where unset), a decode request being 1 +
    speculative_config.max_draft_len tokens; the newer padding rule's list beside 1.0's where the
    two differ. Without padding a batch replays only at a captured size."""
    max_bs = given.get("cuda_graph_config.max_batch_size", 128)
    padding = given.get("cuda_graph_config.enable_padding", False)
    drafts = given.get("speculative_config.max_draft_len", 0)
    executor = {name: given.get(name, default) for name, default in engines.TRTLLM_EXECUTOR.items()}
    if executor["max_num_tokens"] < 1 + drafts:
        raise GraphrtError(f"--engine-setting: TensorRT-LLM's max_num_tokens {executor['max_num_tokens']} holds no "
                           f"decode request of 1 + max_draft_len {drafts} tokens; expected "
                           f"tensorrt_llm.max_num_tokens of at least {1 + drafts}")
    assumed = {"cuda_graph_config.max_batch_size": max_bs, "cuda_graph_config.enable_padding": padding, **executor}
    if drafts:
        assumed["speculative_config.max_draft_len"] = drafts
    lists: list[EngineList] = []
    for name, newer in ((engines.TRTLLM, False), (engines.TRTLLM_NEWER, True)):
        sizes = engines.trtllm_executor_cut(engines.trtllm_sizes(max_bs, padding, newer), executor["max_batch_size"],
                                            executor["max_num_tokens"], padding, drafts)
        if not lists or sizes != lists[0].sizes:
            lists.append(EngineList(name, sizes, padding, None, assumed, speculative=bool(drafts)))
    return lists


def engine_lists(settings: Settings, device: ServedOn, max_model_len: int) -> list[EngineList]:
    """Every engine's list for `settings` (engine -> name -> value, as given) on `device`."""
    return [vllm_list(settings.get("vllm", {}), device, max_model_len),
            sglang_list(settings.get("sglang", {}), device), *trtllm_lists(settings.get("tensorrt_llm", {}))]
