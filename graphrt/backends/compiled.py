"""torch.compile of the same decode step: the peer a user would otherwise pick."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

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


# Inductor logs each reason for skipping CUDA graphs here (torch._inductor.cudagraph_utils,
# `log_cudagraph_skip_and_bump_counter`), on CUDA only, and counts every skip, on any device, in
# torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"


@dataclass
class CudagraphSkips:
    """The times torch.compile chose not to wrap compiled code in CUDA graphs, and why where
    Inductor said."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)

    def note(self) -> str | None:
        """The line a run prints where any were skipped; None where none was."""
        if self.count == 0:
            return None
        why = "; ".join(dict.fromkeys(self.reasons)) or "Inductor gave no reason"
        return (f"torch.compile skipped its CUDA graphs {self.count} time(s) ({why}): these steps ran "
                "Inductor's kernels without graph replay")


class _Reasons(logging.Handler):
    def __init__(self, skips: CudagraphSkips):
        super().__init__(logging.WARNING)
        self.skips = skips

    def emit(self, record: logging.LogRecord) -> None:
        self.skips.reasons.append(record.getMessage())


@contextlib.contextmanager
def watch_cudagraph_skips() -> Iterator[CudagraphSkips]:
    """The CUDA-graph skips of whatever torch.compile does inside; filled in when it exits."""
    from torch._dynamo.utils import counters

    skips = CudagraphSkips()
    logger, handler = logging.getLogger(SKIP_LOGGER), _Reasons(skips)
    before = counters["inductor"]["cudagraph_skips"]
    logger.addHandler(handler)
    try:
        yield skips
    finally:
        logger.removeHandler(handler)
        skips.count = counters["inductor"]["cudagraph_skips"] - before


class CompileBackend(Backend):
    """`torch.compile(fullgraph=True)`: Inductor kernels, wrapped in CUDA graphs on CUDA
    (`mode="reduce-overhead"`); Inductor's default mode on the CPU. Where reduce-overhead skips
    its graphs (a mutated input, a CPU tensor in the step, ...), it says so only in a log: the
    prepare report's notes say it instead."""

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
        with torch.inference_mode(), nvtx_range(f"compile[bs={max_batch}]"), watch_cudagraph_skips() as skips:
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
        seconds = time.perf_counter() - start
        return PrepareReport(seconds=seconds, notes=[note] if (note := skips.note()) else [])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with nvtx_range("decode_step[compile]"):
            return self.compiled(tokens, positions)
