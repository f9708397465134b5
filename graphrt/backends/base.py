"""What every backend is: `Backend`, one decode step run its own way, and `PrepareReport`, what
getting ready cost."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from graphrt.model.decoder import Qwen2ForCausalLM


@dataclass
class PrepareReport:
    """What getting ready cost: capture or compile time, and memory it keeps."""

    seconds: float = 0.0
    memory_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    # per captured batch bucket, in capture order: {"pool_bytes": ..., "device_bytes": ...}
    # (device_bytes, the drop in the device's free memory, only for CUDA graphs; None where the
    # drop cannot be the graph's)
    buckets: dict[int, dict[str, int | None]] = field(default_factory=dict)
    lint_seconds: float | None = None  # the graph backend's lint of the step, before capture
    # per captured batch bucket, the seconds its capture took (warmup included)
    capture_seconds: dict[int, float] = field(default_factory=dict)
    # the process's one-off capture set-up on CUDA (graphrt.graphs.cuda.set_up_capture), paid by
    # its first graph backend and in `seconds`, in no bucket's; None where it was not paid here
    capture_setup_seconds: float | None = None


class Backend(ABC):
    name: str
    # On the CPU a step's ops are counted under a dispatch mode, which compiled code refuses.
    countable_on_cpu = True

    def __init__(self, model: Qwen2ForCausalLM):
        self.model = model

    def cache_rows(self, batch: int) -> int:
        """KV-cache rows this backend needs to decode `batch` sequences (padding included)."""
        return batch

    def prepare(self, max_batch: int) -> PrepareReport:
        """Capture or compile for batches up to `max_batch`; called once, before prefill."""
        return PrepareReport()

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """prompt [B, T] -> logits [B, T, V], eagerly, filling the cache slots 0..T-1."""
        return self.model.prefill(prompt)

    @abstractmethod
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens [B, 1], positions [B] -> logits [B, V], writing the KV cache in place."""
