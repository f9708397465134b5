"""When a replay differs from eager, the localizer names where: the first module whose replayed
output differs while everything before it matched, from probes captured into the graph.

A zoo of bugs the lint does not see, each planted in one module of a several-layer Qwen2 and
localized to that module (on a tape here; the cuda-marked ones with real CUDA graphs); and no
false report: clean steps localize to "no difference", and probes change no logit.
"""

import copy
import json
import re
import runpy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import small_decodes
from hypothesis import HealthCheck, given, settings
from torch import nn

from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.backends.piecewise import PiecewiseBackend
from graphrt.errors import GraphrtError
from graphrt.graphs import TapeGraph, capture
from graphrt.graphs.probe import ProbeSet
from graphrt.graphs.tolerance import EXACT, LAST_BITS, ValueDifference, compare_values
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.run.decode import decode, random_prompt
from graphrt.run.diagnose import locate
from graphrt.testing import localize

CPU = torch.device("cpu")
LAYERS, K = 4, 2  # the bugs go into layer K of LAYERS: neither the first nor the last
GRAPH_MODES = pytest.mark.parametrize("mode", ["graph", "piecewise"])
DEVICES = pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
])


def deep_model(device="cpu", layers=LAYERS, batch=2, slots=16):
    config = replace(PRESETS["tiny"], num_hidden_layers=layers)
    model = build_model(config, torch.device(device), torch.float32, seed=0)
    model.setup_cache(batch, slots)
    return model


def decode_states(model, steps=3, batch=2, start=4):
    """The inputs of `steps` decode steps from position `start`: (tokens [B, 1], positions [B])."""
    device = model.lm_head.weight.device
    gen = torch.Generator().manual_seed(1)
    return [(torch.randint(0, model.config.vocab_size, (batch, 1), generator=gen).to(device),
             torch.full((batch,), start + i, device=device)) for i in range(steps)]


def reads_outside(mlp: nn.Module, outside: dict) -> None:
    """`mlp` adds `outside["bias"]` to its output: a tensor the step reads from outside it."""
    original = mlp.forward

    def forward(x):
        return original(x) + outside["bias"]
    mlp.forward = forward


def counts_calls(mlp: nn.Module, per_call: float = 1 / 8) -> None:
    """`mlp` scales its output by a Python count of its calls: a value a graph freezes."""
    mlp.calls, original = 0, mlp.forward

    def forward(x):
        mlp.calls += 1
        return original(x) * (1 + mlp.calls * per_call)
    mlp.forward = forward


# ---------------------------------------------------------------------------------------------
# The zoo, through graphrt.testing.localize on graphrt's own decode step


@DEVICES
def test_a_weight_rebound_after_capture_is_localized_to_the_linear_that_reads_it(device):
    model = deep_model(device)
    proj = model.model.layers[K].mlp.down_proj
    weights = [proj.weight, nn.Parameter(proj.weight * 1.5, requires_grad=False)]

    def world(step):  # a weight reload that rebinds instead of copying, before step 1
        proj.weight = weights[min(step, 1)]

    with torch.inference_mode():
        where = localize(model.decode_step, decode_states(model), before_step=world)
    assert where.verdict == "module"
    assert (where.difference.module, where.difference.step) == (f"model.layers.{K}.mlp.down_proj (Linear)", 1)
    assert where.steps == 2
    if device == "cpu":  # a tape names the op inside it
        assert where.first_op.startswith("aten.") and "op 1 of 1 inside it" in where.first_op


