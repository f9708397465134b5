"""Any causal LM transformers can load, behind the step graphrt runs: transformers' own forward
and its own `StaticCache`, with nothing of graphrt's in between.

    model = load_transformers(config, path, device, dtype)   # or from_lean(lean_model) for --impl hf
    model.setup_cache(max_batch, max_seq_len)                 # a StaticCache of max_batch rows
    logits = model.prefill(tokens)                            # [B, T] -> [B, T, V], eager
    logits = model.decode_step(tokens, positions)             # [B, 1], [B] -> [B, V]

`HFCausalLM` adopts the transformers model's children (`model`, `lm_head`) as its own, so its
module names, its state_dict and every NVTX range are transformers' (`model.layers.0.self_attn
(MistralAttention)`), and calls the transformers model's own `forward`.

transformers' StaticCache holds one batch size, allocated at its first write, and writes every
row at one position: its own counter per layer (a device tensor, `cumulative_length`; a Python
int too in sliding-window layers), advanced by each call. So here:

- the cache is allocated in `setup_cache`, by one throwaway token through the model, then
  zeroed: never lazily inside a lint or a capture;
- every call runs all `max_batch` rows, the caller's rows first, padded after them (a graph
  bucket is the cache's rows; an eager step of fewer rows pays for the padding too);
- all rows share one position: `positions` gives the rotary positions, the counters the cache
  slot, and `seek` puts the counters at a position before a step that is run out of sequence.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from graphrt.errors import GraphrtError, first_line
from graphrt.model.config import ModelConfig

EXTRA = "pip install 'graphrt[hf]'"
# the first transformers whose models take their cache as `cache=` (5.23 and older call it
# `past_key_values` and would leave the StaticCache unused); setup.cfg's `hf` extra states it too
FLOOR = (5, 24)
# transformers' experts implementations that graphrt offers (`--experts`): its per-expert loop,
# every token through every expert at once, and one grouped GEMM where the device has it
EXPERTS = ("eager", "batched_mm", "grouped_mm")


def transformers_module(config: ModelConfig) -> Any:
    """transformers, imported only for a model that needs it; one line naming the extra if absent."""
    try:
        import transformers
    except ImportError:
        raise GraphrtError(f"{config.name}: model_type {config.model_type!r} runs on transformers' own "
                           f"forward, and transformers is not installed: {EXTRA}") from None
    if below_floor(transformers.__version__):
        raise GraphrtError(f"{config.name}: transformers' forward needs transformers >= "
                           f"{'.'.join(map(str, FLOOR))} (its `cache=` API), found {transformers.__version__}: {EXTRA}")
    # its load reports, hints and progress bars are not graphrt's output
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def below_floor(version: str) -> bool:
    """Is this transformers version ("5.17.0", "5.24.0.dev0") older than FLOOR?"""
    release = re.match(r"\d+(\.\d+)*", version)
    return release is None or tuple(int(p) for p in release.group().split(".")) < FLOOR


class HFCausalLM(nn.Module):
    """transformers' model of a checkpoint, run with its own StaticCache (module docstring)."""

    def __init__(self, hf: nn.Module, config: ModelConfig, default_experts: str | None = None):
        super().__init__()
        self.config = config
        self.default_experts = default_experts  # what a run uses without --experts (_with_experts)
        for name, child in hf.named_children():  # transformers' names: model, lm_head, ...
            self.add_module(name, child)
        object.__setattr__(self, "hf", hf)  # not a child: its children are ours already
        self.cache: Any = None
        self.max_batch = self.max_seq_len = 0
        self.fixed_batch = True  # every call runs the cache's max_batch rows

    @property
    def architecture(self) -> str:
        return type(self.hf).__name__

    @property
    def experts(self) -> str | None:
        """The experts implementation the model runs; None for a model without experts."""
        return self.hf.config._experts_implementation if experts_modules(self.hf) else None

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """A StaticCache of `max_batch` rows and `max_seq_len` slots, allocated now."""
        import transformers

        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.cache = transformers.StaticCache(config=self.hf.config, max_cache_len=max_seq_len)
        # no_grad, not inference_mode: the tensors the cache makes now (its keys and values, and
        # each counter, moved to the device at the first write) stay ordinary tensors, as the lean
        # model's cache is, so `seek` may move a counter outside inference mode too (an inference
        # tensor refuses any in-place write there, and on CUDA the counter would be one)
        with torch.no_grad():
            self.prefill(torch.zeros(max_batch, 1, dtype=torch.long, device=self.device))
            self.cache.reset()  # in place: the tensors keep their addresses

    def kv_cache_tensors(self) -> list[torch.Tensor]:
        """Every tensor the StaticCache holds keys and values in."""
        return [t for layer in self.cache.layers for t in (layer.keys, layer.values)]

    def seek(self, position: int) -> None:
        """Put every layer's write position at `position` (between steps, never inside one)."""
        for layer in self.cache.layers:
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(position)
            if hasattr(layer, "cumulative_length_int"):
                layer.cumulative_length_int = position

    def _padded(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> [max_batch, T]: the cache's batch is fixed, so pad rows follow."""
        b = tokens.shape[0]
        if b > self.max_batch:
            raise GraphrtError(f"batch {b} exceeds the KV cache's {self.max_batch} rows")
        if b == self.max_batch:
            return tokens
        return torch.cat((tokens, tokens.new_zeros(self.max_batch - b, tokens.shape[1])))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                keep: int = 0) -> torch.Tensor:
        """tokens [B, T], positions [B, T] or None (from the cache) -> logits [B, T or keep, V]."""
        b = tokens.shape[0]
        if positions is not None and b < self.max_batch:
            positions = torch.cat((positions, positions[:1].expand(self.max_batch - b, -1)))
        out = self.hf(input_ids=self._padded(tokens), position_ids=positions, cache=self.cache,
                      use_cache=True, logits_to_keep=keep)
        return out.logits[:b]

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Eager, from an empty cache: tokens [B, T] fill slots 0..T-1; logits [B, T, V]."""
        if self.cache is None:
            raise GraphrtError("the model has no KV cache yet: call setup_cache(max_batch, max_seq_len) first")
        self.cache.reset()
        return self(tokens)

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The step every backend runs: tokens [B, 1], positions [B] -> logits [B, V]."""
        return self(tokens, positions.unsqueeze(1), keep=1)[:, -1]


