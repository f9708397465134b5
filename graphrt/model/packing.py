"""Packed projections: several of a checkpoint's Linear layers run as one GEMM, while the
state_dict still speaks the checkpoint's names.

A decoder layer reads q, k and v from the same input, and gate and up from the same input, so
engines concatenate their weight rows once at load and launch one matmul instead of three (or
two): `self_attn.qkv_proj` holds q_proj's rows, then k_proj's, then v_proj's; `mlp.gate_up_proj`
gate_proj's, then up_proj's. This module is the one place that knows it:

- `state_dict()` gives each part under its own name (`...self_attn.q_proj.weight`), as a view
  of its rows: copying a checkpoint tensor into that view is the load-time packing, and a
  consumer that assigns the views (HF's model, a peer) shares the packed memory.
- `load_state_dict()` takes the parts by their names and writes them into their rows (the
  root module registers `pack_checkpoint_names`).
- `split` and `join` turn a packed tensor into its parts and back: what a loader that shards
  each part (tensor parallelism shards q, k, v by heads) needs to build its own rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class PackedLinear(nn.Linear):
    """One Linear whose output rows are `parts` side by side: `parts` is ((name, rows), ...),
    each name a sibling module of the checkpoint (`q_proj`), in row order."""

    def __init__(self, in_features: int, parts: tuple[tuple[str, int], ...], *, bias: bool = False):
        super().__init__(in_features, sum(rows for _, rows in parts), bias=bias)
        self.parts = parts

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, parts={', '.join(f'{n}[{r}]' for n, r in self.parts)}"

    def split(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        """A packed weight [sum(rows), ...] or bias [sum(rows)] -> each part's rows (views)."""
        return dict(zip((name for name, _ in self.parts),
                        packed.split([rows for _, rows in self.parts], dim=0)))

    def join(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each part's tensor, by name -> the packed tensor (a new one)."""
        return torch.cat([parts[name] for name, _ in self.parts], dim=0)

    @staticmethod
    def _parent(prefix: str) -> str:
        """`model.layers.0.self_attn.qkv_proj.` -> `model.layers.0.self_attn.`: the parts are
        this module's siblings in the checkpoint."""
        return prefix[: prefix.rstrip(".").rfind(".") + 1]

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        parent = self._parent(prefix)
        for kind, packed in self._parameters.items():
            if packed is None:
                continue
            packed = packed if keep_vars else packed.detach()
            for name, part in self.split(packed).items():
                destination[f"{parent}{name}.{kind}"] = part


def pack_checkpoint_names(model: nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                          strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                          error_msgs: list[str]) -> None:
    """A `load_state_dict` pre-hook for the root module: joins each PackedLinear's parts, given
    under the checkpoint's names, into the packed tensor its own name loads from. The root's
    hook, since a module loads only the keys under its own prefix and the parts are siblings.
    A part that is absent is reported under its own name."""
    for name, module in model.named_modules():
        if not isinstance(module, PackedLinear):
            continue
        parent = PackedLinear._parent(f"{prefix}{name}.")
        for kind, packed in module._parameters.items():
            if packed is None:
                continue
            keys = {part: f"{parent}{part}.{kind}" for part, _ in module.parts}
            absent = [key for key in keys.values() if key not in state_dict]
            if absent:
                missing_keys.extend(absent)
                continue
            state_dict[f"{prefix}{name}.{kind}"] = module.join({part: state_dict.pop(key)
                                                                for part, key in keys.items()})
