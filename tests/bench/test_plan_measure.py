"""How the plan measures its sizes: every size steps once before anything is measured."""

from __future__ import annotations

import torch

from graphrt.bench import measure_sizes
from graphrt.bench.measure_sizes import FIRST_STEP
from graphrt.measure import nvtx
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

TINY = PRESETS["tiny"]


def test_every_size_steps_once_before_the_first_capture_is_timed():
    # a size's first step pays for the process's first use of its shapes (cuBLAS handle,
    # lazily loaded kernels): it runs before any capture or timing, so no size's figures depend
    # on the order sizes are measured in
    model = build_model(TINY, torch.device("cpu"), torch.float32, seed=0)
    heard = []
    with nvtx.record_to([]) as events:
        measure_sizes.measure(model, (1, 2, 3), steps=4, warmup=1, prompt_len=4,
                              on_measure=lambda done, total, label: heard.append((done, total, label)))
    pushes = [name for kind, name in events if kind == "push"]
    first_capture = next(i for i, name in enumerate(pushes) if name.startswith("capture["))
    assert [pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3)] == sorted(
        pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3))
    assert max(pushes.index(FIRST_STEP.format(bs)) for bs in (1, 2, 3)) < first_capture
    assert pushes.index("prefill") > first_capture  # the timed decodes come after
    # and progress is heard from the first size on, each part once, in order
    assert heard[0] == (0, 7, "first step of batch 1")
    assert [done for done, _, _ in heard] == list(range(7))