def experts_modules(hf: nn.Module) -> list[str]:
    """The modules whose forward transformers picks by its experts implementation."""
    return [name for name, m in hf.named_modules() if hasattr(m, "_is_expert_parallel")]


def _with_experts(hf: nn.Module, config: ModelConfig, experts: str | None) -> tuple[nn.Module, str | None]:
    """`experts` set on a model with experts, and the default (None without experts): one a
    graph can capture, transformers' own default (grouped_mm) where the device has it, else
    batched_mm, never its eager loop, whose routing reads token counts back to the host."""
    if not experts_modules(hf):
        if experts:
            raise GraphrtError(f"--experts {experts}: {config.name} has no experts")
        return hf, None
    default = hf.config._experts_implementation
    default = "batched_mm" if default == "eager" else default
    experts = experts or default
    if experts != hf.config._experts_implementation and (why := set_experts(hf, experts)) is not None:
        raise GraphrtError(f"--experts {experts}: transformers refuses it here ({why})")
    return hf, default


def set_experts(hf: nn.Module, experts: str) -> str | None:
    """Switch a transformers model with experts to the implementation `experts`; None when it
    did, else transformers' reason for refusing it here in one line (grouped_mm on a device
    without grouped GEMMs)."""
    try:
        hf.set_experts_implementation(experts)
    except (ValueError, ImportError, RuntimeError) as e:
        return first_line(e)
    return None


def _check_experts_name(experts: str | None) -> None:
    """--experts names one of EXPERTS, refused before transformers is imported."""
    if experts is not None and experts not in EXPERTS:
        raise GraphrtError(f"--experts must be one of {', '.join(EXPERTS)}, got {experts!r}")


def _loaded(transformers: Any, config: ModelConfig, path: Path, dtype: torch.dtype,
            experts: str | None) -> tuple[nn.Module, str | None]:
    try:
        if experts is not None:  # refused on the model's skeleton, before any weight is read
            with torch.device("meta"):
                skeleton = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
            _with_experts(skeleton, config, experts)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (ValueError, KeyError, OSError, ImportError, SafetensorError) as e:
        # transformers' own words: an architecture it has no causal LM for, a missing or cut weight file
        raise GraphrtError(f"{path}: transformers cannot load it as a causal LM ({first_line(e)})") from None
    return _with_experts(hf, config, experts)


def load_transformers(config: ModelConfig, path: Path, device: torch.device, dtype: torch.dtype,
                      experts: str | None = None) -> HFCausalLM:
    """A checkpoint directory through transformers' own classes, its weights in `dtype` on `device`."""
    _check_experts_name(experts)
    transformers = transformers_module(config)
    hf, default_experts = _loaded(transformers, config, path, dtype, experts)
    if getattr(hf, "_is_stateful", False) or not getattr(hf, "_can_compile_fullgraph", True):
        raise GraphrtError(f"{path}: {type(hf).__name__} keeps a recurrent state transformers' "
                           "StaticCache does not hold; graphrt decodes with a static KV cache only")
    return HFCausalLM(hf.to(device).eval().requires_grad_(False), config, default_experts)


def transformers_twin(model: nn.Module) -> nn.Module:
    """transformers' model of a lean family's config on the lean `model`'s very tensors: no memory
    spent twice, a tied matrix stays one tensor. The rotary table, a buffer outside the
    state_dict, is rebuilt on the device."""
    transformers = transformers_module(model.config)
    hf_config = transformers.AutoConfig.for_model(**model.config.to_hf_dict())
    device = model.lm_head.weight.device
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    hf.load_state_dict(model.state_dict(), assign=True)
    with torch.device(device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(hf.config)
    left = [n for n, t in (*hf.named_parameters(), *hf.named_buffers()) if t.is_meta]
    if left:
        raise GraphrtError(f"transformers' {type(hf).__name__}: tensors left on the meta device: "
                           f"{', '.join(left)}")
    return hf.eval().requires_grad_(False)


def from_lean(model: nn.Module, config: ModelConfig, experts: str | None = None) -> HFCausalLM:
    """`--impl hf` on a preset: transformers' forward on the lean model's weights
    (`transformers_twin`); `config` is the run's."""
    _check_experts_name(experts)
    hf, default_experts = _with_experts(transformers_twin(model), config, experts)
    return HFCausalLM(hf, config, default_experts)
