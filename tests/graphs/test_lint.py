"""The capture lint finds what a graph would freeze, and names the op and the module it ran in.

A zoo of broken decode-like steps, each the kind of bug users of CUDA graphs hit: every one is
caught, its line names the op, the module range and the values. graphrt's own step is clean for
every preset and over random configs (no false findings), and linting leaves no trace.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from graphrt.errors import GraphrtError
from graphrt.graphs import GraphCaptureError, capture, lint_step
from graphrt.measure import nvtx
from graphrt.model.config import PRESETS, ModelConfig
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.weights import build_model

CPU = torch.device("cpu")
WIDTH, SLOTS = 8, 16


class Case(nn.Module):
    """A projection and a cache of SLOTS rows: the parts every zoo step shares."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("cache", torch.zeros(SLOTS, WIDTH))


class IntPosition(Case):
    def forward(self, x, position: int):
        self.cache[position] = self.proj(x)  # the slot a replay writes is the captured one
        return self.cache.sum(0)


class BranchOnData(Case):
    def forward(self, x, tokens):
        if tokens.sum() > 0:  # reads the tokens back on the host
            return self.proj(x)
        return x


class GrowingSlice(Case):
    def __init__(self) -> None:
        super().__init__()
        self.n = 4

    def forward(self, x):
        self.cache[self.n] = self.proj(x)
        self.n += 1
        return self.cache[: self.n].flatten()  # the length a replay reads is the captured one


class TensorFromPosition(Case):
    def forward(self, x, position: int):
        index = torch.tensor([position])  # made from Python data on every call
        return self.proj(x) + self.cache.index_select(0, index)


class AttributeInForward(Case):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.proj(x) * self.calls


class RandomNoise(Case):
    def forward(self, x):
        return self.proj(x) + 0.01 * torch.randn_like(x)


class HostCounter(Case):
    """A counter kept in a plain attribute and written in place: the step's own state on a CPU,
    but left on the host when the model moves to CUDA."""

    def __init__(self) -> None:
        super().__init__()
        self.host_position = torch.zeros(1, dtype=torch.long)  # a plain attribute, not a buffer
        self.register_buffer("position", torch.zeros(1, dtype=torch.long))

    def forward(self, x):
        self.host_position += 1
        self.position.copy_(self.host_position)
        return self.proj(x) + self.cache.index_select(0, self.position)


class ReboundCounter(Case):
    def __init__(self) -> None:
        super().__init__()
        self.counter = torch.zeros(1, dtype=torch.long)  # a plain attribute, not a buffer

    def forward(self, x):
        self.counter = self.counter + 1  # replaced, not written in place: a graph reads the first
        return self.proj(x) + self.cache.index_select(0, self.counter)


class DropoutInTraining(Case):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.proj(x))


