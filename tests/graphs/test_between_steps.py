"""What a caller does between steps, the localizer does too: a failed comparison is explained
under its own conditions (the same inputs, `next_inputs` between replays as between eager steps,
the capture at the same point), and a message never pairs a failure with "no difference".

Each way a caller can act between steps gets a case: rebind a module's buffer, replace a tensor
the step reads from outside, change a plain Python attribute, write a tensor in place (which a
graph sees: no failure), and an action that does not repeat (the re-run cannot reproduce it).
"""

import json
import re

import pytest
import torch
from torch import nn
from toy_modules import CountsCalls

from graphrt.backends.graph import GraphBackend
from graphrt.testing import assert_replays_like_eager, compare_replay, localize


class Scale(nn.Module):
    """Multiplies by a buffer, by a tensor from outside, and by a Python factor."""

    def __init__(self, outside: dict):
        super().__init__()
        self.register_buffer("table", torch.ones(30))
        self.outside, self.factor = outside, 1.0

    def forward(self, x):
        return x * self.table * self.outside["bias"] * self.factor


def stack(outside: dict) -> nn.Module:
    torch.manual_seed(0)
    outside["bias"] = torch.ones(30)
    return nn.Sequential(nn.Linear(4, 30), Scale(outside), nn.Linear(30, 40)).eval()


def rebind_buffer(model, outside):
    model[1].table = model[1].table * 2  # assigns a new tensor: the graph keeps the first


def replace_outside(model, outside):
    outside["bias"] = outside["bias"] + 1  # a new tensor: the graph keeps reading the first


def change_python_value(model, outside):
    model[1].factor += 1  # a Python float: frozen at capture


def write_in_place(model, outside):
    model[1].table.mul_(2)  # the very tensor the graph reads


ACTIONS = pytest.mark.parametrize("action", [rebind_buffer, replace_outside, change_python_value],
                                  ids=["rebind-buffer", "replace-outside-tensor", "python-value"])


def failure(model, next_inputs, inputs=None) -> str:
    """The message of a failed check (its lint off: these steps read what no lint lets pass)."""
    inputs = (torch.randn(2, 4),) if inputs is None else inputs
    with torch.no_grad(), pytest.raises(AssertionError) as raised:
        assert_replays_like_eager(model, inputs, steps=6, next_inputs=next_inputs, lint=False)
    return str(raised.value)


@ACTIONS
def test_a_change_next_inputs_makes_between_steps_is_localized_to_the_module_it_feeds(action):
    outside = {}
    model = stack(outside)

    def next_inputs(out, x):
        action(model, outside)
        return x

    compared, localized = failure(model, next_inputs).splitlines()
    # step 0 runs what was captured; from step 1 eager reads what the caller changed
    assert compared.startswith("replay differs from eager: step 1: the output at (")
    assert localized.startswith("localized: 1 (Scale) is the first module whose replayed output differs "
                                "from eager (step 1, row ")
    assert "first op inside it that differs: aten.mul.Tensor" in localized


def test_a_tensor_next_inputs_writes_in_place_replays_like_eager():
    outside = {}
    model = stack(outside)

    def next_inputs(out, x):
        write_in_place(model, outside)
        return x

    with torch.no_grad():
        assert assert_replays_like_eager(model, (torch.randn(2, 4),), steps=6, next_inputs=next_inputs,
                                         lint=False).matches


@ACTIONS
def test_localize_with_the_same_change_before_each_step_names_the_same_module(action):
    outside = {}
    model = stack(outside)
    x = torch.randn(2, 4)

    def world(step):  # step i's world: the change made i times from the start
        model[1].table, outside["bias"], model[1].factor = torch.ones(30), torch.ones(30), 1.0
        for _ in range(step):
            action(model, outside)

    with torch.no_grad():
        where = localize(model, [x] * 6, before_step=world)
    assert (where.verdict, where.difference.module, where.stopped_at) == ("module", "1 (Scale)", 1)


def test_a_between_step_change_that_does_not_repeat_is_said_not_reproduced_never_no_difference():
    outside = {}
    model = stack(outside)
    done = []

    def next_inputs(out, x):  # rebinds once in the process's life: the re-run does not see it
        if not done:
            done.append(True)
            rebind_buffer(model, outside)
        return x

    message = failure(model, next_inputs)
    assert "no difference" not in message
    compared, localized = message.splitlines()
    assert compared.startswith("replay differs from eager: step 1: ")
    assert localized.startswith(f"localized: not reproduced: the comparison differed ({compared.split(': ', 1)[1]}); "
                                "a probed re-run of the same steps matched eager over 6 steps.")


def test_a_difference_no_probe_holds_is_said_so_never_no_difference():
    # the returned Python count is frozen by the graph; every tensor matches
    message = failure(CountsCalls(), None)
    assert message.splitlines() == [
        "replay differs from eager: step 1: output 1 is 1, eager's 2",
        "localized: step 1 differs (output 1 is 1, eager's 2), but no probe (the step's inputs, each module's "
        "inputs and output, the step's output) differs at all: the difference adds up from rounding (a near "
        "tie between tokens), or lies in a value no probe holds (a Python value the step returns) "
        "(probes: 4 copies, 128 B per step)"]


def test_the_probed_re_run_starts_from_the_state_the_comparison_started_from():
    # a running sum carries state between steps; the comparison's replays leave it further on,
    # and a re-run from there would compare other sums: it starts where the comparison did
    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))
            self.scale = 1.0

        def forward(self, x):
            self.total.add_(x)
            return self.total * self.scale

    model = Frozen()

    def next_inputs(out, x):
        model.scale += 1.0
        return x

    message = failure(model, next_inputs, (torch.ones(3),))
    assert re.search(r"step 1: the output at \(0,\) is 2, eager's 4 ", message), message
    assert "(step 1, row 0, max |Δ| 2 > 0 (exact))" in message


def test_compare_replay_keeps_the_replays_writes():
    class Sum(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total.add_(x)
            return self.total * 1

    model = Sum()
    assert compare_replay(model, (torch.ones(3),), steps=4).matches
    assert model.total.tolist() == [4.0, 4.0, 4.0]


def test_run_says_when_its_probed_re_run_does_not_reproduce_the_difference(cli, monkeypatch, tmp_path):
    # the run's graph (no probes) adds to its logits; the probed one the localizer captures does not
    step = GraphBackend.step

    def off_unless_probed(self, tokens, positions):
        logits = step(self, tokens, positions)
        return logits if self.probe else logits + 1.0

    monkeypatch.setattr(GraphBackend, "step", off_unless_probed)
    out = tmp_path / "run.json"
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager,graph", "--no-lint", "--json", out)
    assert result.exit_code == 0, result.output
    (line,) = [ln.strip() for ln in result.output.splitlines() if ln.strip().startswith("localized:")]
    assert line.startswith("localized: not reproduced: the comparison differed (the run's graph vs eager: "
                           "tokens identical; max |Δ logits| 1 over 4 steps, beyond float32 rounding at step 0")
    assert "no difference" not in result.output
    found = json.loads(out.read_text())["modes"]["graph"]
    assert found["equivalence"]["differs"] and found["equivalence"]["first_differing_step"] == 0
    assert found["localization"]["verdict"] == "unreproduced" and found["localization"]["steps"] == 1
