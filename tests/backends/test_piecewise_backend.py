"""Piecewise graphs generate exactly what eager generates, and split eager's step exactly.

A piecewise step is L+1 graphs (TapeGraphs on the CPU, CUDA graphs on a GPU) around L eager
attention cores. The CUDA test at the end counts its launches; test_graph_backend runs its checks
that hold for both graph backends (padded batches, reuse, CUDA equivalence, one pool).
"""

import pytest
import torch
from conftest import small_decodes
from hypothesis import HealthCheck, given, settings

from graphrt.backends.eager import EagerBackend
from graphrt.backends.piecewise import PiecewiseBackend
from graphrt.measure import nvtx
from graphrt.measure.opcount import op_names
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.run.decode import count_launches, decode, random_prompt
from graphrt.trace.analysis.markers import parse as step_marker

CPU = torch.device("cpu")


def decode_both(model, batch, prompt_len=6, steps=32, seed=0, buckets=None):
    """Eager, then piecewise, on one model and one cache."""
    piecewise = PiecewiseBackend(model, buckets)
    model.setup_cache(piecewise.cache_rows(batch), prompt_len + steps)
    piecewise.prepare(batch)
    prompt = random_prompt(batch, prompt_len, model.config.vocab_size, seed)
    eager = decode(EagerBackend(model), prompt, steps)
    return eager, decode(piecewise, prompt, steps), piecewise


def bitwise_equal(eager, other):
    return (torch.equal(eager.tokens, other.tokens) and len(eager.logits) == len(other.logits)
            and all(torch.equal(e, o) for e, o in zip(eager.logits, other.logits)))


@pytest.fixture(scope="module")
def tiny():
    return build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_piecewise_is_bitwise_eager_over_32_steps(tiny, batch):
    # buckets that hold each batch exactly: every matmul runs at eager's shapes
    eager, piecewise, _ = decode_both(tiny, batch, buckets=(1, 3, 8))
    assert len(piecewise.logits) == 32
    assert bitwise_equal(eager, piecewise)


def test_each_bucket_is_one_graph_per_stretch_between_attention_cores(tiny):
    _, _, backend = decode_both(tiny, 4, steps=2)
    layers = tiny.config.num_hidden_layers
    assert sorted(backend.graphs) == [1, 2, 4]
    for pieces, _ in backend.graphs.values():
        assert len(pieces.graphs) == layers + 1 and len(pieces.cores) == layers


def test_pieces_and_attention_cores_add_up_to_eager_step_op_for_op(tiny):
    batch = 2
    backend = PiecewiseBackend(tiny, buckets=(batch,))
    tiny.setup_cache(batch, 8)
    backend.prepare(batch)
    tokens = torch.tensor([[5], [7]])
    positions = torch.tensor([3, 4])
    with torch.inference_mode():
        eager = op_names(lambda: tiny.decode_step(tokens, positions))
        backend.tokens.copy_(tokens)
        backend.positions.copy_(positions)
        pieces, _ = backend.graphs[batch]
        # piece 0, core 0, piece 1, ..., piece L: the order one piecewise step runs them in;
        # a core's last op is its copy into the hand-off buffer, which eager has no need of
        split = list(pieces.graphs[0].op_names)
        for core, graph in zip(pieces.cores, pieces.graphs[1:]):
            core_ops = op_names(core)
            assert core_ops[-1] == "aten.copy_.default"
            split += core_ops[:-1] + list(graph.op_names)
    assert split == eager
    assert sum(len(graph) for graph in pieces.graphs) < len(eager)  # the cores are not in a graph


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_decodes(max_layers=3))
def test_piecewise_equals_eager_for_random_configs(case):
    config, batch, prompt_len, seed = case
    model = build_model(config, CPU, torch.float32, seed=seed)
    eager, piecewise, backend = decode_both(model, batch, prompt_len=prompt_len, steps=6, seed=seed)
    assert len(backend.graphs[batch][0].graphs) == config.num_hidden_layers + 1
    assert bitwise_equal(eager, piecewise)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
def test_cuda_piecewise_step_launches_one_graph_per_piece():
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.float32, seed=0)
    prompt_len, layers = 6, model.config.num_hidden_layers
    eager, piecewise, backend = decode_both(model, 1, prompt_len=prompt_len, steps=4)
    counted = count_launches([(EagerBackend(model), eager), (backend, piecewise)], prompt_len)
    eager_launches, launches = counted["eager"], counted["piecewise"]
    assert launches.graph_launches == layers + 1
    assert eager_launches.graph_launches == 0
    # the attention cores' kernels stay eager: fewer launches than eager's, more than none
    assert 0 < launches.kernel_launches < eager_launches.kernel_launches


def test_a_step_is_one_decode_step_range_around_its_pieces_and_cores(tiny):
    # `graphrt analyze` takes each decode_step[...] or replay[...] range for one step
    backend = PiecewiseBackend(tiny, buckets=(1,))
    tiny.setup_cache(1, 8)
    backend.prepare(1)
    with nvtx.record_to([]) as events, torch.inference_mode():
        backend.step(torch.tensor([[5]]), torch.tensor([3]))
    pushed = [name for kind, name in events if kind == "push"]
    layers = tiny.config.num_hidden_layers
    assert [name for name in pushed if step_marker(name)] == ["decode_step[piecewise,bs=1]"]
    inside = pushed[pushed.index("decode_step[piecewise,bs=1]") + 1:]
    assert inside == [name for i in range(layers) for name in (f"piece[bs=1,i={i}]", f"attend[bs=1,layer={i}]")
                      ] + [f"piece[bs=1,i={layers}]"]