class Net(nn.Module):
    """The user's model: the broken step sits one level down, where a finding must point."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, *args):
        return self.body(*args)


def x_state(seed: int) -> torch.Tensor:
    return torch.randn(1, WIDTH, generator=torch.Generator().manual_seed(seed))


X0, X1 = x_state(0), x_state(1)
ZOO = {
    # name: (step, states, what a line must say: op, module, the words with the values)
    "python-int-position": (IntPosition, [(X0, 5), (X1, 6)],
                            ["aten.select.int", "body (IntPosition)", "index is 5 in capture 1 and 6 in capture 2",
                             "replay uses 5 forever"]),
    "branch-on-tensor-data": (BranchOnData, [(X0, torch.tensor([3])), (X1, torch.tensor([-3]))],
                              ["aten.is_nonzero.default", "body (BranchOnData)", "host sync"]),
    "slice-by-updated-attribute": (GrowingSlice, [(X0,), (X1,)],
                                   ["aten.slice.Tensor", "body (GrowingSlice)", "end is 6 in capture 1 and 7 in capture 2",
                                    "replay uses 6 forever"]),
    "tensor-built-each-step": (TensorFromPosition, [(X0, 5), (X1, 6)],
                               ["aten.index_select.default", "body (TensorFromPosition)",
                                "[5] in capture 1 and [6] in capture 2", "replay reads [5] forever"]),
    "attribute-written-in-forward": (AttributeInForward, [(X0,), (X1,)],
                                     ["aten.mul.Tensor", "body (AttributeInForward)", "other is 2 in capture 1 and 3",
                                      "replay uses 2 forever"]),
    "random-op": (RandomNoise, [(X0,), (X1,)], ["aten.randn_like.default", "body (RandomNoise)", "random"]),
    "counter-rebound-each-step": (ReboundCounter, [(X0,), (X1,)],
                                  ["aten.add.Tensor", "body (ReboundCounter)", "body.counter, a plain tensor attribute",
                                   "neither a static input nor made inside the step"]),
    "dropout-in-training": (DropoutInTraining, [(X0,), (X1,)],
                            ["aten.dropout.default", "body.drop (Dropout)", "random",
                             "body.drop (Dropout) is in training mode: call .eval()"]),
}


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_step_is_caught_naming_op_module_and_values(name):
    case, states, words = ZOO[name]
    model = Net(case())
    if name != "dropout-in-training":
        model.eval()
    with torch.inference_mode():  # as a decode step runs
        report = lint_step(model, states)
    assert not report.clean
    lines = [str(f) for f in report.findings]
    assert any(all(w in line for w in words) for line in lines), "\n".join(lines)


def test_a_python_value_is_reported_where_it_arises_not_at_every_op_downstream():
    # flatten's view takes a size computed from the sliced shape: derived, not a second cause
    report = lint_step(Net(GrowingSlice()).eval(), [(X0,), (X1,)])
    assert [f.op for f in report.findings if f.kind != "attribute"] == ["aten.select.int",
                                                                        "aten.slice.Tensor"]


def test_an_attribute_written_in_forward_is_named():
    report = lint_step(Net(AttributeInForward()).eval(), [(X0,), (X1,)])
    attribute = [f for f in report.findings if f.kind == "attribute"]
    assert [str(f) for f in attribute] == [
        "body.calls: attribute body.calls changed during the step (1 -> 2): a replay runs no Python, "
        "so it never changes again (and ops that read it replay the captured value)"]


def test_a_branch_taken_differently_is_reported_as_control_flow():
    report = lint_step(Net(BranchOnData()).eval(), [(X0, torch.tensor([3])), (X1, torch.tensor([-3]))])
    flow = [f for f in report.findings if f.kind == "control-flow"]
    assert len(flow) == 1, report
    assert "capture 1 runs 2 ops (aten.t.default, aten.addmm.default) where capture 2 runs nothing" in str(flow[0])


def test_the_lint_leaves_the_callers_state_as_it_found_it():
    model = Net(GrowingSlice()).eval()
    model.body.cache.normal_()
    cache = model.body.cache.clone()
    lint_step(model, [(X0,), (X1,)])
    assert torch.equal(model.body.cache, cache)  # written at slots 4, 5, 6 by the captures: back
    assert model.body.n == 4
    assert not nvtx.is_attached(model)  # the ranges it attached for itself are gone


def test_the_random_numbers_a_lint_draws_are_given_back():
    model = Net(RandomNoise()).eval()
    rng = torch.random.get_rng_state()
    lint_step(model, [(X0,), (X1,)])  # three calls draw from the generator
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_without_restore_the_writes_stay():
    model = Net(GrowingSlice()).eval()
    lint_step(model, [(X0,), (X1,)], restore=False)
    assert model.body.n == 7 and model.body.cache[4:7].abs().sum() > 0


def test_modules_are_named_with_nvtx_switched_off():
    was = nvtx.set_enabled(False)
    try:
        report = lint_step(Net(IntPosition()).eval(), [(X0, 5), (X1, 6)])
    finally:
        nvtx.set_enabled(was)
    assert any("body (IntPosition)" in str(f) for f in report.findings)


def test_states_of_another_shape_are_refused_in_one_line():
    with pytest.raises(GraphrtError, match=r"^argument 0 is a float32 \[1, 8\] tensor in state 0 "
                                           r"and a float32 \[2, 8\] tensor in state 1: a graph is "
                                           r"captured at one shape and dtype per input$"):
        lint_step(Net(AttributeInForward()), [(X0,), (torch.zeros(2, WIDTH),)])
    with pytest.raises(GraphrtError, match="^state 1 has 2 arguments, state 0 has 1$"):
        lint_step(Net(AttributeInForward()), [(X0,), (X1, 1)])
    with pytest.raises(GraphrtError, match="at least two input states"):
        lint_step(Net(AttributeInForward()), [(X0,)])


def _decode_states(model, batch: int, position: int):
    vocab = model.config.vocab_size
    tokens = (torch.arange(batch).unsqueeze(1) * 7 + 3) % vocab
    positions = torch.full((batch,), position)
    return [(tokens, positions), ((tokens + 1) % vocab, positions + 1)]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_graphrt_decode_step_is_lint_clean_for_every_preset_at_full_size(preset):
    # On the meta device ops compute shapes, not values: every preset at its full size (all its
    # layers, its real vocabulary) costs no memory, and the Python the step runs is the same.
    with torch.device("meta"):
        model = Qwen2ForCausalLM(PRESETS[preset]).eval().requires_grad_(False)
    model.setup_cache(2, 8)
    tokens = torch.zeros(2, 1, dtype=torch.long, device="meta")
    positions = torch.zeros(2, dtype=torch.long, device="meta")
    with torch.inference_mode():  # restore=False: a meta cache holds nothing to restore
        report = lint_step(model.decode_step, [(tokens, positions), (tokens + 1, positions + 1)],
                           restore=False)
    assert report.clean, str(report)
    assert report.ops > 20 * PRESETS[preset].num_hidden_layers  # the whole step: 20+ ops a layer


def test_graphrt_decode_step_is_lint_clean_with_real_weights(tiny_config):
    model = build_model(tiny_config, CPU, torch.float32, seed=0)
    model.setup_cache(2, 8)
    with torch.inference_mode():
        report = lint_step(model.decode_step, _decode_states(model, 2, 3))
    assert report.clean, str(report)


@pytest.mark.slow  # 100 examples
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_heads=st.sampled_from([1, 2]), groups=st.sampled_from([1, 2, 3]),
       head_dim=st.sampled_from([2, 4, 8]), layers=st.integers(1, 2), batch=st.integers(1, 3),
       cache=st.integers(2, 6), tied=st.booleans(), data=st.data())
def test_no_false_finding_on_graphrt_step_over_random_configs(kv_heads, groups, head_dim, layers,
                                                              batch, cache, tied, data):
    heads = kv_heads * groups
    config = ModelConfig("random", vocab_size=31, hidden_size=heads * head_dim, intermediate_size=6,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, rope_theta=10_000.0, tie_word_embeddings=tied)
    model = build_model(config, CPU, torch.float32, seed=0)
    model.setup_cache(batch, cache)
    position = data.draw(st.integers(0, cache - 2))
    with torch.inference_mode():
        report = lint_step(model.decode_step, _decode_states(model, batch, position), warmup=0)
    assert report.clean, str(report)


class Appends(Case):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x):
        self.seen.append(len(self.seen))
        self.last = x * 2  # an attribute the step adds, a new tensor each call
        return self.proj(x)


def test_attributes_are_restored_in_place_and_added_ones_dropped():
    model = Net(Appends()).eval()
    seen = model.body.seen
    report = lint_step(model, [(X0,), (X1,)])
    assert model.body.seen is seen and seen == []
    assert not hasattr(model.body, "last")
    assert {f.module for f in report.findings if f.kind == "attribute"} == {"body.seen", "body.last"}


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_a_counter_kept_on_the_host_is_a_host_tensor():
    model = Net(HostCounter()).cuda().eval()  # .cuda() moves buffers, not the plain attribute
    with torch.inference_mode():
        report = lint_step(model, [(X0.cuda(),), (X1.cuda(),)])
    host = [str(f) for f in report.findings if f.kind == "host-tensor"]
    assert any(line.startswith("aten.copy_.default in body (HostCounter): argument src is "
                               "body.host_position") and "a CUDA graph records no host work" in line
               for line in host), report


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_graphrt_decode_step_is_lint_clean():
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.bfloat16, seed=0)
    model.setup_cache(2, 8)
    states = [tuple(t.cuda() for t in state) for state in _decode_states(model, 2, 3)]
    with torch.inference_mode():
        report = lint_step(model.decode_step, states)
    assert report.clean, str(report)


class GrowingList(Case):
    def __init__(self) -> None:
        super().__init__()
        self.history: list[torch.Tensor] = []

    def forward(self, x):
        self.history.append(self.proj(x))
        return torch.cat(self.history).sum(0)


def test_a_list_of_tensors_that_grows_is_caught_at_the_op_that_takes_it():
    report = lint_step(Net(GrowingList()).eval(), [(X0,), (X1,)])
    lines = [str(f) for f in report.findings]
    assert ("python-value", "aten.cat.default in body (GrowingList): takes arguments (tensors[0], tensors[1]) in "
            "capture 1 and (tensors[0], tensors[1], tensors[2]) in capture 2: a list built in Python; replay keeps "
            "capture 1's") in [(f.kind, str(f)) for f in report.findings], lines
    assert "attribute body.history changed during the step (a list of 1 tensors -> a list of 2 tensors)" in lines[0]


class DataDependentShape(Case):
    def forward(self, x):
        return self.cache.index_select(0, (x[0] > 0).nonzero()[:, 0])


def test_a_shape_that_follows_the_data_is_refused_and_reported_as_a_shape():
    x0, x1 = torch.ones(1, WIDTH), torch.ones(1, WIDTH)
    x1[0, :3] = -1
    report = lint_step(Net(DataDependentShape()).eval(), [(x0,), (x1,)])
    kinds = {f.kind: str(f) for f in report.findings}
    assert kinds["refused"].startswith("aten.nonzero.default in body (DataDependentShape)")
    assert kinds["shape"] == ("aten.nonzero.default in body (DataDependentShape): result shape "
                              "[8, 1] in capture 1 and [5, 1] in capture 2: replay keeps [8, 1] forever")


class AlternatingTables(Case):
    """Double-buffering chosen in Python: a different buffer on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("even", torch.zeros(WIDTH))
        self.register_buffer("odd", torch.ones(WIDTH))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.proj(x) + (self.even if self.calls % 2 == 0 else self.odd)


