"""What a run is asked to do: `RunSpec`, checked as it is made.

Torch-free, so that the command line builds its options from it without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.backends.choices import expand_modes
from graphrt.errors import GraphrtError
from graphrt.model.config import DTYPES, IMPLEMENTATIONS


@dataclass(frozen=True)
class RunSpec:
    model: str = "qwen2-0.5b"
    device: str = "auto"
    dtype: str = "auto"
    batch: int = 1
    prompt_len: int = 16
    steps: int = 32
    warmup: int | None = None  # None: a quarter of the steps, 1 to 4
    max_seq_len: int = 0  # 0: prompt_len + steps
    seed: int = 0
    mode: str = "both"
    buckets: tuple[int, ...] | None = None
    nvtx: bool = True  # a range around every module call and every step
    # token ids per row (of any lengths) instead of random ones; batch and prompt_len follow them
    prompt_ids: tuple[tuple[int, ...], ...] = ()
    lint: bool = True  # lint the step before a graph captures it (GraphBackend)
    # tensor-parallel ranks; None: as many as the launcher started (torchrun), else 1
    tp: int | None = None
    # which forward: graphrt's lean step, transformers' own ("hf"), or lean where it can run the model
    impl: str = "auto"
    experts: str | None = None  # transformers' experts implementation, for a model with experts

    def __post_init__(self) -> None:
        if self.prompt_ids:
            object.__setattr__(self, "batch", len(self.prompt_ids))
            object.__setattr__(self, "prompt_len", max(map(len, self.prompt_ids)))
        for key in ("batch", "prompt_len", "steps"):
            value = getattr(self, key)
            if value <= 0:
                raise GraphrtError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
        if self.steps < 2:
            raise GraphrtError("--steps must be at least 2: one untimed warmup step, then timed ones")
        if self.warmup is None:
            object.__setattr__(self, "warmup", min(4, max(1, self.steps // 4)))
        # warmup step 0 also counts the step's ops: at least one step is never timed
        if not 1 <= self.warmup < self.steps:
            raise GraphrtError(f"--warmup must be at least 1 and below --steps ({self.steps}), "
                               f"got {self.warmup}")
        if self.tp is not None and self.tp < 1:
            raise GraphrtError(f"--tp must be a positive integer, got {self.tp}")
        if self.max_seq_len < 0:
            raise GraphrtError(f"--max-seq-len must be positive, got {self.max_seq_len}")
        if self.max_seq_len and self.prompt_len + self.steps > self.max_seq_len:
            raise GraphrtError(
                f"--prompt-len {self.prompt_len} + --steps {self.steps} = "
                f"{self.prompt_len + self.steps} exceeds --max-seq-len {self.max_seq_len}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise GraphrtError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise GraphrtError(f"--dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.impl not in IMPLEMENTATIONS:
            raise GraphrtError(f"--impl must be one of {', '.join(IMPLEMENTATIONS)}, got {self.impl!r}")
        expand_modes(self.mode)  # validates

    @property
    def seq_len(self) -> int:
        return self.max_seq_len or self.prompt_len + self.steps
