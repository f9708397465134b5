"""`graphrt.testing`: a user's own step, checked for replaying like eager, in their own tests.

The README's example is run as written; broken steps fail with the finding or the first step
that differs; the comparison honours the tolerance it is given.
"""

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from toy_modules import CountsCalls

from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.testing import (ReplayComparison, assert_lint_clean, assert_replays_like_eager, compare_replay,
                             first_difference)

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Check your own step", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written_and_passes():
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    namespace["test_decoder_replays_like_eager"]()  # raises AssertionError if it fails


def readme_decoder() -> type:
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    return namespace["Decoder"]


class PythonPositionDecoder(nn.Module):
    """The README's decoder with the position kept as a Python int: what a graph freezes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(100, 32), nn.Linear(32, 100)
        self.register_buffer("cache", torch.zeros(64, 32))

    def forward(self, token, position: int):
        self.cache[position] = self.embed(token)[0]
        return self.head(self.cache.cumsum(0)[position : position + 1])


def next_token(logits, token, position):
    return logits.argmax(-1), position + 1


def test_a_frozen_python_position_fails_with_the_lint_finding():
    with pytest.raises(AssertionError, match=r"aten\.select\.int in \(PythonPositionDecoder\): "
                                             r"argument index is 0 in capture 1 and 1 in capture 2"):
        assert_replays_like_eager(PythonPositionDecoder().eval(), (torch.tensor([1]), 0), steps=8,
                                  next_inputs=next_token)


def test_without_the_lint_the_first_diverging_step_is_reported():
    # Step 0 replays what was captured, so it matches; step 1's replay still writes slot 0.
    result = compare_replay(PythonPositionDecoder().eval(), (torch.tensor([1]), 0), steps=8,
                            next_inputs=next_token)
    assert not result.matches
    assert result.divergence.startswith("step 1: ")


def test_a_clean_step_replays_bitwise():
    result = compare_replay(readme_decoder()().eval(), (torch.tensor([1]), torch.tensor([0])),
                            steps=12, next_inputs=next_token)
    assert result.matches and result.max_abs_diff == 0.0


class RunningSum(nn.Module):
    """Carries state from step to step in a buffer, which a graph replays correctly."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


def test_the_graph_starts_from_the_state_the_eager_run_started_from():
    # Eager, warmup and the tape's capture each add to the total; each is undone, or the
    # replayed sums would start where they left off.
    model = RunningSum()
    assert compare_replay(model, (torch.ones(3),), steps=5).matches
    assert torch.equal(model.total, torch.full((3,), 5.0))  # the graph run's five steps stay


def test_graphrt_own_step_replays_like_eager():
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, seed=0)
    model.setup_cache(2, 16)
    tokens, positions = torch.tensor([[3], [5]]), torch.tensor([0, 0])
    with torch.inference_mode():
        result = assert_replays_like_eager(
            model.decode_step, (tokens, positions), steps=10,
            next_inputs=lambda logits, tokens, positions: (logits.argmax(-1, keepdim=True), positions + 1))
    assert result.steps == 10


def test_first_difference_honours_the_stated_tolerance():
    eager = (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4]))
    close = (torch.tensor([1.0, 2.001, 3.0]), torch.tensor([4]))
    assert first_difference(eager, close, atol=1e-2)[0] is None
    assert first_difference(eager, close, rtol=1e-3)[0] is None  # 0.001 <= 1e-3 * 2.0
    differs, largest = first_difference(eager, close, atol=1e-4)
    assert differs.startswith("output 0 at (1,) is 2.001, eager's 2") and largest == pytest.approx(1e-3, rel=1e-3)
    assert first_difference(eager, (close[0], torch.tensor([5])), atol=1)[0] == "output 1 at (0,) is 5, eager's 4"
    assert "nan" in first_difference(eager, (torch.tensor([1.0, float("nan"), 3.0]), eager[1]), atol=1)[0]


def test_a_step_given_as_a_function_is_linted_against_the_model_it_is_told_about():
    # A function has no module of its own: `model=` is what names the module in a finding.
    decoder = PythonPositionDecoder().eval()
    with pytest.raises(AssertionError, match=re.escape(
            "aten.select.int in (PythonPositionDecoder): argument index is 0 in capture 1 and 1 in capture 2")):
        assert_lint_clean(lambda token, position: decoder(token, position),
                          [(torch.tensor([1]), 0), (torch.tensor([2]), 1)], model=decoder)


