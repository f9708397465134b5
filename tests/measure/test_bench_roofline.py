"""The roofline's byte and FLOP counts against the model itself, and the device ceilings."""

import time
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from graphrt.measure import hardware
from graphrt.measure.roofline import Ceilings, StepCost, ceilings, roofline, step_cost
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

CPU = torch.device("cpu")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, seq_len", [(1, 24), (3, 40)])
def test_bytes_and_flops_match_the_built_model(family_config, dtype, rows, seq_len):
    model = build_model(family_config, CPU, dtype)
    model.setup_cache(4, seq_len)  # more rows than the step computes: only `rows` are read
    cost = step_cost(family_config, rows, seq_len, dtype.itemsize)

    table, head = model.model.embed_tokens.weight, model.lm_head.weight
    rest = sum(nbytes(p) for p in model.parameters() if p is not table and p is not head)
    lookup = nbytes(table[:rows])  # the embedding reads one row per sequence
    assert cost.weight_bytes == rest + nbytes(head) + lookup  # a tied matrix: read once, by lm_head
    caches = [layer.self_attn.cache for layer in model.model.layers]
    assert cost.kv_read_bytes == sum(nbytes(c.k[:rows]) + nbytes(c.v[:rows]) for c in caches)
    assert cost.kv_write_bytes == sum(nbytes(c.k[:rows, :, 0]) + nbytes(c.v[:rows, :, 0]) for c in caches)

    # torch's counter knows the CUDA attention kernels only: teach it the CPU one, by its own formula
    cpu_attention = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                     lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)}
    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention)
    with counter, torch.inference_mode():
        model.decode_step(torch.zeros(rows, 1, dtype=torch.long), torch.full((rows,), 5))
    assert cost.flops == counter.get_total_flops()
    assert cost.lm_head_flops == sum(counter.get_flop_counts()["Qwen2ForCausalLM.lm_head"].values())


def test_the_bytes_a_step_moves_are_its_weights_its_cache_reads_and_its_cache_writes_together(tiny_config):
    # every term non-zero at once, each worked out from the built model's own tensors, so a total
    # that leaves one out is off by that term
    rows, seq_len, dtype = 2, 16, torch.bfloat16
    model = build_model(tiny_config, CPU, dtype)
    model.setup_cache(rows, seq_len)
    table, head = model.model.embed_tokens.weight, model.lm_head.weight
    weights = (sum(nbytes(p) for p in model.parameters() if p is not table and p is not head)
               + nbytes(head) + nbytes(table[:rows]))  # the lm_head's matrix, and one row per sequence
    caches = [layer.self_attn.cache for layer in model.model.layers]
    reads = sum(nbytes(c.k) + nbytes(c.v) for c in caches)
    writes = sum(nbytes(c.k[:, :, 0]) + nbytes(c.v[:, :, 0]) for c in caches)
    assert min(weights, reads, writes) > 0
    cost = step_cost(tiny_config, rows, seq_len, dtype.itemsize)
    assert cost.bytes == weights + reads + writes
    limits = Ceilings(bandwidth=1e12, flops=1e14, bandwidth_source="x", flops_source="y")
    assert roofline(cost, 1e-3, limits).achieved_bandwidth == pytest.approx((weights + reads + writes) / 1e-3)


def test_the_static_cache_is_read_in_full_whatever_the_position():
    config = PRESETS["qwen2-0.5b"]
    short, long = step_cost(config, 1, 128, 2), step_cost(config, 1, 8192, 2)
    assert long.kv_read_bytes == 64 * short.kv_read_bytes
    assert long.weight_bytes == short.weight_bytes
    # 0.5B: about 494M parameters in bf16, about 1 GB a step; at batch 1 about 1 FLOP per byte
    assert 0.98e9 < short.weight_bytes < 1.0e9
    assert 0.9 < short.intensity < 1.1


