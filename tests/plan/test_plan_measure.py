"""How the plan measures its sizes: every size steps once before anything is measured, then the
sizes are timed in rounds; a measuring the device cannot hold is refused before it starts, with
what it would have taken."""

from __future__ import annotations

import pytest
import torch

from graphrt.plan import fit as plan_fit, measure_sizes
from graphrt.plan.measure_sizes import FIRST_STEP
from graphrt.errors import GraphrtError
from graphrt.measure import nvtx
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

TINY = PRESETS["tiny"]


def test_every_size_steps_once_before_the_first_capture_then_all_are_timed_in_rounds():
    # a size's first step pays for the process's first use of its shapes (cuBLAS handle,
    # lazily loaded kernels): it runs before any capture or timing, so no size's figures depend
    # on the order sizes are measured in
    model = build_model(TINY, torch.device("cpu"), torch.float32, seed=0)
    heard = []
    with nvtx.record_to([]) as events:
        figures = measure_sizes.measure(model, (1, 2, 3), steps=4, warmup=1, prompt_len=4, rounds=2,
                                        on_measure=lambda done, total, label: heard.append((done, total, label)))
    pushes = [name for kind, name in events if kind == "push"]
    first_capture = next(i for i, name in enumerate(pushes) if name.startswith("capture["))
    assert [pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3)] == sorted(
        pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3))
    assert max(pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3)) < first_capture
    assert pushes.index("prefill") > first_capture  # the timed decodes come after
    # and progress is heard from the first size on, each part once, in order
    # (3 first steps, the captures, 2 rounds and up to 2 extra ones)
    assert heard[0] == (0, 8, "first step of batch 1")
    assert heard[4] == (4, 8, "round 1 of 2")
    assert [done for done, _, _ in heard] == list(range(len(heard)))
    # every size was timed in each round, both modes
    assert all(len(f.eager_rounds_ms) >= 2 and len(f.graph_rounds_ms) >= 2 for f in figures.values())


def test_the_memory_a_measuring_needs_counts_parameters_cache_each_graphs_logits_and_the_largest_prefill():
    fit = plan_fit.fit(TINY, (1, 2, 4), prompt_len=16, steps=8, itemsize=4, free=None, where="here")
    c = TINY
    assert fit.parameters == c.num_parameters() * 4
    assert fit.cache == 2 * c.num_hidden_layers * 4 * 24 * c.num_key_value_heads * c.head_dim * 4
    assert fit.outputs == (1 + 2 + 4) * c.vocab_size * 4
    assert fit.prefill == 4 * 16 * c.vocab_size * 4
    assert fit.needed == fit.parameters + fit.cache + fit.outputs + fit.prefill
    fit.check()  # free memory unknown: nothing to refuse on


def test_a_measuring_that_needs_more_than_the_device_has_free_is_refused_in_one_line():
    # as a new user's traffic with a largest batch of 100,000, planned for tiny on a CPU
    sizes = measure_sizes.grid(100_000, "auto")
    fit = plan_fit.fit(TINY, sizes, prompt_len=16, steps=16, itemsize=4, free=16 << 30, where="this machine")
    assert fit.describe().startswith(f"plan: measuring {len(sizes):,} sizes of 1..100,000, each eager and replayed; "
                                     "at least ")
    with pytest.raises(GraphrtError) as refused:
        fit.check()
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"plan: measuring {len(sizes):,} sizes of 1..100,000 needs at least ")
    assert "this machine has 16.0 GiB free" in said
    plan_fit.fit(TINY, sizes[:8], prompt_len=16, steps=16, itemsize=4, free=16 << 30, where="here").check()


def test_what_a_measuring_takes_is_said_part_by_part_with_the_free_memory_or_that_it_is_unknown():
    fit = plan_fit.Fit((1, 2, 4), parameters=3 << 30, cache=12 << 20, outputs=1010 << 20, prefill=512 << 10,
                       free=80 << 30, where="NVIDIA H100 80GB HBM3")
    assert fit.describe() == (
        "plan: measuring 3 sizes of 1..4, each eager and replayed; at least 4.0 GiB (parameters 3.0 GiB, "
        "KV cache 12.0 MiB, graphs' logits 1,010.0 MiB, largest prefill's logits 512.0 KiB); "
        "80.0 GiB free on NVIDIA H100 80GB HBM3")
    unknown = plan_fit.Fit((1,), parameters=1 << 20, cache=0, outputs=0, prefill=0, free=None, where="here")
    assert unknown.describe().endswith("; free memory unknown")


def test_plan_refuses_such_a_traffic_before_loading_anything_and_says_what_it_would_measure(cli, tmp_path):
    traffic = tmp_path / "traffic.json"
    traffic.write_text('{"1": 10, "100000": 1}')
    result = cli("plan", "--model", "tiny", "--device", "cpu", "--traffic", traffic)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    # the powers of two it is set against run 100,000 as 131,072: the largest size measured
    assert lines[0].startswith("plan: measuring ") and "sizes of 1..131,072" in lines[0]
    assert lines[-1].startswith("error: plan: measuring ") and "free: plan for a smaller largest batch" in lines[-1]
    assert "Traceback" not in result.stderr
