"""What a lint report says, word for word: its head line, one indented line per finding, and
the way values, tensors and runs of ops are shown in a line.

The zoo in test_lint.py checks each finding names its op, module and values; these pin the
whole text a user reads, for one step of each kind.
"""

from __future__ import annotations

import re

import pytest
import torch
from test_lint import SLOTS, WIDTH, X0, X1, BranchOnData, Case, IntPosition, Net, RandomNoise, ReboundCounter

from graphrt.graphs import GraphCaptureError, capture, lint_step
from graphrt.graphs.findings import show_value
from graphrt.measure import nvtx

OFFSET = torch.ones(WIDTH)  # a module-level tensor: no module attribute names it
TABLE = torch.ones(SLOTS, WIDTH)  # another, read through an index


def report_text(step, states) -> str:
    """The report, its timing (the one figure that varies) replaced by `T`."""
    with torch.inference_mode():
        text = str(lint_step(step, states))
    return re.sub(r"\(\d+\.\d\d s\)$", "(T)", text, count=1, flags=re.M)


class GlobalOffset(Case):
    def forward(self, x):
        return self.proj(x) + OFFSET


class ConstantFromPython(Case):
    def forward(self, x):
        return self.proj(x) * torch.tensor([2.0])  # the same data every call: nothing to freeze


class PositionsFromPython(Case):
    def forward(self, x, n: int):
        return x.sum() + torch.tensor([float(i) for i in range(n)]).sum()


def branchy(x, flag: bool):
    if flag:
        return x.sin().cos().exp().tanh()
    return x.sigmoid().neg().abs()


def branchy_short(x, flag: bool):
    y = x + 1
    if flag:
        return y.sin()
    return y.neg().abs().exp()


def test_a_clean_step_reports_no_findings_in_one_line():
    assert report_text(Net(ConstantFromPython()).eval(), [(X0,), (X1,)]) == (
        "lint: no findings over 2 captures of 4 ops (T)")


def test_one_finding_is_the_head_line_and_one_indented_line():
    assert report_text(Net(IntPosition()).eval(), [(X0, 5), (X1, 6)]) == (
        "lint: 1 finding over 2 captures of 5 ops (T)\n"
        "  aten.select.int in body (IntPosition): argument index is 5 in capture 1 and 6 in "
        "capture 2: a Python value read at capture; replay uses 5 forever; pass it in a static "
        "input tensor")


def test_a_tensor_attribute_is_named_with_its_dtype_shape_and_device():
    assert report_text(Net(ReboundCounter()).eval(), [(X0,), (X1,)]) == (
        "lint: 2 findings over 2 captures of 4 ops (T)\n"
        "  body.counter: attribute body.counter changed during the step (a int64 [1] tensor -> a "
        "int64 [1] tensor): a replay runs no Python, so it never changes again (and ops that read "
        "it replay the captured value)\n"
        "  aten.add.Tensor in body (ReboundCounter): argument self is body.counter, a plain tensor "
        "attribute (int64 [1] on cpu), neither a static input nor made inside the step: replay uses "
        "it where it lies and sees no update made outside the step; register it as a buffer or pass "
        "it in as an input")


def test_a_tensor_attribute_of_the_model_itself_is_named_without_a_prefix():
    assert report_text(ReboundCounter().eval(), [(X0,), (X1,)]).splitlines()[2].startswith(
        "  aten.add.Tensor in (ReboundCounter): argument self is counter, a plain tensor attribute")


def test_a_tensor_no_attribute_holds_is_a_tensor_of_its_dtype_and_shape():
    assert report_text(Net(GlobalOffset()).eval(), [(X0,), (X1,)]).splitlines()[1] == (
        "  aten.add.Tensor in body (GlobalOffset): argument other is a tensor (float32 [8] on cpu), "
        "neither a static input nor made inside the step: replay uses it where it lies and sees no "
        "update made outside the step; register it as a buffer or pass it in as an input")


def test_a_random_op_in_a_module_in_eval_mode_does_not_blame_training_mode():
    assert report_text(Net(RandomNoise()).eval(), [(X0,), (X1,)]).splitlines()[1] == (
        "  aten.randn_like.default in body (RandomNoise): random ops are not supported by TapeGraph "
        "(replay would repeat the captured random numbers); keep dropout and sampling out of the "
        "step; a CUDA graph draws new numbers on each replay, but not eager's, so the step cannot "
        "be checked against eager")  # and no word of training mode