@DEVICES
def test_a_tensor_read_from_outside_and_replaced_between_steps_is_localized_to_its_reader(device):
    model = deep_model(device)
    biases = [torch.zeros(64, device=device), torch.full((64,), 0.25, device=device)]
    outside = {}
    reads_outside(model.model.layers[K].mlp, outside)

    def world(step):  # replaced, not written in place: the graph keeps reading the first one
        outside["bias"] = biases[min(step, 1)]

    with torch.inference_mode():
        where = localize(model.decode_step, decode_states(model), before_step=world)
    assert where.difference.module == f"model.layers.{K}.mlp (Qwen2MLP)"
    assert where.difference.probe.what == "output" and where.difference.step == 1
    assert where.difference.max_abs_diff == pytest.approx(0.25)
    if device == "cpu":
        # the planted add comes after the MLP's own ops: the last op inside it
        assert re.fullmatch(r"aten\.add\.Tensor \(op (\d+) of \1 inside it\)", where.first_op)


@DEVICES
def test_a_kv_cache_rebound_after_capture_is_localized_to_the_attention_that_writes_it(device):
    # What setup_cache after a capture does to every layer, here to one: the graph keeps writing
    # and reading the old cache. Projections and rotary still match; attention's own code (the
    # cache write, then the core) hands o_proj something else.
    model = deep_model(device)
    attention = model.model.layers[K].self_attn
    caches = [attention.cache, copy.deepcopy(attention.cache)]
    for buffer in caches[1].buffers():
        buffer.zero_()

    def world(step):
        attention.cache = caches[min(step, 1)]

    with torch.inference_mode():
        where = localize(model.decode_step, decode_states(model), before_step=world)
    d = where.difference
    assert (d.module, d.probe.name, d.step) == (f"model.layers.{K}.self_attn (Qwen2Attention)",
                                                f"input 0 of model.layers.{K}.self_attn.o_proj (Linear)", 1)
    if device == "cpu":
        assert where.first_op.startswith("aten.index_put_.default (op ")


def test_where_ops_would_take_too_much_memory_the_module_is_named_without_its_op(monkeypatch):
    monkeypatch.setattr("graphrt.graphs.localize.OP_VALUES_BYTES", 0)
    model = deep_model()
    outside = {}
    reads_outside(model.model.layers[K].mlp, outside)
    biases = [torch.zeros(64), torch.ones(64)]
    with torch.inference_mode():
        where = localize(model.decode_step, decode_states(model),
                         before_step=lambda step: outside.update(bias=biases[min(step, 1)]))
    assert where.difference.module == f"model.layers.{K}.mlp (Qwen2MLP)" and where.first_op is None
    assert "first op" not in where.describe()


class Gate(nn.Module):
    """Multiplies its input by a plain tensor attribute, then runs its child."""

    def __init__(self):
        super().__init__()
        self.table = torch.ones(4)
        self.child = nn.Linear(4, 4)

    def forward(self, x):
        return self.child(x * self.table)


def test_a_value_a_module_passes_to_its_child_names_that_module_not_the_child():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Gate()).eval()
    tables = [torch.ones(4), torch.full((4,), 2.0)]

    def world(step):
        model[1].table = tables[min(step, 1)]

    x = torch.randn(3, 4)
    with torch.no_grad():
        where = localize(model, [x, x, x], before_step=world)
    d = where.difference
    assert (d.module, d.probe.name, d.step) == ("1 (Gate)", "input 0 of 1.child (Linear)", 1)
    assert where.first_op == "aten.mul.Tensor (op 1 of 2 inside it)"
    assert re.match(r"localized: 1 \(Gate\) is the first module whose replay differs from eager: its own "
                    r"code passes input 0 of 1\.child \(Linear\) that differs \(step 1, row \d, column \d, max \|Δ\| "
                    r"[\d.]+ > 0 \(exact\)\) while everything before it matched; "
                    r"first op inside it that differs: aten\.mul\.Tensor \(op 1 of 2 inside it\) "
                    r"\(probes: 10 copies, 480 B per step\)$", where.describe())


# ---------------------------------------------------------------------------------------------
# The zoo, through `graphrt run`