class LazyScale(nn.Module):
    """Sets a Python attribute on its first call only: lint-clean, since a graph is captured
    after warmup, but a change to the model all the same."""

    def __init__(self):
        super().__init__()
        self.scale = None

    def forward(self, x):
        if self.scale is None:
            self.scale = 0.5
        return x * self.scale


@pytest.mark.parametrize("as_function", [False, True], ids=["module", "function-with-model"])
def test_the_check_leaves_the_model_attributes_as_it_found_them(as_function):
    # The lint's first call, the eager run, the warmup and the capture all set `scale`; each is
    # undone, and a replay runs no Python, so the model ends as it started.
    model = LazyScale()
    step, kwargs = (lambda x: model(x), {"model": model}) if as_function else (model, {})
    result = assert_replays_like_eager(step, torch.ones(2), next_inputs=lambda out, x: out, **kwargs)
    assert result == ReplayComparison(steps=8, divergence=None, max_abs_diff=0.0)
    assert model.scale is None


@pytest.mark.parametrize("as_function", [False, True], ids=["module", "function-with-model"])
def test_a_python_value_the_step_returns_is_frozen_by_the_graph(as_function):
    # The capture saw calls == 1 (the eager run and warmup before it were undone), so every
    # replay returns 1; the tensor output matches throughout.
    model = CountsCalls()
    step, kwargs = (lambda x: model(x), {"model": model}) if as_function else (model, {})
    result = compare_replay(step, torch.ones(2), steps=3, **kwargs)
    assert result == ReplayComparison(steps=3, divergence="step 1: output 1 is 1, eager's 2", max_abs_diff=0.0)
    assert model.calls == 0


@pytest.mark.parametrize("check", [compare_replay, assert_replays_like_eager])
def test_a_bare_tensor_input_is_given_again_to_each_of_the_default_eight_steps(check):
    # A lone tensor needs no tuple; with no `next_inputs` every step gets it again.
    model = RunningSum()
    assert check(model, torch.ones(3)) == ReplayComparison(steps=8, divergence=None, max_abs_diff=0.0)
    assert torch.equal(model.total, torch.full((3,), 8.0))  # the graph run's eight steps stay


