"""`graphrt.testing`: a user's own step, checked for replaying like eager, in their own tests.

The README's example is run as written; broken steps fail with the finding or the first step
that differs; the comparison honours the tolerance it is given.
"""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from graphrt.config import PRESETS
from graphrt.testing import assert_replays_like_eager, compare_replay, first_difference
from graphrt.weights import build_model

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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_readme_decoder_replays_a_cuda_graph_like_eager():
    model = readme_decoder()().cuda().eval()
    result = assert_replays_like_eager(model, (torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda")),
                                       steps=16, next_inputs=next_token)
    assert result.matches


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_frozen_python_position_diverges_under_a_cuda_graph():
    result = compare_replay(PythonPositionDecoder().cuda().eval(), (torch.tensor([1], device="cuda"), 0),
                            steps=8, next_inputs=next_token)
    assert result.divergence.startswith("step 1: ")