@pytest.fixture
def deep_run(monkeypatch):
    """`graphrt run --model tiny` builds a LAYERS-layer tiny; `plant(fn)` changes it as built."""
    from graphrt.run import execute

    planted = []
    resolve, build = execute.resolve, execute.load_model
    monkeypatch.setattr(execute, "resolve",
                        lambda name, impl="auto": (replace(resolve(name, impl)[0], num_hidden_layers=LAYERS), None))

    def build_and_plant(*args, **kwargs):
        model = build(*args, **kwargs)
        for plant in planted:
            plant(model)
        return model

    monkeypatch.setattr(execute, "load_model", build_and_plant)
    return planted.append


def localized_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith("localized:")]


def run_args(mode, device="cpu"):
    return ("run", "--model", "tiny", "--device", device, "--steps", 6, "--mode", f"eager,{mode}",
            "--no-lint")


@DEVICES
@GRAPH_MODES
def test_run_names_the_layer_whose_frozen_python_value_differs(cli, deep_run, mode, device):
    deep_run(lambda model: counts_calls(model.model.layers[K].mlp))
    result = cli(*run_args(mode, device))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    equivalence = next(i for i, line in enumerate(lines) if line.startswith(f"{mode} vs eager:"))
    assert lines[equivalence + 1].startswith(
        f"  localized: model.layers.{K}.mlp (Qwen2MLP) is the first module whose replayed output "
        "differs from eager (step 0, element (")
    if device == "cpu":
        # the planted scaling is the MLP's last op
        assert re.search(r"first op inside it that differs: aten\.mul\.Tensor \(op (\d+) of \1 inside it\)",
                         lines[equivalence + 1])


@DEVICES
@GRAPH_MODES
def test_run_says_a_static_input_left_stale_is_a_cause_outside_the_step(cli, deep_run, monkeypatch, mode, device):
    def step_without_positions(self, tokens, positions):  # copy-in forgets the positions
        self.tokens[: tokens.shape[0]].copy_(tokens)
        return self._run_bucket(self.bucket(tokens.shape[0]))[: tokens.shape[0]]

    monkeypatch.setattr(GraphBackend, "step", step_without_positions)
    result = cli(*run_args(mode, device))
    assert result.exit_code == 0, result.output
    (line,) = localized_lines(result.output)
    # the prompt is 16 tokens long: eager's first step is at position 16, the stale buffer holds 0
    assert line.startswith("localized: the step's inputs already differ (input positions, step 0, "
                           "row 0, max |Δ| 16 > 0 (exact)): the cause is outside the step")


def test_run_localizes_a_mode_whose_tokens_match_but_logits_differ_beyond_rounding(cli, deep_run):
    deep_run(lambda model: counts_calls(model.model.layers[K].mlp, per_call=1e-3))
    result = cli(*run_args("graph"))
    assert result.exit_code == 0, result.output
    assert re.search(r"graph vs eager: tokens identical; max \|Δ logits\| \S+ over 6 steps, beyond float32 "
                     r"rounding at step 0 \(row \d, column \d+, max \|Δ\| \S+ > atol 1e-05 \+ rtol 1e-05 × "
                     r"max \|eager\| ", result.output), result.output
    (line,) = localized_lines(result.output)
    assert line.startswith(f"localized: model.layers.{K}.mlp (Qwen2MLP) is the first module whose replayed "
                           "output differs from eager (step 0, ")


def test_run_localizes_nothing_where_logits_differ_within_rounding(cli, deep_run):
    # the same frozen count, a hundred thousand times smaller: the logits move by less than
    # float32's rounding allows, and the run neither calls that a difference nor localizes it
    deep_run(lambda model: counts_calls(model.model.layers[K].mlp, per_call=1e-8))
    result = cli(*run_args("graph"))
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("graph vs eager:"))
    assert line.startswith("graph vs eager: tokens identical; max |Δ logits| ") and "0 over" not in line
    assert line.endswith("over 6 steps, within float32 rounding")
    assert localized_lines(result.output) == []


