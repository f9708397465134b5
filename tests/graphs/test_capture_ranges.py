"""A capture knows which module issued each op: the ranges open at capture, kept per tape entry.

A replay runs no Python, so no range fires under it (docs/design.md, "Attribution under replay"): what
module an op belongs to has to be recorded while capturing, which is what `TapeGraph.op_ranges` is.
"""

import torch

from graphrt.graphs import capture
from graphrt.measure import nvtx, range_names
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model


def _tiny_step():
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32, seed=0)
    model.setup_cache(1, 8)
    tokens = torch.zeros(1, 1, dtype=torch.long)
    positions = torch.zeros(1, dtype=torch.long)
    return model, lambda: model.decode_step(tokens, positions)


def test_every_op_of_a_captured_step_names_the_module_that_issued_it():
    model, step = _tiny_step()
    with torch.inference_mode(), nvtx.attach(model) as ranges:
        graph, _ = capture(step, device="cpu", warmup=0)

    assert len(graph.op_ranges) == len(graph)
    innermost = [stack[-1] for stack in graph.op_ranges]
    # Every projection is one matmul, and it is the only op issued inside a Linear's range.
    linears = [name for name in ranges.range_names if name.endswith(("(Linear)", "(PackedLinear)"))]
    assert len(linears) == 4 * model.config.num_hidden_layers + 1  # qkv o gate_up down, lm_head
    for name in linears:
        ops = [op for op, module in zip(graph.op_names, innermost) if module == name]
        assert len(ops) == 1 and ops[0].split(".")[1] in {"addmm", "mm", "linear"}, (name, ops)
    # A stack nests as the modules do: each range is a submodule of the one around it.
    for stack in graph.op_ranges:
        qualnames = [range_names.parse_range_name(name)[0] for name in stack]
        for outer, inner in zip(qualnames, qualnames[1:]):
            assert outer == "" or inner.startswith(outer + "."), stack


def test_ranges_opened_before_the_capture_are_not_in_the_stacks():
    model, step = _tiny_step()
    with torch.inference_mode(), nvtx.attach(model), nvtx.nvtx_range("capture[bs=1]"):
        graph, _ = capture(step, device="cpu", warmup=0)
    assert not any("capture[bs=1]" in stack for stack in graph.op_ranges)
    assert all(stack for stack in graph.op_ranges)


def test_without_ranges_attached_the_stacks_are_empty():
    _, step = _tiny_step()
    with torch.inference_mode():
        graph, _ = capture(step, device="cpu", warmup=0)
    assert graph.op_ranges == ((),) * len(graph)
