"""The graph backend lints the decode step before it captures: a step a graph would replay
wrongly stops with the finding, unless the lint is switched off; its cost is reported."""

import json
import re

import pytest
import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.graphs import GraphCaptureError
from graphrt.model.config import PRESETS
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.weights import random_init
from graphrt.run.decode import decode, random_prompt


class CountingQwen2(Qwen2ForCausalLM):
    """Counts its decode position in Python instead of reading the positions tensor."""

    position = 15

    def decode_step(self, tokens, positions):
        self.position += 1
        return super().decode_step(tokens, torch.full_like(positions, self.position))


def counting_model() -> CountingQwen2:
    model = CountingQwen2(PRESETS["tiny"])
    random_init(model, seed=0)
    model.eval().requires_grad_(False)
    model.setup_cache(1, 32)
    return model


def test_a_python_position_stops_the_capture_naming_op_and_values():
    with pytest.raises(GraphCaptureError) as info:
        GraphBackend(counting_model()).prepare(1)
    # one line for the refusal, then one indented line per finding
    assert str(info.value).splitlines() == [
        "the decode step would not replay like eager (2 lint findings; --no-lint captures anyway):",
        "  position: attribute position changed during the step (None -> 16): a replay runs no "
        "Python, so it never changes again (and ops that read it replay the captured value)",
        "  aten.full_like.default in the step, outside any module: argument fill_value is 16 in "
        "capture 1 and 17 in capture 2: a Python value read at capture; replay uses 16 forever; "
        "pass it in a static input tensor",
    ]


def test_without_the_lint_the_same_step_captures_and_replays_wrong():
    model = counting_model()
    backend = GraphBackend(model, lint=False)
    report = backend.prepare(1)
    assert report.lint_seconds is None
    prompt = random_prompt(1, 6, model.config.vocab_size, seed=0)
    model.position = 15
    eager = decode(EagerBackend(model), prompt, steps=6)
    graph = decode(backend, prompt, steps=6)
    # what the lint said: the replay keeps the captured position, eager moves on
    assert not all(torch.equal(e, g) for e, g in zip(eager.logits[1:], graph.logits[1:]))


def test_run_reports_the_lint_cost_with_the_capture_time(cli, tmp_path):
    out = tmp_path / "run.json"
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "graph", "--json", out)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("mode"))
    columns = re.split(r"\s{2,}", header.strip())
    assert columns[columns.index("capture/compile s") + 1] == "lint s"
    assert json.loads(out.read_text())["modes"]["graph"]["lint_s"] > 0
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "graph", "--no-lint", "--json", out)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["modes"]["graph"]["lint_s"] is None
