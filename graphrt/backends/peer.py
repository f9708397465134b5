"""The peer: Hugging Face transformers' eager decode with a StaticCache, on graphrt's weights
(HF's model of the config's family: Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM).

What a user would otherwise run. It is a `Backend`, so `graphrt.run.decode.decode` times it with the
very loop that times eager, graph and compile.

The HF model is built from `config.to_hf_dict()` on the meta device and graphrt's state_dict is
assigned into it: the same tensors, so it costs no memory and a tied matrix stays one tensor.
The rotary table, a buffer outside the state_dict, is rebuilt on the device.

transformers 5.x API: the cache is passed as `cache=` and keeps its own write position (a
StaticCache counts the tokens it has seen), so positions come from the cache, not the caller.
A bench that starts decoding past the prompt (`decode(start=...)`) therefore runs the peer at
positions T, T+1, ... instead; the cost is the same, since a StaticCache of `max_cache_len`
slots is attended over in full, masked, exactly like graphrt's.
"""

from __future__ import annotations

import torch

from graphrt.backends.base import Backend
from graphrt.errors import GraphrtError
from graphrt.measure.nvtx import nvtx_range
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.hf_causal import transformers_twin

NAME = "hf"


def unavailable() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    from graphrt.model.hf_causal import FLOOR, below_floor

    if below_floor(transformers.__version__):
        return (f"the peer needs transformers >= {'.'.join(map(str, FLOOR))} (its `cache=` API), "
                f"found {transformers.__version__}")
    return None


class PeerBackend(Backend):
    """HF's model of the family, sharing `model`'s weights; `prefill` starts a fresh StaticCache
    sized like graphrt's cache (`model.max_seq_len` slots), `step` decodes one token into it."""

    name = NAME

    def __init__(self, model: Qwen2ForCausalLM):
        super().__init__(model)
        self.hf = transformers_twin(model)
        self.attn_implementation = self.hf.config._attn_implementation
        self.cache = None

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> last-position logits [B, 1, V], through the current cache."""
        return self.hf(input_ids=tokens, cache=self.cache, use_cache=True, logits_to_keep=1).logits

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        import transformers

        self.cache = transformers.StaticCache(config=self.hf.config, max_cache_len=self.model.max_seq_len)
        return self._logits(prompt)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`positions` is not used: the StaticCache knows where the next token goes."""
        if self.cache is None:  # HF would make a one-token dynamic cache: another step than the one timed
            raise GraphrtError("the HF peer steps only after a prefill has made its StaticCache")
        with nvtx_range("decode_step[hf]"):
            return self._logits(tokens)[:, -1]