def test_runs_of_ops_show_their_count_and_at_most_three_names():
    assert report_text(branchy, [(X0, True), (X1, False)]).splitlines()[1] == (
        "  aten.sin.default in the step, outside any module: capture 1 runs 4 ops (aten.sin.default, "
        "aten.cos.default, aten.exp.default, …) where capture 2 runs 3 ops (aten.sigmoid.default, "
        "aten.neg.default, aten.abs.default): Python control flow on a value that changed; replay "
        "always runs capture 1's ops")
    assert "capture 1 runs 1 op (aten.sin.default) where capture 2 runs 3 ops (aten.neg.default, " \
           "aten.abs.default, aten.exp.default):" in report_text(branchy_short, [(X0, True), (X1, False)])


def test_a_python_tensor_too_large_to_show_is_compared_by_shape():
    # 20 values are more than a finding shows (SHOWN_VALUES): that capture's tensor is its shape
    lines = report_text(Net(PositionsFromPython()).eval(), [(X0, 20), (X1, 8)]).splitlines()
    assert any(line.startswith("  aten.sum.default in body (PositionsFromPython): argument self is a "
                               "tensor built from Python data in the step (torch.tensor), float32 [20] "
                               "in capture 1 and [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] in capture 2")
               for line in lines), lines


@pytest.mark.parametrize("length, shown", [
    (58, "'" + "x" * 58 + "'"),  # a repr of 60 characters is shown whole
    (59, "'" + "x" * 56 + "..."),  # one more is cut to 57 and marked: 60 again
])
def test_a_long_value_is_cut_to_sixty_characters(length, shown):
    assert show_value("x" * length) == shown


def test_a_tape_refusal_names_the_innermost_of_the_open_ranges():
    model = Net(Net(BranchOnData())).eval()  # ranges: the model, body, body.body
    with torch.inference_mode(), nvtx.attach(model), pytest.raises(GraphCaptureError) as info:
        capture(lambda: model(X0, torch.tensor([3])), device="cpu", warmup=0)
    assert str(info.value).startswith("aten.is_nonzero.default in body.body (BranchOnData):")


class ReadsBack(Case):
    def forward(self, x):
        first = self.cache.sum(1).tolist()[0]  # never reaches the dispatcher: no aten op to see
        return self.proj(x) + first


def test_a_read_to_the_host_outside_the_dispatcher_is_a_refusal_in_its_module():
    assert report_text(Net(ReadsBack()).eval(), [(X0,), (X1,)]) == (
        "lint: 1 finding over 2 captures of 6 ops (T)\n"
        "  Tensor.tolist in body (ReadsBack): operation not permitted while capturing (a host sync: "
        ".item(), .tolist(), int(tensor)); keep step inputs as device tensors")


class PythonDataOrInput(Case):
    def forward(self, x, from_python: bool):
        other = torch.tensor([3.0, 4.0]) if from_python else x[:2]
        return x + other.sum()


def test_a_tensor_that_changes_origin_is_shown_as_each_capture_gave_it():
    lines = report_text(Net(PythonDataOrInput()).eval(), [(X0, True), (X1, False)]).splitlines()
    assert lines[2] == (
        "  aten.sum.default in body (PythonDataOrInput): argument self is a tensor built from "
        "Python data in the step holding [3.0, 4.0] in capture 1 and input 0 of the step in "
        "capture 2: replay reads capture 1's tensor forever")


class GatherOutside(Case):
    def forward(self, x, rows):
        return x + TABLE[rows].sum(0)  # aten.index.Tensor(self, indices=[rows])


def test_the_arguments_before_a_list_of_tensors_are_judged_too():
    assert [f.kind for f in lint_step(Net(GatherOutside()).eval(), [(X0, torch.tensor([1])), (X1, torch.tensor([2]))]
                                      ).findings] == ["outside-tensor"]
    assert report_text(Net(GatherOutside()).eval(), [(X0, torch.tensor([1])), (X1, torch.tensor([2]))]) == (
        "lint: 1 finding over 2 captures of 3 ops (T)\n"
        "  aten.index.Tensor in body (GatherOutside): argument self is a tensor (float32 [16, 8] on cpu), "
        "neither a static input nor made inside the step: replay uses it where it lies and sees no update "
        "made outside the step; register it as a buffer or pass it in as an input")


class Reshaped(Case):
    def forward(self, x, rows: int):
        return x.reshape(rows, -1).sum(0)


