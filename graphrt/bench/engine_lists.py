"""Each engine's default capture list as its server resolves it: from the settings a user passes
(graphrt.bench.engine_settings) and the device it serves on, by the rules of graphrt.bench.engines.

A list says what it assumed (the settings as resolved, given or defaulted), so a plan's reader
can tell which server each row stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.bench import engines
from graphrt.bench.engine_settings import Settings, Value


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
    sizes: tuple[int, ...]
    padding: bool  # a batch pads up to the next size (else it replays only at a captured size)
    # decode steps replay full graphs only up to this size (vLLM's max_num_seqs); None: at every size
    full_graphs_up_to: int | None
    assumed: dict[str, Value]  # every setting the list depends on, as resolved

    def decode_sizes(self) -> tuple[int, ...]:
        """The sizes a decode step can replay as one graph."""
        limit = self.full_graphs_up_to
        return self.sizes if limit is None else tuple(s for s in self.sizes if s <= limit)


def said(assumed: dict[str, Value]) -> str:
    """Settings as `name value, ...`, true and false as the engines' YAML spells them."""
    return ", ".join(f"{name} {str(value).lower() if isinstance(value, bool) else value}"
                     for name, value in assumed.items())


def vllm_list(given: dict[str, Value], device: ServedOn, max_model_len: int) -> EngineList:
    """vLLM 0.30.0's `vllm serve` (vllm/engine/arg_utils.py,
    _set_default_max_num_seqs_and_batched_tokens_args, with chunked prefill on, its default):
    unset limits take the device's defaults, doubled in the throughput performance mode; an unset
    max_num_batched_tokens is at most max_num_seqs * max_model_len, an unset max_num_seqs at most
    max_num_batched_tokens. In FULL_AND_PIECEWISE (the default cudagraph_mode) and
    FULL_DECODE_ONLY a decode batch replays a full graph only at sizes up to max_num_seqs
    (vllm/v1/cudagraph_dispatcher.py: a uniform decode key's requests are min(size,
    max_num_seqs)); above them the first runs piecewise graphs, the second eagerly."""
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
    cudagraph_mode = given.get("cudagraph_mode", "FULL_AND_PIECEWISE")
    sizes = engines.vllm_sizes(seqs, tokens, device.blackwell, mode == "interactivity")
    return EngineList(engines.VLLM, sizes, True, seqs,
                      {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "max_model_len": max_model_len,
                       "performance_mode": mode, "cudagraph_mode": cudagraph_mode})


def sglang_list(given: dict[str, Value], device: ServedOn) -> EngineList:
    """SGLang 0.5.23's server (memory_hook.handle_gpu_memory_settings): the decode max batch from
    --cuda-graph-max-bs-decode, else the device's memory tier, cut to --max-running-requests
    where that is smaller. At start-up its runner also cuts the list to the request pool it
    sized from free memory; that pool is not known here."""
    tp_size = given.get("tp_size", 1)
    max_bs = given.get("cuda_graph_max_bs_decode")
    if max_bs is None:
        max_bs = engines.sglang_decode_max_bs(device.memory, tp_size)
        if "max_running_requests" in given:
            max_bs = min(max_bs, given["max_running_requests"])
    padding = not given.get("disable_cuda_graph_padding", False)
    assumed = {"tp_size": tp_size, "cuda_graph_max_bs_decode": max_bs, "disable_cuda_graph_padding": not padding}
    if "max_running_requests" in given:
        assumed["max_running_requests"] = given["max_running_requests"]
    return EngineList(engines.SGLANG, engines.sglang_sizes(max_bs, padding), True, None, assumed)


def trtllm_lists(given: dict[str, Value]) -> list[EngineList]:
    """TensorRT-LLM's: cuda_graph_config's list (its max_batch_size 128 where unset, padding off
    by default), cut by the executor's max_batch_size and max_num_tokens where they are given
    (unset, they are taken to hold the whole list); the newer padding rule's list beside 1.0's
    where the two differ. Without padding a batch replays only at a captured size."""
    max_bs = given.get("cuda_graph_config.max_batch_size", 128)
    padding = given.get("cuda_graph_config.enable_padding", False)
    executor = {name: given[name] for name in ("max_batch_size", "max_num_tokens") if name in given}
    assumed = {"cuda_graph_config.max_batch_size": max_bs, "cuda_graph_config.enable_padding": padding, **executor}
    lists = []
    for name, newer in ((engines.TRTLLM, False), (engines.TRTLLM_NEWER, True)):
        sizes = engines.trtllm_sizes(max_bs, padding, newer)
        if executor:
            sizes = engines.trtllm_executor_cut(sizes, executor.get("max_batch_size", sizes[-1]),
                                                executor.get("max_num_tokens", sizes[-1]), padding)
        if not lists or sizes != lists[0].sizes:
            lists.append(EngineList(name, sizes, padding, None, assumed))
    return lists


def engine_lists(settings: Settings, device: ServedOn, max_model_len: int) -> list[EngineList]:
    """Every engine's list for `settings` (engine -> name -> value, as given) on `device`."""
    return [vllm_list(settings.get("vllm", {}), device, max_model_len),
            sglang_list(settings.get("sglang", {}), device), *trtllm_lists(settings.get("tensorrt_llm", {}))]