def test_a_step_at_the_bandwidth_limit_is_memory_bound_at_full_share():
    cost = StepCost(weight_bytes=10**9, kv_read_bytes=0, kv_write_bytes=0,
                    linear_flops=10**9, attention_flops=0, lm_head_flops=0)
    limits = Ceilings(bandwidth=1e12, flops=1e14, bandwidth_source="x", flops_source="y")
    r = roofline(cost, step_seconds=1e-3, limits=limits)
    assert (r.intensity, r.ridge, r.bound) == (1.0, 100.0, "memory")
    assert r.bandwidth_share == pytest.approx(1.0) and r.flops_share == pytest.approx(0.01)
    busy = replace(cost, linear_flops=10**12)  # 1000 FLOP/byte, past the ridge
    assert roofline(busy, 1e-2, limits).bound == "compute"


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
    ("NVIDIA A100-SXM4-40GB", None),
    ("NVIDIA A100 80GB PCIe", None),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA B200", "B200 (HGX)"),
    ("NVIDIA GB200", None),
])
def test_peak_table_matches_only_the_boards_it_describes(name, expected):
    peak = hardware.peak_for(name)
    assert (peak and peak.name) == expected


def test_ceilings_prefer_the_datasheet_and_fall_back_to_what_was_measured():
    h200 = hardware.peak_for("NVIDIA H200")
    measured = {"copy_bandwidth": 4.0e12, "matmul_flops": 7.0e14, "matmul_dtype": "bfloat16",
                "peak": {"name": h200.name, "bandwidth": h200.bandwidth,
                         "bf16_flops": h200.bf16_flops, "source": h200.source}}
    bf16 = ceilings(torch.bfloat16, measured)
    assert (bf16.bandwidth, bf16.flops) == (4.8e12, 989.5e12)
    assert bf16.ridge == pytest.approx(206.1, abs=0.1)
    fp32 = ceilings(torch.float32, {**measured, "matmul_dtype": "float32"})
    assert (fp32.bandwidth, fp32.flops, fp32.flops_source) == (4.8e12, 7.0e14, "measured float32 matmul")
    cpu = ceilings(torch.float32, {**measured, "peak": None})
    assert (cpu.bandwidth, cpu.bandwidth_source) == (4.0e12, "measured copy")
    # each ceiling names where it comes from
    assert (bf16.bandwidth_source, bf16.flops_source) == ("datasheet H200 SXM", "datasheet H200 SXM")
    assert fp32.bandwidth_source == "datasheet H200 SXM"
    assert (cpu.flops, cpu.flops_source) == (7.0e14, "measured bfloat16 matmul")


def test_the_roofline_carries_what_was_achieved_and_the_sources():
    cost = StepCost(weight_bytes=2 * 10**9, kv_read_bytes=0, kv_write_bytes=0,
                    linear_flops=3 * 10**9, attention_flops=0, lm_head_flops=0)
    limits = Ceilings(bandwidth=4e12, flops=1e14, bandwidth_source="datasheet X", flops_source="measured Y")
    r = roofline(cost, step_seconds=1e-3, limits=limits)
    assert (r.bytes, r.flops, r.achieved_bandwidth, r.achieved_flops) == (2 * 10**9, 3 * 10**9, 2e12, 3e12)
    assert (r.bandwidth_share, r.flops_share) == (pytest.approx(0.5), pytest.approx(0.03))
    assert (r.bandwidth_source, r.flops_source) == ("datasheet X", "measured Y")
    assert r.to_dict()["achieved_flops"] == 3e12


def test_copy_bandwidth_counts_bytes_read_and_written_and_matmul_2n3_flops(monkeypatch):
    # with each timed call taking a known half second, the rates are the work counted / 0.5 s
    def half_a_second(fn, device, repeats):
        fn()  # the real copy or matmul still runs
        return 0.5

    monkeypatch.setattr(hardware, "_median_seconds", half_a_second)
    assert hardware.measure_copy_bandwidth(CPU, nbytes=1 << 20, repeats=1) == 2 * (1 << 20) / 0.5
    assert hardware.measure_matmul_flops(CPU, torch.float32, n=64, repeats=1) == 2 * 64**3 / 0.5


def test_timings_are_the_median_after_one_untimed_call():
    durations = iter([0.3, 0.01, 0.2, 0.05])  # the first call warms up and is not timed
    median = hardware._median_seconds(lambda: time.sleep(next(durations)), CPU, repeats=3)
    assert 0.05 <= median < 0.2  # sleep never returns early; a busy machine makes it late


def test_info_measure_adds_the_measured_rows(cli):
    result = cli("info", "--measure")
    assert result.exit_code == 0, result.output
    rows = {line.split("  ")[0]: line for line in result.stdout.splitlines()}
    assert "B/s (read + written, median)" in rows["copy bandwidth"]
    assert "FLOP/s (float32, median)" in rows["matmul"]
    assert rows["datasheet peak"].split()[-1] == "-"  # no table entry for a CPU