def test_a_buffer_chosen_in_python_is_caught_naming_both():
    report = lint_step(Net(AlternatingTables()).eval(), [(X0,), (X1,)])
    lines = [str(f) for f in report.findings if f.kind == "tensor"]
    assert lines == ["aten.add.Tensor in body (AlternatingTables): argument other is body.even in "
                     "capture 1 and body.odd in capture 2: replay reads capture 1's tensor forever"]


class ScaledTwice(Case):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        self.scale *= 2
        return self.proj(x * self.scale) * self.scale


def test_one_cause_at_several_ops_of_a_module_is_one_line_that_counts_them():
    report = lint_step(Net(ScaledTwice()).eval(), [(X0,), (X1,)])
    lines = [str(f) for f in report.findings if f.kind == "python-value"]
    assert lines == ["aten.mul.Tensor in body (ScaledTwice): argument other is 4.0 in capture 1 and "
                     "8.0 in capture 2: a Python value read at capture; replay uses 4.0 forever; "
                     "pass it in a static input tensor (2 ops)"]


def test_a_plain_function_over_tensors_is_linted_without_a_model():
    weight, cache = torch.randn(WIDTH, WIDTH), torch.zeros(SLOTS, WIDTH)

    def step(x, position):
        cache[position] = x @ weight
        return cache.sum(0)

    report = lint_step(step, [(X0, 5), (X1, 6)])
    assert [f.kind for f in report.findings] == ["python-value"]  # weight and cache are not judged
    assert str(report.findings[0]).startswith(
        "aten.select.int in the step, outside any module: argument index is 5 in capture 1 and 6")
    assert not cache.any()  # restored


