"""torch.compile of the same decode step: the peer a user would otherwise pick."""

from __future__ import annotations

import time

import torch

from graphrt.backends.base import Backend, PrepareReport
from graphrt.backends.toolchain import missing_for_compile
from graphrt.errors import GraphrtError
from graphrt.measure.nvtx import nvtx_range
from graphrt.model.decoder import Qwen2ForCausalLM


def _check_toolchain(device: torch.device) -> None:
    """Inductor builds what it generates here: say what is missing, up front."""
    also = ()
    if device.type == "cpu":
        from torch._inductor import config

        also = config.cpp.cxx if isinstance(config.cpp.cxx, tuple) else (config.cpp.cxx,)
    missing = missing_for_compile(device.type, also)
    if missing:
        where = "on CUDA" if device.type == "cuda" else "on the CPU"
        raise GraphrtError(f"--mode compile {where} needs {' and '.join(missing)} for Inductor; "
                           "install it or leave compile out")


class CompileBackend(Backend):
    """`torch.compile(fullgraph=True)`: Inductor kernels, wrapped in CUDA graphs on CUDA
    (`mode="reduce-overhead"`); Inductor's default mode on the CPU."""

    name = "compile"
    countable_on_cpu = False

    def __init__(self, model: Qwen2ForCausalLM):
        super().__init__(model)
        device = model.lm_head.weight.device
        _check_toolchain(device)  # before any mode of a run has spent its time
        self.device = device
        self.compiled = torch.compile(model.decode_step, fullgraph=True,
                                      mode="reduce-overhead" if device.type == "cuda" else None)

    def prepare(self, max_batch: int) -> PrepareReport:
        """Compile (and on CUDA record the graphs) for `max_batch` with throwaway inputs; the
        cache slots they write are overwritten by the next prefill."""
        start = time.perf_counter()
        with torch.inference_mode(), nvtx_range(f"compile[bs={max_batch}]"):
            # Made inside inference mode, like the decode loop's inputs: Dynamo guards on the
            # dispatch keys of its inputs, and an ordinary tensor here would compile a graph
            # that the first real step cannot use (a recompile there, inside the timed loop).
            tokens = torch.zeros(max_batch, 1, dtype=torch.long, device=self.device)
            positions = torch.zeros(max_batch, dtype=torch.long, device=self.device)
            self.model.seek(0)
            for _ in range(3):  # cudagraph trees record on the second or third call
                self.compiled(tokens, positions)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        return PrepareReport(seconds=time.perf_counter() - start)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with nvtx_range("decode_step[compile]"):
            return self.compiled(tokens, positions)