def test_run_writes_the_localization_into_its_json(cli, deep_run, tmp_path):
    deep_run(lambda model: counts_calls(model.model.layers[K].mlp))
    out = tmp_path / "run.json"
    assert cli(*run_args("graph"), "--json", out).exit_code == 0
    found = json.loads(out.read_text())["modes"]["graph"]["localization"]
    assert (found["verdict"], found["module"], found["step"]) == ("module", f"model.layers.{K}.mlp (Qwen2MLP)", 0)
    assert found["probe_copies"] > 0 and found["text"].startswith("localized: ")


def test_run_localizes_nothing_when_every_mode_matches_eager(cli):
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager,piecewise,graph")
    assert result.exit_code == 0, result.output
    assert "tokens identical; max |Δ logits| 0 over 4 steps, within float32 rounding" in result.output
    assert localized_lines(result.output) == []


# ---------------------------------------------------------------------------------------------
# No false report


def shrunk(name):
    """A preset's shape (heads, KV heads, tied embeddings) at two layers and a small width."""
    config = PRESETS[name]
    return replace(config, vocab_size=97, hidden_size=config.num_attention_heads * 8, head_dim=8, intermediate_size=24,
                   num_hidden_layers=2, max_position_embeddings=64)


@GRAPH_MODES
@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_clean_step_of_every_preset_localizes_to_no_difference(preset, mode):
    model = build_model(shrunk(preset), CPU, torch.float32, seed=0)
    model.setup_cache(4, 12)
    where = locate(mode, model, random_prompt(3, 5, 97, seed=0), steps=3)  # batch 3: bucket 4, padded
    assert where.verdict == "none" and where.steps == 3, where.describe()
    assert where.describe().startswith("localized: no difference: every probe ")


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_decodes(max_layers=3))
def test_a_clean_step_localizes_to_no_difference_for_random_configs(case):
    config, batch, prompt_len, seed = case
    model = build_model(config, CPU, torch.float32, seed=seed)
    model.setup_cache(batch, prompt_len + 4)
    prompt = random_prompt(batch, prompt_len, config.vocab_size, seed)
    for mode in ("graph", "piecewise"):
        where = locate(mode, model, prompt, steps=3)
        assert where.verdict == "none", where.describe()
    with torch.inference_mode():
        states = [(prompt[:, :1], torch.full((batch,), prompt_len + i)) for i in range(3)]
        assert localize(model.decode_step, states).verdict == "none"


@pytest.mark.parametrize("backend_class", [GraphBackend, PiecewiseBackend], ids=["graph", "piecewise"])
def test_probes_change_no_logit_and_add_only_copies(backend_class):
    model = deep_model(batch=4, slots=24)
    prompt = random_prompt(3, 6, model.config.vocab_size, seed=0)
    plain, probed = backend_class(model), backend_class(model, probe=True)
    plain.prepare(3), probed.prepare(3)
    logits = [decode(backend, prompt, steps=4).logits for backend in (plain, probed)]
    assert all(torch.equal(a, b) for a, b in zip(*logits))  # bitwise on a tape
    assert decode(EagerBackend(model), prompt, steps=4).tokens.equal(decode(probed, prompt, steps=4).tokens)
    for bs in plain.graphs:
        probes = probed.probes[bs]
        skip = set().union(*(p.storages() for p in probes))
        tapes = [plain._bucket_graphs(bs), probed._bucket_graphs(bs)]
        ops = [[name for tape in tapes[0] for name in tape.op_names],
               [name for tape in tapes[1] for name, out in zip(tape.op_names, tape.op_outputs)
                if out.untyped_storage()._cdata not in skip]]
        copies = sum(len(tape) for tape in tapes[1]) - len(ops[1])
        assert ops[0] == ops[1]  # the step's own ops, unchanged and in order
        # the step's inputs and output once per step, piecewise too
        at_step = [probe.what for probe in probed.probe_values(bs) if probe.where == "the step"]
        assert at_step == ["input tokens", "input positions", "output"]
        assert copies == sum(p.copies for p in probes) > 4 * LAYERS  # one copy per probe, no more


# ---------------------------------------------------------------------------------------------
# The rules underneath