def test_a_tape_capture_itself_refuses_a_branch_on_tensor_data_naming_the_module():
    # On the CPU `bool(tensor)` reads the data without a `_local_scalar_dense`: the tape has to
    # refuse `is_nonzero` itself (on CUDA the copy to the host would fail the capture).
    model = Net(BranchOnData()).eval()
    with torch.inference_mode(), nvtx.attach(model), pytest.raises(GraphCaptureError) as info:
        capture(lambda: model(X0, torch.tensor([3])), device="cpu", warmup=0)
    assert str(info.value).startswith("aten.is_nonzero.default in body (BranchOnData): operation "
                                      "not permitted while capturing (a host sync")


def scaled(x, scale):
    return x * scale


NAN = float("nan")


MUL = "aten.mul.Tensor in the step, outside any module: argument other is"


@pytest.mark.parametrize("scales, findings", [
    ((NAN, NAN), []),  # NaN != NaN, yet both captures read the same value
    ((1.0, NAN), [f"{MUL} 1.0 in capture 1 and nan in capture 2"]),
    ((NAN, 1.0), [f"{MUL} nan in capture 1 and 1.0 in capture 2"]),
    ((2, 2.0), [f"{MUL} 2 in capture 1 and 2.0 in capture 2"]),  # equal, but an int is no float
])
def test_a_python_scalar_is_the_same_in_two_captures_when_equal_and_of_one_type_or_both_nan(scales, findings):
    report = lint_step(scaled, [(X0, scale) for scale in scales])
    assert [str(f).split(": a Python value")[0] for f in report.findings] == findings


class MaxOverRows(Case):
    def forward(self, x):
        values, _ = self.proj(x).max(dim=0)  # an op with two results
        return values * 2


def test_every_result_of_an_op_with_several_is_made_by_the_step():
    # so `values` is not judged an outside tensor, though it differs between the captures
    assert lint_step(Net(MaxOverRows()).eval(), [(X0,), (X1,)]).clean



def widened(x):
    return x.to(x.device, torch.float64) * 2  # outside inference mode: aten._to_copy(x, dtype=, device=)


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: a device that is not the host
def test_a_dtype_conversion_on_the_device_is_no_finding(device):
    # _to_copy is refused only when it copies to the host; its keywords say where it goes
    assert lint_step(widened, [(X0.to(device),), (X1.to(device),)]).clean


