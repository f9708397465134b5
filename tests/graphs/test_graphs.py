"""Capture/replay semantics, shown on small steps.

A captured graph is a promise: `replay()` recomputes the static output in place from the
current contents of the tensors the step reads, running no Python. TapeGraph keeps that
promise on the CPU; CudaGraph (tests marked `cuda`) keeps it with `torch.cuda.CUDAGraph`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from custom_ops import KERNELS_RUN, ops
from hypothesis import given, settings, strategies as st

from graphrt.errors import GraphrtError
from graphrt.graphs import CudaGraph, GraphCaptureError, TapeGraph, capture, graph_kind, new_pool
from graphrt.graphs.pool import device_bytes_taken
from graphrt.measure.opcount import count_ops, op_names

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BATCH, WIDTH, CACHE_LEN = 3, 16, 8


class TinyDecoder:
    """A decode-shaped step: static inputs, a static cache written at a position tensor."""

    def __init__(self, device: str = "cpu") -> None:
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.randn(4 * WIDTH, WIDTH, generator=g).to(device)
        self.b1 = torch.randn(4 * WIDTH, generator=g).to(device)
        self.w2 = torch.randn(WIDTH, 4 * WIDTH, generator=g).to(device)
        self.x = torch.zeros(BATCH, WIDTH, device=device)  # static input
        self.positions = torch.zeros(BATCH, dtype=torch.long, device=device)  # static input
        self.cache = torch.zeros(BATCH, CACHE_LEN, WIDTH, device=device)

    def step(self) -> torch.Tensor:
        h = F.silu(F.linear(self.x, self.w1, self.b1))  # [B, 4W]
        y = F.linear(h, self.w2)  # [B, W]
        # Row b of the cache gets y[b] at positions[b]: flatten (b, position) into one index.
        flat = self.cache.view(BATCH * CACHE_LEN, WIDTH)
        rows = torch.arange(BATCH, device=self.x.device) * CACHE_LEN + self.positions
        flat.index_copy_(0, rows, y)
        scores = torch.einsum("bw,blw->bl", y, self.cache)  # [B, L]
        return torch.softmax(scores, dim=-1)

    def set_inputs(self, seed: int, positions: list[int]) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x.copy_(torch.randn(BATCH, WIDTH, generator=g))
        self.positions.copy_(torch.tensor(positions))


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    positions=st.lists(st.integers(0, CACHE_LEN - 1), min_size=BATCH, max_size=BATCH),
)
def test_replay_on_new_inputs_is_bitwise_the_eager_result(seed: int, positions: list[int]) -> None:
    model = TinyDecoder()
    graph, out = capture(model.step, device="cpu", warmup=0)
    assert isinstance(graph, TapeGraph)

    model.set_inputs(seed, positions)
    cache_before = model.cache.clone()
    graph.replay()
    replayed, replayed_cache = out.clone(), model.cache.clone()

    model.cache.copy_(cache_before)
    eager = model.step()
    assert torch.equal(replayed, eager)
    assert torch.equal(replayed_cache, model.cache)  # the cache write happened, at the new positions


@pytest.mark.parametrize(
    "step, op",
    [
        (lambda x: x.sum().item(), "aten._local_scalar_dense.default"),
        (lambda x: x[int(x.argmax())], "aten._local_scalar_dense.default"),
        (lambda x: x.tolist(), "Tensor.tolist"),
        (lambda x: x.nonzero(), "aten.nonzero.default"),
        (lambda x: x[x > 0], "aten.index.Tensor"),  # a boolean mask: shape depends on the data
    ],
    ids=["item", "int", "tolist", "nonzero", "mask-index"],
)
def test_capture_refuses_host_syncs_and_data_dependent_shapes_naming_the_op(step, op) -> None:
    x = torch.randn(5)
    with pytest.raises(GraphCaptureError) as info:
        capture(lambda: step(x), device="cpu")
    assert str(info.value).startswith(f"{op}: operation not permitted while capturing")
    assert isinstance(info.value, GraphrtError)


def test_a_host_sync_message_says_what_to_do() -> None:
    x = torch.randn(5)
    with pytest.raises(GraphCaptureError, match=r"_local_scalar_dense.*host sync.*keep step inputs as device tensors"):
        capture(lambda: x * x.max().item(), device="cpu")


def test_capture_fails_even_if_the_step_swallows_the_error() -> None:
    x = torch.randn(5)

    def step() -> torch.Tensor:
        try:
            return x * x.sum().item()
        except Exception:
            return x

    with pytest.raises(GraphCaptureError, match="_local_scalar_dense"):
        capture(step, device="cpu")


def test_integer_indexing_is_static_and_allowed() -> None:
    table = torch.randn(10, 4)
    positions = torch.tensor([2, 7])
    graph, out = capture(lambda: table[positions] * 2, device="cpu")
    positions.copy_(torch.tensor([0, 9]))
    graph.replay()
    assert torch.equal(out, table[torch.tensor([0, 9])] * 2)


def test_random_ops_are_refused_by_the_tape() -> None:
    x = torch.randn(5)
    with pytest.raises(GraphCaptureError, match="random ops are not supported"):
        capture(lambda: F.dropout(x, p=0.5, training=True), device="cpu")


def mask_assign(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[y > 0] = 0.0  # x[mask] = v finds the mask's nonzeros first
    return y


@pytest.mark.parametrize("step, op, reason", [
    (mask_assign, "aten.index_put_.default", "its output shape depends on tensor data"),
    (lambda x: torch.index_put(x, (x > 0,), torch.tensor(0.0)), "aten.index_put.default",
     "its output shape depends on tensor data"),
    (lambda x: torch.ops.aten._index_put_impl_(x, (x > 0,), torch.tensor(0.0)), "aten._index_put_impl_.default",
     "its output shape depends on tensor data"),
    # the meta device stands in for a GPU: host copies are refused, copies to the device are not
    (lambda x: x.to("meta").to("cpu"), "aten._to_copy.default", "it copies device data to the host"),
    (lambda x: x.copy_(x.to("meta")), "aten.copy_.default", "it copies device data to the host"),
    (lambda x: x.numpy(), "Tensor.numpy", "a host sync"),
    (lambda x: torch.mul(x, 2, out=torch.empty(0)), "aten.mul.out", "it moves a tensor to new memory"),
    (lambda x: torch.bernoulli(x.sigmoid()), "aten.bernoulli.default", "random ops are not supported"),
    (lambda x: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        x.view(1, 1, 1, 5), x.view(1, 1, 1, 5), x.view(1, 1, 1, 5), dropout_p=0.1),
     "aten._scaled_dot_product_flash_attention_for_cpu.default", "random ops are not supported"),
], ids=["mask-assign", "index-put", "index-put-impl", "to-host", "copy-to-host", "numpy", "out-resized",
        "bernoulli", "fused-attention-dropout"])
def test_capture_refuses_what_replay_could_not_repeat(step, op, reason) -> None:
    x = torch.randn(5)
    with pytest.raises(GraphCaptureError) as info:
        capture(lambda: step(x), device="cpu", warmup=0)
    assert str(info.value).startswith(f"{op}: ") and reason in str(info.value)


def test_fused_attention_without_dropout_is_allowed_and_replays() -> None:
    # the fused CPU attention op carries the random-op tag for its dropout; at dropout_p=0 it
    # is exact, and the decode step's attention must be capturable
    q = torch.randn(1, 2, 4, 8)
    graph, out = capture(lambda: F.scaled_dot_product_attention(q, q, q), device="cpu", warmup=0)
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in graph.op_names
    q.copy_(torch.randn(1, 2, 4, 8))
    graph.replay()
    assert torch.equal(out, F.scaled_dot_product_attention(q, q, q))


def test_assignment_at_integer_positions_is_static_and_allowed() -> None:
    y, where = torch.zeros(5), torch.tensor([1, 3])

    def step():
        y.zero_()
        y[where] = 1.0
        return y

    graph, out = capture(step, device="cpu", warmup=0)
    where.copy_(torch.tensor([0, 4]))
    graph.replay()
    assert out.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_python_scalars_are_frozen_at_capture() -> None:
    # Why every per-step value must be a device tensor (invariant 2): replay runs no Python,
    # so a step that reads a Python int keeps seeing the value it had at capture.
    x = torch.zeros(3)
    n = 1
    graph, out = capture(lambda: x + n, device="cpu")
    n = 100
    graph.replay()
    assert out.tolist() == [1.0, 1.0, 1.0]
    # The same value carried by a tensor follows along.
    n_tensor = torch.tensor(1.0)
    graph, out = capture(lambda: x + n_tensor, device="cpu")
    n_tensor.fill_(100.0)
    graph.replay()
    assert out.tolist() == [100.0, 100.0, 100.0]


def test_replay_writes_into_the_captured_output() -> None:
    model = TinyDecoder()
    graph, out = capture(model.step, device="cpu")
    address = out.data_ptr()
    model.set_inputs(seed=1, positions=[1, 2, 3])
    graph.replay()
    assert out.data_ptr() == address
    first = out.clone()
    model.set_inputs(seed=2, positions=[4, 5, 6])
    graph.replay()
    assert out.data_ptr() == address
    assert not torch.equal(out, first)  # overwritten in place: clone what must be kept


def test_an_in_place_update_of_a_static_input_is_seen_by_the_next_replay() -> None:
    x = torch.ones(4)
    w = torch.full((4,), 2.0)
    graph, out = capture(lambda: (x * w).sum(dim=0, keepdim=True), device="cpu")
    assert out.tolist() == [8.0]
    x.add_(1.0)
    graph.replay()
    assert out.tolist() == [16.0]
    x[2] = 10.0
    graph.replay()
    assert out.tolist() == [32.0]


third, half = ops.third, ops.half


def test_replay_is_bitwise_where_the_out_overload_rounds_differently() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    # the premise: replaying through third.out would change the last bits
    assert not torch.equal(third.out(x, out=torch.empty(1000)), third(x))
    graph, out = capture(lambda: third(x), device="cpu", warmup=0)
    x.copy_(torch.randn(1000, generator=torch.Generator().manual_seed(1)))
    graph.replay()
    assert torch.equal(out, third(x))  # the tape replays `third` itself and copies the result in


def test_an_out_overload_without_a_kernel_for_the_device_is_not_used() -> None:
    x = torch.randn(8)
    with pytest.raises(NotImplementedError, match="CPU"):  # the premise: no CPU kernel
        half.out(x, out=torch.empty(8))
    graph, out = capture(lambda: half(x), device="cpu", warmup=0)
    x.copy_(torch.arange(8.0))
    graph.replay()
    assert out.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]


def test_a_functional_op_without_an_out_overload_replays_with_its_keyword_arguments() -> None:
    x = torch.arange(4.0)
    graph, out = capture(lambda: ops.scaled(x, factor=5.0), device="cpu", warmup=0)
    x.copy_(torch.ones(4))
    graph.replay()
    assert out.tolist() == [5.0] * 4


def test_an_in_place_op_replays_with_its_keyword_arguments() -> None:
    x, y = torch.ones(3), torch.zeros(3)
    graph, out = capture(lambda: y.add_(x, alpha=2.0), device="cpu", warmup=0)
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    graph.replay()
    assert y.tolist() == [4.0, 6.0, 8.0]  # 2 from the capture, then 2 * x


def test_an_op_that_writes_an_argument_and_returns_a_new_tensor_replays_both() -> None:
    x, total = torch.arange(4.0), torch.zeros(())
    graph, out = capture(lambda: ops.tally(total, x, factor=3.0), device="cpu", warmup=0)
    assert total.item() == 6.0
    x.copy_(torch.ones(4))
    graph.replay()
    assert total.item() == 10.0 and out.tolist() == [3.0] * 4


def test_an_op_returning_the_argument_it_wrote_and_a_new_tensor_replays_both() -> None:
    x, total = torch.arange(4.0), torch.zeros(())
    graph, (written, made) = capture(lambda: ops.tally_both(total, x, factor=2.0), device="cpu", warmup=0)
    x.copy_(torch.full((4,), 2.0))
    graph.replay()
    assert written is total and total.item() == 14.0
    assert made.tolist() == [4.0] * 4


def test_an_op_tagged_random_with_its_dropout_off_is_replayed() -> None:
    # as fused attention ops are: the tag is for their dropout, here a keyword-only argument
    x = torch.ones(4)
    graph, out = capture(lambda: ops.noisy(x, dropout_p=0.0), device="cpu", warmup=0)
    assert len(graph) == 1 and out.tolist() == [1.0] * 4


@pytest.mark.parametrize("dropout", [{}, {"dropout_p": 0.1}], ids=["by-default", "given"])
def test_an_op_tagged_random_with_its_dropout_on_is_refused(dropout) -> None:
    with pytest.raises(GraphCaptureError, match=r"^graphrt_test\.noisy\.default: random ops are not supported"):
        capture(lambda: ops.noisy(torch.ones(4), **dropout), device="cpu", warmup=0)


def test_an_op_with_keyword_arguments_replays_through_its_out_overload_with_them() -> None:
    # shift.out is tried at capture with the op's own arguments (by=2, not its default 1): it
    # writes the same bits, so replay runs it, into the captured tensor, and nothing else.
    x = torch.ones(2)
    graph, out = capture(lambda: ops.shift(x, by=2.0), device="cpu", warmup=0)
    KERNELS_RUN.clear()
    x.fill_(5.0)
    graph.replay()
    assert KERNELS_RUN == ["shift.out"] and out.tolist() == [7.0, 7.0]


def test_a_python_int_an_op_returns_next_to_a_tensor_is_kept_and_only_the_tensor_replayed() -> None:
    x, total = torch.ones(3), torch.zeros(())
    graph, (doubled, count) = capture(lambda: ops.numbered(x, factor=2.0), device="cpu", warmup=0)
    graph_tally, (tallied, tally_count) = capture(lambda: ops.tally_numbered(total, x, factor=2.0), device="cpu",
                                                  warmup=0)
    x.fill_(5.0)
    graph.replay()
    graph_tally.replay()
    assert doubled.tolist() == tallied.tolist() == [10.0] * 3 and count == tally_count == 3
    assert total.item() == 3.0 + 15.0


def test_training_batch_norm_replays_its_output_and_running_statistics() -> None:
    # the real op of that kind: it updates the running mean and variance in place
    gen = torch.Generator().manual_seed(0)
    norm, x = torch.nn.BatchNorm1d(4).train(), torch.randn(8, 4, generator=gen)
    graph, out = capture(lambda: norm(x), device="cpu", warmup=0)
    x.copy_(torch.randn(8, 4, generator=gen))
    eager = torch.nn.BatchNorm1d(4).train()
    eager.load_state_dict(norm.state_dict())
    graph.replay()
    assert torch.equal(out, eager(x))
    assert torch.equal(norm.running_mean, eager.running_mean)
    assert torch.equal(norm.running_var, eager.running_var)


def test_an_op_returning_a_keyword_arguments_memory_is_a_view_not_an_op() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    assert op_names(lambda: ops.pick(a, b=b)) == []
    assert op_names(lambda: ops.scaled(b, factor=2.0)) == ["graphrt_test.scaled.default"]


def test_linear_with_a_bias_replays_bitwise_at_a_decode_shape() -> None:
    # linear.out with a bias can take another BLAS path than linear (an 8x896 input differs in
    # the last bits on some CPUs); whichever path the tape picks here, replay is eager's bits
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 1, 896, generator=gen)
    w, b = torch.randn(4864, 896, generator=gen), torch.randn(4864, generator=gen)
    with torch.inference_mode():
        graph, out = capture(lambda: F.linear(x, w, b), device="cpu")
        x.copy_(torch.randn(8, 1, 896, generator=gen))
        graph.replay()
        assert torch.equal(out, F.linear(x, w, b))


def test_tape_length_equals_the_op_count_of_an_eager_step() -> None:
    model = TinyDecoder()
    eager = op_names(model.step)
    graph, _ = capture(model.step, device="cpu")
    assert len(graph) == count_ops(model.step) == len(eager)
    assert graph.op_names == tuple(eager)
    # Views (view, transpose, expand...) are free and not counted; the index_copy_ is.
    assert "aten.index_copy_.default" in eager
    assert not any(name.startswith(("aten.view.", "aten.t.", "aten.expand.")) for name in eager)


def test_a_dtype_conversion_is_an_op_only_where_it_makes_new_memory() -> None:
    # Under inference mode (as a decode step runs) `x.float()` reaches the dispatcher as
    # `to.dtype`, declared a view because it may return its input: it is one only where it does.
    half = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert op_names(lambda: half.float()) == ["aten.to.dtype"]
        assert op_names(lambda: half.float().float()) == ["aten.to.dtype"]
        assert op_names(lambda: half.bfloat16()) == []


def test_a_dtype_conversion_is_replayed_not_frozen() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.inference_mode():
        graph, out = capture(lambda: (x.float() * 2).to(torch.bfloat16), device="cpu")
        x.copy_(torch.randn(2, 8, dtype=torch.bfloat16))
        graph.replay()
        assert torch.equal(out, (x.float() * 2).to(torch.bfloat16))


def test_memory_counts_each_storage_the_capture_allocated_once() -> None:
    weight = torch.randn(8, 8)
    x = torch.randn(2, 8)

    def step():
        y = x @ weight  # 2 * 8 float32 = 64 bytes, new
        z = torch.empty(2, 8)  # 64 bytes, new
        torch.mul(y, 2.0, out=z)  # writes into z: nothing new
        x.mul_(1.0)  # writes into the input: nothing new
        return y, y.view(16), y[0], z.t(), z, weight.t()

    graph, _ = capture(step, device="cpu")
    # y and z each once, however many views of them the tape and the output hold;
    # the weight and the input existed before the capture and are not counted.
    assert graph.memory_bytes == 64 + 64


def test_memory_counts_what_only_the_tape_holds_and_what_only_the_output_holds() -> None:
    weight, x = torch.randn(8, 8), torch.randn(2, 8)

    def step():
        hidden = x @ weight  # 64 bytes the tape keeps for the sum to read; not returned
        return hidden.sum(0), torch.empty(4)  # 32 bytes; 16 bytes no op of the tape holds

    graph, _ = capture(step, device="cpu")
    assert graph.memory_bytes == 64 + 32 + 16


def test_a_capture_warms_up_three_times_by_default_then_records_one_call_on_its_device() -> None:
    calls = []
    graph, _ = capture(lambda: calls.append(len(calls)) or torch.ones(1) * 2, device=torch.device("cpu"))
    assert len(calls) == 3 + 1 and graph.device == torch.device("cpu")


def test_an_op_handing_back_a_keyword_argument_is_a_view_the_tape_neither_replays_nor_holds() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    graph, out = capture(lambda: ops.pick(a, b=b), device="cpu", warmup=0)
    assert out is b and len(graph) == 0 and graph.memory_bytes == 0


def test_an_op_replayed_through_its_out_overload_keeps_its_keyword_arguments() -> None:
    x, y = torch.ones(3), torch.ones(3)
    graph, out = capture(lambda: torch.add(x, y, alpha=2.0), device="cpu", warmup=0)
    assert graph.op_names == ("aten.add.Tensor",)
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    graph.replay()
    assert out.tolist() == [3.0, 4.0, 5.0]


def test_ops_that_change_a_tensors_layout_in_place_replay_correctly() -> None:
    # `unsqueeze_` edits the Python tensor's metadata at capture; replay must still run the
    # earlier op with the layout it had then.
    a = torch.randn(3, 3)

    def step():
        y = a @ a
        y.unsqueeze_(0)
        y.add_(1.0)
        y.squeeze_(0)
        return y, torch.max(y, dim=1)  # a two-result op as well

    graph, (y, (values, indices)) = capture(step, device="cpu")
    a.copy_(torch.randn(3, 3))
    graph.replay()
    expected_y, (expected_values, expected_indices) = step()
    assert torch.equal(y, expected_y)
    assert torch.equal(values, expected_values) and torch.equal(indices, expected_indices)


def test_an_op_recorded_on_a_transposed_view_replays_with_that_layout() -> None:
    # y.t_() swaps y's strides in place; the sum recorded in between reduced y's columns. By
    # replay time y is untransposed again, so a replay with y's current layout would sum rows.
    a = torch.randn(3, 3)

    def step():
        y = a @ a
        y.t_()
        column_sums = y.sum(dim=0)
        y.t_()
        return column_sums

    graph, out = capture(step, device="cpu", warmup=0)
    a.copy_(torch.randn(3, 3))
    graph.replay()
    assert torch.equal(out, (a @ a).t().sum(dim=0))
    assert not torch.allclose(out, (a @ a).sum(dim=0))  # rows and columns differ here


def test_an_op_recorded_on_a_view_that_later_moves_in_its_storage_replays_where_it_read() -> None:
    # The sum reads elements 2..5 of y's storage; `as_strided_` then moves the view to start
    # at element 6. Replay must pin the offset it had as well as its shape and strides.
    a = torch.randn(3, 4)

    def step():
        view = (a * 2).view(12)[2:6]
        total = view.sum()
        view.as_strided_((4,), (1,), 6)
        return total

    graph, out = capture(step, device="cpu", warmup=0)
    a.copy_(torch.randn(3, 4))
    graph.replay()
    flat = (a * 2).view(12)
    assert torch.equal(out, flat[2:6].sum())
    assert not torch.equal(out, flat[6:10].sum())  # the two windows differ here


def test_the_guard_a_cuda_capture_runs_under_lets_random_ops_through_and_runs_each_op_as_called() -> None:
    # A CUDA graph replays random ops with fresh numbers, so a CUDA capture allows them; it
    # records nothing itself (torch.cuda.graph does), but still refuses a host sync.
    from graphrt.graphs.tape import CaptureMode

    x, y = torch.ones(3), torch.ones(3)
    with CaptureMode(record=False, allow_random=True) as guard:
        noise = torch.rand(3)
        y.add_(x, alpha=2.0)
        with pytest.raises(GraphCaptureError, match=r"aten\._local_scalar_dense\.default: .*host"):
            x.sum().item()
    assert guard.entries == [] and noise.shape == (3,) and y.tolist() == [3.0] * 3


def test_a_cuda_pool_needs_a_cuda_device() -> None:
    with pytest.raises(GraphrtError, match="graph kind 'cuda' needs a CUDA device, got device 'cpu'"):
        new_pool("cpu", kind="cuda")


def test_an_unknown_graph_kind_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(GraphrtError, match=r"^graph kind 'cudagraph' is not one of 'auto', 'cuda', 'tape'$"):
        capture(lambda: torch.ones(1) * 2, device="cpu", kind="cudagraph")


def test_a_negative_warmup_is_refused() -> None:
    with pytest.raises(GraphrtError, match="^warmup must be >= 0, got -1$"):
        capture(lambda: torch.ones(1) * 2, device="cpu", warmup=-1)


def test_a_cuda_capture_needs_a_cuda_device() -> None:
    with pytest.raises(GraphrtError, match="graph kind 'cuda' needs a CUDA device, got device 'cpu'"):
        capture(lambda: torch.ones(1) * 2, device="cpu", kind="cuda")


@pytest.mark.parametrize("device, kind", [("cuda", "cuda"), ("cuda:1", "cuda"), ("cpu", "tape"), ("meta", "tape")])
def test_auto_picks_a_cuda_graph_on_a_cuda_device_and_a_tape_elsewhere(device, kind) -> None:
    # graph_kind only names the implementation: no CUDA is needed to ask
    assert graph_kind(device) == graph_kind(torch.device(device), "auto") == kind
    assert graph_kind(device, "tape") == "tape"


def test_a_pool_for_another_kind_of_graph_is_rejected() -> None:
    pool = new_pool("cpu")
    with pytest.raises(GraphrtError, match="pool is for a tape graph on cpu"):
        capture(lambda: torch.zeros(1), device="meta", pool=pool)


@pytest.mark.cuda
@needs_cuda
def test_cuda_graph_replay_equals_eager() -> None:
    model = TinyDecoder("cuda")
    graph, out = capture(model.step, device="cuda")
    assert isinstance(graph, CudaGraph)
    model.set_inputs(seed=3, positions=[0, 5, 7])
    cache_before = model.cache.clone()
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    model.cache.copy_(cache_before)
    # fp32, not bitwise: the replay runs the kernels captured on a side stream, and cuBLAS
    # promises the same bits only for one stream and configuration (a tape is held to bitwise)
    torch.testing.assert_close(replayed, model.step(), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@needs_cuda
def test_cuda_captures_share_one_pool() -> None:
    # Buckets are captured largest first into one pool; each replays correctly on its own.
    weight = torch.randn(256, 256, device="cuda")
    inputs = torch.randn(8, 256, device="cuda")
    pool = new_pool("cuda")
    graphs = {}
    for bs in (8, 4):
        graphs[bs] = capture(lambda bs=bs: torch.relu(inputs[:bs] @ weight) @ weight, device="cuda", pool=pool)
    # The smaller capture fits in memory the larger one already reserved.
    assert graphs[4][0].memory_bytes <= graphs[8][0].memory_bytes
    inputs.copy_(torch.randn(8, 256, device="cuda"))
    for bs, (graph, out) in graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        # fp32 within the rounding of another summation order (captured on a side stream)
        torch.testing.assert_close(out, torch.relu(inputs[:bs] @ weight) @ weight, rtol=1e-5, atol=1e-4)


@pytest.mark.cuda
@needs_cuda
def test_cuda_capture_refuses_a_host_sync_naming_the_op() -> None:
    x = torch.randn(5, device="cuda")
    with pytest.raises(GraphCaptureError, match="_local_scalar_dense"):
        capture(lambda: x * x.sum().item(), device="cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_failed_cuda_capture_gives_the_callers_stream_back() -> None:
    # torch.cuda.graph makes its capture stream current and, when ending the capture raises,
    # never restores the previous one: every later op would queue on the capture stream.
    x = torch.randn(5, device="cuda")
    before = torch.cuda.current_stream()
    with pytest.raises(GraphCaptureError):
        capture(lambda: x * x.sum().item(), device="cuda")
    assert torch.cuda.current_stream() == before
    assert torch.equal(x * 2, x + x)  # and the device still computes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captures_into_one_pool_warm_up_and_capture_on_its_one_stream() -> None:
    # one side stream per pool: a fresh stream per capture strands a cuBLAS workspace each
    pool = new_pool("cuda")
    w = torch.randn(64, 64, device="cuda")
    free = []
    for rows in (32, 16, 8, 4):
        x = torch.randn(rows, 64, device="cuda")
        graph, _ = capture(lambda x=x: x @ w, device="cuda", pool=pool)
        free.append(graph.device_bytes)
    assert pool.stream is not None
    # a cuBLAS workspace is 32 MiB on Hopper: the later captures, on the same stream, take none
    assert max(free[1:]) < 16 << 20, [f / (1 << 20) for f in free]


def test_a_rise_in_free_memory_over_a_capture_is_no_graphs_memory_and_never_a_negative_figure() -> None:
    # free memory read before and after a capture; what another process (or a cache emptied
    # inside the window) released would otherwise come out as a graph of negative size
    assert device_bytes_taken(free_before=10 << 30, free_after=(10 << 30) - (3 << 20)) == 3 << 20
    assert device_bytes_taken(free_before=10 << 30, free_after=10 << 30) == 0
    assert device_bytes_taken(free_before=10 << 30, free_after=(10 << 30) + (39 << 20)) is None


@pytest.mark.cuda
@needs_cuda
def test_blocks_cached_before_a_capture_are_not_taken_off_its_device_figure() -> None:
    # an eager step's prefill logits, freed but cached by the allocator before the capture: the
    # device's free memory is read after they are released, so the graph's figure holds at
    # least what its pool reserved
    leftover = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del leftover  # cached, not returned to the device
    assert torch.cuda.memory_reserved() >= 64 << 20
    w = torch.randn(256, 256, device="cuda")
    x = torch.randn(64, 256, device="cuda")
    graph, _ = capture(lambda: torch.relu(x @ w) @ w, device="cuda")
    assert graph.device_bytes is not None and graph.device_bytes >= graph.memory_bytes
