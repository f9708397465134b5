"""What the machine is: device, versions, and (for the roofline) the device's peaks."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphrt.measure import host
from graphrt.quantiles import median
from graphrt.units import MISSING


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else host.cpu_name()


def describe(device: torch.device) -> dict:
    """Facts that make a result comparable with another machine's."""
    facts = host.describe(device.type, device_name(device), torch.cuda.is_available())
    if device.type == "cpu":
        facts["torch_threads"] = torch.get_num_threads()
    return facts


@dataclass(frozen=True)
class Memory:
    """A device's memory: its total and what is free now (None where the machine cannot say)."""

    total: int | None
    free: int | None


def memory(device: torch.device) -> Memory:
    """The GPU's memory on CUDA; on the CPU, the machine's (what Linux counts as available)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return Memory(total, free)
    return Memory(host.meminfo("MemTotal"), host.meminfo("MemAvailable"))


# --- peaks and measured throughput, for the roofline ---------------------------------------


@dataclass(frozen=True)
class Peak:
    """A device's datasheet peaks: HBM bandwidth and dense (no 2:4 sparsity) bf16 tensor math."""

    name: str
    bandwidth: float  # bytes/s
    bf16_flops: float  # FLOP/s
    source: str


# Matched against `torch.cuda.get_device_name`, first match wins. Only the SXM parts: PCIe and
# NVL boards of the same chip have other clocks and memory (H100 PCIe: 2.0 TB/s, 756 TFLOP/s),
# and a figure for the wrong board is worse than none. Word boundaries keep GH200/GB200 out.
PEAKS: tuple[tuple[re.Pattern[str], Peak], ...] = (
    # NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM, HBM2e 2,039 GB/s; BF16 tensor
    # 312 TFLOPS dense (624 with sparsity).
    (re.compile(r"\bA100-SXM4-80GB\b"),
     Peak("A100 SXM4 80GB", 2.039e12, 312e12, "NVIDIA A100 datasheet")),
    # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM, HBM3 3.35 TB/s; BF16 tensor 1,979 TFLOPS
    # with sparsity, so 989.5 dense. The SXM5 board names itself "NVIDIA H100 80GB HBM3".
    (re.compile(r"\bH100\b(?!.*\b(PCIe|NVL)\b).*(\bSXM|\bHBM3\b)"),
     Peak("H100 SXM", 3.35e12, 989.5e12, "NVIDIA H100 datasheet")),
    # NVIDIA H200 Tensor Core GPU datasheet: H200 SXM, HBM3e 4.8 TB/s; BF16 tensor 1,979 TFLOPS
    # with sparsity, so 989.5 dense (the same Hopper chip as H100, more and faster memory).
    (re.compile(r"\bH200\b(?!.*\bNVL\b)"),
     Peak("H200 SXM", 4.8e12, 989.5e12, "NVIDIA H200 datasheet")),
    # NVIDIA HGX B200 specifications (1,000 W): HBM3e 8 TB/s per GPU; BF16 tensor 4.5 PFLOPS
    # with sparsity, so 2.25 dense.
    (re.compile(r"\bB200\b"),
     Peak("B200 (HGX)", 8.0e12, 2250e12, "NVIDIA HGX B200 specifications")),
)


def peak_for(name: str) -> Peak | None:
    """The datasheet peaks of the device called `name`, or None where the table has none."""
    for pattern, peak in PEAKS:
        if pattern.search(name):
            return peak
    return None


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of `fn()` after one warmup call; CUDA events on CUDA."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return median(samples)


def measure_copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 7) -> float:
    """Bytes/s of a large device-to-device copy, counting the bytes read and the bytes written.

    The buffer (1 GiB on CUDA, 256 MiB elsewhere) is far larger than any cache, so this is what
    memory sustains for a plain stream: an achievable ceiling, a little below the datasheet.
    """
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * nbytes / seconds


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int | None = None,
                         repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs) in `dtype`: n 8192 on CUDA, 1024 elsewhere."""
    n = n or (8192 if device.type == "cuda" else 1024)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    seconds = _median_seconds(lambda: a @ b, device, repeats)
    return 2 * n**3 / seconds


def measure(device: torch.device, dtype: torch.dtype) -> dict:
    """Measured copy bandwidth and matmul throughput, and the datasheet peaks where known."""
    peak = peak_for(device_name(device)) if device.type == "cuda" else None
    return {
        "copy_bandwidth": measure_copy_bandwidth(device),
        "matmul_flops": measure_matmul_flops(device, dtype),
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "peak": None if peak is None else {"name": peak.name, "bandwidth": peak.bandwidth,
                                           "bf16_flops": peak.bf16_flops, "source": peak.source},
    }


def rate(value: float, unit: str) -> str:
    """13.4e9, "FLOP/s" -> "13.4 GFLOP/s": three significant digits and an SI prefix."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def measured_facts(measured: dict) -> dict[str, str]:
    """`measure`'s figures as table rows for `graphrt info --measure`."""
    facts = {
        "copy bandwidth": f"{rate(measured['copy_bandwidth'], 'B/s')} (read + written, median)",
        "matmul": f"{rate(measured['matmul_flops'], 'FLOP/s')} ({measured['matmul_dtype']}, median)",
    }
    peak = measured["peak"]
    facts["datasheet peak"] = MISSING if peak is None else (
        f"{peak['name']}: {rate(peak['bandwidth'], 'B/s')}, {rate(peak['bf16_flops'], 'FLOP/s')} "
        f"dense bf16 ({peak['source']})")
    return facts