class TensorOrNumber(Case):
    def forward(self, x, as_tensor: bool):
        return self.proj(x) * (self.cache[0] if as_tensor else 2.0)


def test_a_tensor_argument_that_becomes_a_python_number_is_a_tensor_finding():
    report = lint_step(Net(TensorOrNumber()).eval(), [(X0, True), (X1, False)])
    assert ("tensor", "aten.mul.Tensor in body (TensorOrNumber): argument other is body.cache in capture 1 and "
            "2.0 in capture 2: replay reads capture 1's tensor forever") in [(f.kind, str(f)) for f in report.findings]


def sine_then_cosine(x, cosine: bool):
    y = x.sin()
    return y.cos() if cosine else y


def test_ops_only_the_second_capture_runs_at_its_end_are_control_flow_at_its_first_op():
    report = lint_step(sine_then_cosine, [(X0, False), (X1, True)])
    assert [(f.kind, str(f)) for f in report.findings] == [(
        "control-flow", "aten.cos.default in the step, outside any module: capture 1 runs nothing where capture "
        "2 runs 1 op (aten.cos.default): Python control flow on a value that changed; replay always runs "
        "capture 1's ops")]


class CountsSigns(Case):
    def forward(self, x):
        _, counts = torch.unique(x > 0, return_counts=True)  # one result per distinct sign
        return counts


def test_an_op_whose_several_results_change_shape_lists_each_shape():
    x0, x1 = torch.ones(1, WIDTH), torch.ones(1, WIDTH)
    x1[0, :3] = -1
    report = lint_step(Net(CountsSigns()).eval(), [(x0,), (x1,)])
    assert [str(f) for f in report.findings if f.kind == "shape"] == [
        "aten._unique2.default in body (CountsSigns): result shape [1], [0], [1] in capture 1 and [2], [0], [2] "
        "in capture 2: replay keeps [1], [0], [1] forever"]


def test_a_state_of_one_tensor_needs_no_tuple():
    seen = []
    lint_step(lambda x: seen.append(x.shape) or x * 2, [torch.zeros(2, 3), torch.ones(2, 3)])
    assert set(seen) == {torch.Size([2, 3])}  # the whole tensor is the step's one argument


class OnMeta(nn.Module):
    """Its weight on the meta device, standing in for a GPU: the step runs where the model is."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH, device="meta"))

    def forward(self, x):
        return x.to("meta") * self.weight


def test_an_input_left_on_the_host_of_a_model_on_a_device_is_named():
    report = lint_step(OnMeta(), [(X0,), (X1,)])
    assert [(f.kind, str(f)) for f in report.findings] == [(
        "host-tensor", "aten._to_copy.default in (OnMeta): argument self is input 0 of the step, on the host "
        "while the step runs on meta: a CUDA graph records no host work, so replay reads it as it was at "
        "capture; keep it on meta")]


def sine_or_mask(x, masked: bool):
    return x[x > 0] if masked else x.sin()


def test_what_only_the_first_capture_runs_is_checked_too_as_it_is_what_replay_runs():
    report = lint_step(sine_or_mask, [(X0, True), (X1, False)])
    assert [f.kind for f in report.findings] == ["refused", "control-flow"]
    assert str(report.findings[0]).startswith("aten.index.Tensor in the step, outside any module: operation "
                                              "not permitted while capturing (its output shape depends on")


class Stepper:
    """Not a module: its bound method is a plain function to the lint."""

    def __init__(self) -> None:
        self.weight = torch.ones(WIDTH)

    def step(self, x):
        return x * self.weight


def test_a_bound_method_of_an_object_that_is_no_module_is_linted_without_a_model():
    assert lint_step(Stepper().step, [(X0,), (X1,)]).clean  # its weight is not judged: no model says


def test_a_step_of_python_values_alone_runs_on_the_cpu():
    assert lint_step(lambda n: torch.arange(4) * n, [(2,), (3,)]).findings[0].kind == "python-value"


SCRATCH = torch.zeros(1, WIDTH)  # no module holds it


class WritesOutside(Case):
    def forward(self, x):
        torch.mul(x, 2, out=SCRATCH)  # written, not made: the out= argument comes in as a keyword
        return SCRATCH + 1


def test_an_outside_tensor_written_through_out_is_the_steps_state_where_it_is_read_too():
    # a graph writes it at every replay before reading it, as eager does
    assert lint_step(Net(WritesOutside()).eval(), [(X0,), (X1,)]).clean