class CacheWriter(nn.Module):
    """Writes each value into its cache at a Python position and returns the cache itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))

    def forward(self, value, position: int):
        self.cache[position] = value
        return self.cache


def test_a_step_returning_its_cache_is_compared_with_the_cache_eager_returned_at_that_step():
    # Eager returns the same buffer every step, and its writes to it are undone before the
    # replays: each step's output is kept as a copy, or the replay, which writes the frozen
    # slot 0, would be compared with itself.
    value = torch.tensor(1.0)
    result = compare_replay(CacheWriter(), (value, 0), steps=3,
                            next_inputs=lambda cache, value, position: (value + 1, position + 1))
    assert result == ReplayComparison(
        steps=3, divergence="step 1: the output at (1,) is 0, eager's 2 (|Δ| 2 > atol 0 + rtol 0 × |eager|)",
        max_abs_diff=0.0)
    assert value.item() == 1.0  # the step is fed through copies: the caller's input is never written


def scaled(x, scale: float):
    return x * scale


def raise_scale(out, x, scale):
    return x, scale + 0.01


FROZEN_SCALE = "step 1: the output at (0,) is 1, eager's 1.01 (|Δ| 0.01 > atol 0 + rtol 0 × |eager|)"


def test_without_a_tolerance_a_frozen_python_float_fails_at_the_first_step_it_changes():
    # The graph keeps the scale it was captured with (1.0); eager's grows by 0.01 a step.
    assert compare_replay(scaled, (torch.ones(1), 1.0), steps=3, next_inputs=raise_scale) == ReplayComparison(
        steps=3, divergence=FROZEN_SCALE, max_abs_diff=0.0)
    with pytest.raises(AssertionError) as failure:
        assert_replays_like_eager(scaled, (torch.ones(1), 1.0), steps=3, next_inputs=raise_scale, lint=False)
    # A plain function has no modules: what differs is its own code.
    assert str(failure.value) == (
        f"replay differs from eager: {FROZEN_SCALE}\n"
        "localized: the step's own code outside any module: output of the step differs (step 1, "
        "row 0, max |Δ| 0.01 > 0 (exact)) while everything before it matched "
        "(probes: 2 copies, 8 B per step)")  # input 0 and the output, a float each


@pytest.mark.parametrize("tolerance", [{"atol": 0.05}, {"rtol": 0.05}], ids=["atol", "rtol"])
def test_a_difference_within_the_stated_tolerance_passes(tolerance):
    # Over three steps the frozen scale is off by at most 0.02 (at |eager| 1.02).
    result = compare_replay(scaled, (torch.ones(1), 1.0), steps=3, next_inputs=raise_scale, **tolerance)
    assert result.matches and result.max_abs_diff == pytest.approx(0.02, rel=1e-3)
    assert assert_replays_like_eager(scaled, (torch.ones(1), 1.0), steps=3, next_inputs=raise_scale, lint=False,
                                     **tolerance).matches


def shifted(x, shift: float):
    return x + shift


def test_a_tolerated_difference_fed_back_as_an_input_fails_as_an_input_difference():
    # Each output becomes the next input. Step 1's output is within atol; fed back, it makes
    # step 2's inputs differ from eager's, and inputs must match exactly whatever the tolerance.
    result = compare_replay(shifted, (torch.zeros(1), 0.1), steps=4, atol=0.015,
                            next_inputs=lambda out, x, shift: (out, shift + 0.01))
    assert result.steps == 4 and result.max_abs_diff == pytest.approx(0.01, rel=1e-3)
    assert result.divergence == ("step 2: its inputs differ from eager's "
                                 "(input 0 at (0,) is 0.2, eager's 0.21 (|Δ| 0.01 > atol 0 + rtol 0 × |eager|))")


@pytest.mark.parametrize("eager, other, expected", [
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]),
     ("the output at (1,) is 2.5, eager's 2 (|Δ| 0.5 > atol 0 + rtol 0 × |eager|)", 0.5)),
    (torch.zeros(3), torch.zeros(2), ("the output is torch.float32 [2], eager's torch.float32 [3]", 0.0)),
    (torch.zeros(3), torch.zeros(3, dtype=torch.float64),
     ("the output is torch.float64 [3], eager's torch.float32 [3]", 0.0)),
    ((3, torch.tensor([4]), torch.tensor([1.0])), (3, torch.tensor([4]), torch.tensor([2.0])),
     ("output 2 at (0,) is 2, eager's 1 (|Δ| 1 > atol 0 + rtol 0 × |eager|)", 1.0)),
    (torch.zeros(0, 4), torch.zeros(0, 4), (None, 0.0)),
], ids=["single-output", "shape", "dtype", "past-equal-leaves", "empty"])
def test_first_difference_says_where_and_how_the_outputs_differ(eager, other, expected):
    # Without a tolerance, floats must match bitwise; a lone output is "the output".
    assert first_difference(eager, other) == expected


def test_a_nan_is_the_worst_difference_in_an_output():
    # An output's worst element is reported, and a NaN is worse than any finite difference.
    differs, _ = first_difference(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.5, 2.0, float("nan")]))
    assert differs == "the output at (2,) is nan, eager's 3 (|Δ| nan > atol 0 + rtol 0 × |eager|)"


def test_a_different_structure_is_reported_before_any_value():
    differs, largest = first_difference((torch.ones(1),), (torch.ones(1), torch.full((1,), 5.0)))
    assert differs.startswith("the output's structure is ")
    assert largest == 0.0  # no values were compared


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_readme_decoder_replays_a_cuda_graph_like_eager():
    model = readme_decoder()().cuda().eval()
    # fp32 on CUDA within a stated tolerance: the graph's kernels were captured on a side stream,
    # and cuBLAS promises the same bits only for one stream and configuration
    result = assert_replays_like_eager(model, (torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda")),
                                       steps=16, next_inputs=next_token, atol=1e-5, rtol=1e-5)
    assert result.matches


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_frozen_python_position_diverges_under_a_cuda_graph():
    result = compare_replay(PythonPositionDecoder().cuda().eval(), (torch.tensor([1], device="cuda"), 0),
                            steps=8, next_inputs=next_token)
    assert result.divergence.startswith("step 1: ")


def test_the_step_is_run_once_eagerly_twice_to_warm_up_and_once_to_capture_and_replays_run_no_python():
    calls = []

    def step(x):
        calls.append(len(calls))  # Python: runs only when the step is called
        return x * 2

    assert compare_replay(step, torch.ones(2), steps=1).matches
    assert len(calls) == 1 + 2 + 1