def test_a_cuda_graph_or_padded_batch_is_compared_within_a_tolerance_per_dtype_integers_exactly():
    eager = torch.ones(2, 3)
    close = eager + torch.tensor([[0.0, 0.0, 0.0], [0.0, 4e-3, 0.0]])
    assert compare_values(eager.bfloat16(), close.bfloat16(), LAST_BITS) is None  # within bf16's 1e-2
    found = compare_values(eager, close, LAST_BITS)
    assert (found.index, found.limit) == ((1, 1), "atol 1e-05 + rtol 1e-05 × max |eager| 1")
    assert found.max_abs_diff == pytest.approx(4e-3, rel=1e-4)
    assert compare_values(torch.tensor([3, 4]), torch.tensor([3, 5]), LAST_BITS) == ValueDifference((1,), 1.0, "0 (exact)")


def test_a_tape_is_compared_bitwise():
    # a tape replays eager's very ops: a last-bit difference is already the bug
    one = torch.ones(2)
    assert compare_values(one, one.nextafter(torch.full((2,), 2.0)), EXACT).limit == "0 (exact)"
    assert compare_values(one.bfloat16(), one.bfloat16(), EXACT) is None


class Branches(nn.Module):
    """Calls its two children in an order a Python flag decides."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.swap = nn.Linear(2, 2), nn.Linear(2, 2), False

    def forward(self, x):
        first, second = (self.b, self.a) if self.swap else (self.a, self.b)
        return second(first(x))


@pytest.mark.parametrize("states, warmup, message", [
    ([], 2, "localize needs at least one input state"),
    ([torch.ones(2)], 0, "localize needs warmup >= 1 (its first call sizes the probes), got 0"),
])
def test_localize_refuses_no_states_and_no_warmup_in_one_line(states, warmup, message):
    with pytest.raises(GraphrtError, match=f"^{re.escape(message)}$"):
        localize(nn.Linear(2, 2), states, warmup=warmup)


def test_a_probed_step_that_calls_its_modules_in_another_order_is_refused():
    model = Branches()
    probes = ProbeSet(model, {"x": torch.ones(1, 2)})
    step = probes.wrap(lambda: model(torch.ones(1, 2)))
    step()  # sizes the probes
    step()
    model.swap = True
    with pytest.raises(GraphrtError, match=r"^probe input 0 of b \(Linear\) \(float32 \[1, 2\]\): the step's "
                                           r"first call had input 0 of a \(Linear\) here; a probed step must"):
        step()


def test_probe_copies_are_captured_so_each_replay_leaves_its_module_outputs():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU()).eval()
    x = torch.zeros(1, 2)
    probes = ProbeSet(model, {"x": x})
    with torch.no_grad():
        graph, out = capture(probes.wrap(lambda: model(x)), device=CPU)
        assert isinstance(graph, TapeGraph)
        for value in (torch.tensor([[1.0, -2.0]]), torch.tensor([[-3.0, 0.5]])):
            x.copy_(value)
            graph.replay()
            hidden = model[0](value)
            got = {p.name: p.value for p in probes.values()}
            assert torch.equal(got["input x of the step"], value)
            assert torch.equal(got["output of 0 (Linear)"], hidden)
            assert torch.equal(got["output of 1 (ReLU)"], hidden.relu())
            assert torch.equal(got["output of the step"], out)
    assert probes.copies == 8 and probes.bytes == 8 * 2 * 4  # 2 step probes + 3 per module, 2 floats each


def test_the_device_check_script_names_the_planted_weight_and_finds_nothing_in_a_clean_step(tmp_path, capsys):
    script = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu_localize.py"))
    out = tmp_path / "localize.json"
    assert script["main"](["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("gpu_localize (ok, ") and len(printed.splitlines()) == 1
    found = json.loads(out.read_text())
    assert found["named_the_planted_module"] and found["clean_found_nothing"]
    assert found["rebound"]["module"] == found["planted"]["module"] == "model.layers.1.mlp.down_proj (Linear)"