def test_a_list_argument_is_shown_as_a_tuple():
    assert report_text(Net(Reshaped()).eval(), [(X0, 1), (X0, 2)]).splitlines()[1] == (
        "  aten.reshape.default in body (Reshaped): argument shape is (1, -1) in capture 1 and (2, -1) in "
        "capture 2: a Python value read at capture; replay uses (1, -1) forever; pass it in a static "
        "input tensor")


def sine_or_cosine(x, sine: bool):
    made = [x.sin(), x.cos()]  # ops #0 and #1 in both captures
    return made[0 if sine else 1] * 2


def test_a_result_chosen_in_python_is_named_by_the_op_that_made_it_in_each_capture():
    assert report_text(sine_or_cosine, [(X0, True), (X1, False)]).splitlines()[1] == (
        "  aten.mul.Tensor in the step, outside any module: argument self is the result of op #0 in "
        "capture 1 and the result of op #1 in capture 2: replay reads capture 1's tensor forever")


class SixteenFromPython(Case):
    def forward(self, x, start: int):
        return x.sum() + torch.tensor([float(start + i) for i in range(16)]).sum()


def test_a_python_tensor_of_sixteen_values_is_shown_whole():
    # SHOWN_VALUES is 16: up to it a finding shows the values, past it the shape
    line = report_text(Net(SixteenFromPython()).eval(), [(X0, 0), (X1, 1)]).splitlines()[1]
    assert [f.kind for f in lint_step(Net(SixteenFromPython()).eval(), [(X0, 0), (X1, 1)]).findings] == [
        "python-tensor"]
    assert line.startswith(
        "  aten.sum.default in body (SixteenFromPython): argument self is a tensor built from Python data "
        "in the step (torch.tensor), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, "
        "13.0, 14.0, 15.0] in capture 1 and [1.0, "), line


def resized(x):
    return torch.mul(x, 2, out=torch.empty(0))  # the out tensor grows to x's shape: new memory


def test_an_op_that_moves_a_tensor_to_new_memory_is_a_refusal():
    assert report_text(resized, [(X0,), (X1,)]).splitlines()[1:] == [
        "  aten.mul.out in the step, outside any module: operation not permitted while capturing a tape "
        "(it moves a tensor to new memory); captured tensors must keep their memory"]


def python_constant(x, first: bool):
    constants = [torch.tensor([1.0]), torch.tensor([2.0])]  # lifted by ops #0 and #1 in both captures
    return x * constants[0 if first else 1]


def test_a_python_tensor_chosen_in_python_is_named_by_its_contents_in_each_capture():
    assert report_text(python_constant, [(X0, True), (X1, False)]).splitlines()[1:] == [
        "  aten.mul.Tensor in the step, outside any module: argument other is a tensor built from Python "
        "data in the step holding [1.0] in capture 1 and a tensor built from Python data in the step "
        "holding [2.0] in capture 2: replay reads capture 1's tensor forever"]


HOST_SCALE = torch.tensor(2.0)  # on the CPU, where no step of these runs


def scaled_on_meta(x, python_scale: bool):
    # a 0-dim CPU tensor may meet a tensor on any device; one built from Python data is judged
    # by its contents instead
    return x * (torch.tensor(2.0) if python_scale else HOST_SCALE)


@pytest.mark.parametrize("python_scale, lines", [
    (False, ["  aten.mul.Tensor in the step, outside any module: argument other is a tensor (float32 [] on cpu), "
             "on the host while the step runs on meta: a CUDA graph records no host work, so replay reads it "
             "as it was at capture; keep it on meta"]),
    (True, []),
], ids=["outside", "from-python"])
def test_a_host_tensor_in_a_step_on_another_device_is_named(python_scale, lines):
    states = [(torch.zeros(4, device="meta"), python_scale)] * 2
    assert report_text(scaled_on_meta, states).splitlines()[1:] == lines
    assert [f.kind for f in lint_step(scaled_on_meta, states).findings] == ["host-tensor"] * len(lines)


INDEX = torch.tensor([0, 2])


class SelectOutside(Case):
    def forward(self, x):
        return x.index_select(1, INDEX)  # the tensor comes after a Python int


def test_a_tensor_argument_after_a_python_value_is_judged_too():
    assert report_text(Net(SelectOutside()).eval(), [(X0,), (X1,)]).splitlines()[1:] == [
        "  aten.index_select.default in body (SelectOutside): argument index is a tensor (int64 [2] on cpu), "
        "neither a static input nor made inside the step: replay uses it where it lies and sees no update "
        "made outside the step; register it as a buffer or pass it in as an input"]
