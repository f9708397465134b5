"""Launch figures and the GPU idle split of one step, rule by rule, on steps written out here
with every figure computed by hand (all times in ns)."""

import random

import numpy
import pytest

from graphrt.trace.analysis.idle import KERNEL_WAIT_NS, idle_split, percentile, step_launch_idle
from graphrt.trace.analysis.timeline import Launch, StepTimeline, Work
from graphrt.trace.present.step_tables import format_launch_idle


def _step(work: list[tuple], launches: list[tuple] = (), unit: str = "kernel") -> StepTimeline:
    """A step from (start, end, launch index or None) per kernel and (kind, start, end) per call."""
    calls = [Launch("cudaGraphLaunch" if kind == "graph" else "cudaLaunchKernel", kind, start, end)
             for kind, start, end in launches]
    pieces = [Work(f"k{n}", start, end, launch, (), None) for n, (start, end, launch) in enumerate(work)]
    return StepTimeline("decode_step[eager]", "decode_step[eager]", 500, 90_000, unit,
                        sorted(pieces, key=lambda w: w.start_ns), calls)


def test_percentiles_are_linear_between_the_closest_ranks():
    # sorted 10 20 30 40: p50 at rank 1.5 -> 25; p90 at rank 2.7 -> 30 + 0.7 * 10
    assert percentile([40, 10, 30, 20], 50) == pytest.approx(25.0)
    assert percentile([40, 10, 30, 20], 90) == pytest.approx(37.0)
    assert percentile([7], 90) == 7.0 and percentile([], 50) is None
    rng = random.Random(0)
    for _ in range(50):
        values = [rng.randint(-5_000, 50_000) for _ in range(rng.randint(2, 40))]
        for q in (1, 10, 50, 51, 90, 99):
            assert percentile(values, q) == pytest.approx(numpy.percentile(values, q)), (values, q)


def test_a_step_counts_its_launches_their_cpu_time_and_one_delay_per_call():
    launches = [("kernel", 1_000, 3_000), ("kernel", 4_000, 5_000), ("graph", 6_000, 10_000),
                ("kernel", 11_000, 11_500)]
    work = [(3_500, 5_500, 0), (5_600, 6_000, 1),  # delays 500, 600
            (9_000, 9_500, 2), (9_600, 9_800, 2), (9_900, 10_500, 2),  # the graph's: one delay, -1000
            (11_900, 12_100, 3)]  # 400
    got = step_launch_idle(_step(work, launches))
    assert (got.step, got.start_ns) == ("decode_step[eager]", 500)
    assert (got.kernels, got.kernel_launches, got.graph_launches, got.graph_fanout) == (6, 3, 1, [3])
    assert got.launch_cpu_ns == 2_000 + 1_000 + 4_000 + 500
    # delays sorted -1000 400 500 600: p50 at rank 1.5, p90 at rank 2.7
    assert got.delay_p50_ns == pytest.approx(450.0)
    assert got.delay_p90_ns == pytest.approx(570.0)


def test_idle_is_counted_from_the_latest_kernel_end_not_the_last_started_kernels():
    # k1 runs inside k0 (another stream); the GPU is busy until k0 ends at 20_000
    split = idle_split(_step([(10_000, 20_000, 0), (12_000, 14_000, 0), (21_000, 22_000, 0)],
                             [("kernel", 0, 1_000)]))
    assert split == {"host_wait": 0, "kernel_wait": 1_000, "other": 0}


def test_a_gap_is_a_host_wait_only_when_the_launch_began_after_the_gpu_ran_out():
    launches = [("kernel", 0, 1_000), ("kernel", 25_000, 26_000), ("kernel", 30_000, 31_000)]
    # the GPU runs out at 20_000 and the next launch begins at 25_000: the whole gap waited on it
    late = idle_split(_step([(10_000, 20_000, 0), (32_000, 33_000, 1)], launches))
    assert late == {"host_wait": 12_000, "kernel_wait": 0, "other": 0}
    # the launch began the instant the GPU ran out (30_000): the GPU was not left waiting on it
    at_once = idle_split(_step([(10_000, 30_000, 0), (34_000, 35_000, 2)], launches))
    assert at_once == {"host_wait": 0, "kernel_wait": 0, "other": 4_000}


def test_kernel_wait_is_a_gap_under_the_threshold_after_an_earlier_launch():
    launches = [("kernel", 0, 1_000)] * 3
    step = _step([(10_000, 11_000, 0), (11_000 + KERNEL_WAIT_NS - 1, 15_000, 1), (15_000 + KERNEL_WAIT_NS, 19_000, 2)],
                 launches)
    assert idle_split(step) == {"host_wait": 0, "kernel_wait": KERNEL_WAIT_NS - 1, "other": KERNEL_WAIT_NS}
    # a threshold given to the step is the one its split uses
    wider = step_launch_idle(step, kernel_wait_ns=KERNEL_WAIT_NS + 1)
    assert wider.idle_ns == {"host_wait": 0, "kernel_wait": 2 * KERNEL_WAIT_NS - 1, "other": 0}
    assert wider.idle_total_ns == 2 * KERNEL_WAIT_NS - 1


def test_gaps_of_other_causes_add_up_and_a_kernel_without_a_launch_call_is_one():
    # the middle kernel's launch call is not in the step (launch None): it cannot be a host wait
    step = _step([(10_000, 11_000, 0), (20_000, 21_000, None), (30_000, 31_000, 0)], [("kernel", 0, 1_000)])
    assert idle_split(step) == {"host_wait": 0, "kernel_wait": 0, "other": 9_000 + 9_000}


def test_a_step_of_cpu_ops_has_no_kernels_and_no_gpu_idle():
    ops = _step([(1_000, 2_000, None), (10_000, 12_000, None)], unit="op")
    got = step_launch_idle(ops)
    assert (got.kernels, got.kernel_launches, got.launch_cpu_ns) == (0, 0, 0)
    assert got.idle_ns == {"host_wait": 0, "kernel_wait": 0, "other": 0}
    assert (got.delay_p50_ns, got.delay_p90_ns) == (None, None)


def _launch_idle_row(text: str, title: str) -> list[str]:
    """The cells of the row `title` of format_launch_idle's table, after its title."""
    line = next(line for line in text.splitlines() if line.startswith(title))
    return line[len(title):].split()


def test_a_group_median_over_a_step_whose_launch_delay_is_unknown_is_unknown_too():
    # both steps ran kernels; the second's kernel has no launch call in the trace, so the step has
    # no launch delay to tell: the group's median is not the first step's alone
    told = step_launch_idle(_step([(3_500, 5_500, 0)], [("kernel", 1_000, 3_000)]))
    untold = step_launch_idle(_step([(3_500, 5_500, None)]))
    assert (told.delay_p50_ns, untold.delay_p50_ns) == (500.0, None)
    assert _launch_idle_row(format_launch_idle([told, told]), "launch delay p50 µs") == ["0.5"]
    assert _launch_idle_row(format_launch_idle([told, untold]), "launch delay p50 µs") == ["-"]
    assert _launch_idle_row(format_launch_idle([told, untold]), "launch delay p90 µs") == ["-"]
    # a figure every step tells stays the median of them all
    assert _launch_idle_row(format_launch_idle([told, untold]), "launch CPU time µs") == ["1.0"]
