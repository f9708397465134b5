"""Graph replay generates exactly what eager generates (docs/design.md, Invariants, 1 and 4).

On a machine without CUDA the graph backend captures TapeGraphs, which follow the same rules
as CUDA graphs; the CUDA tests at the end run the same checks with real CUDA graphs.
"""

import time

import pytest
import torch
from conftest import FAMILY_CONFIGS, small_decodes
from hypothesis import HealthCheck, given, settings

from graphrt.backends.choices import default_buckets, parse_buckets
from graphrt.backends.eager import EagerBackend
from graphrt.backends.graph import GraphBackend
from graphrt.backends.piecewise import Pieces, PiecewiseBackend
from graphrt.errors import GraphrtError
from graphrt.graphs import GraphCaptureError
from graphrt.measure import nvtx
from graphrt.model.config import PRESETS
from graphrt.model.decoder import Qwen2ForCausalLM, greedy
from graphrt.model.weights import build_model, random_init
from graphrt.run.decode import decode, random_prompt
from graphrt.run.equivalence import compare

CPU = torch.device("cpu")
# both graph backends: the full step as one graph, and piecewise graphs around eager attention
GRAPH_BACKENDS = pytest.mark.parametrize("backend_class", [GraphBackend, PiecewiseBackend],
                                         ids=["graph", "piecewise"])


def decode_both(model, batch, prompt_len=6, steps=32, seed=0, graph=None, backend_class=GraphBackend):
    """Eager, then graph, on one model and one cache; the graph backend captured beforehand
    (or reused, when given)."""
    if graph is None:
        graph = backend_class(model)
        model.setup_cache(graph.cache_rows(batch), prompt_len + steps)
        graph.prepare(batch)
    prompt = random_prompt(batch, prompt_len, model.config.vocab_size, seed)
    eager = decode(EagerBackend(model), prompt, steps)
    return eager, decode(graph, prompt, steps), graph


@pytest.fixture(scope="module")
def tiny():
    return build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)


@pytest.mark.parametrize("batch", [1, 8])
def test_replay_is_bitwise_eager(tiny, batch):
    eager, graph, _ = decode_both(tiny, batch)
    eq = compare(eager, graph)
    assert eq.identical and eq.compared_steps == 32
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


@GRAPH_BACKENDS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", ["qwen2-untied", "qwen3", "llama3"])
def test_half_precision_replay_is_bitwise_eager(backend_class, dtype, family):
    # RMSNorm converts to fp32 and back: in half precision those are ops a replay must re-run
    model = build_model(FAMILY_CONFIGS[family], CPU, dtype, seed=0)
    eager, graph, _ = decode_both(model, 2, steps=8, backend_class=backend_class)
    assert torch.equal(eager.tokens, graph.tokens)
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


@GRAPH_BACKENDS
def test_padded_batch_generates_the_same_tokens(tiny, backend_class):
    # batch 3 replays the bucket-4 graph. Its logits equal eager's to float32 rounding, not
    # bitwise: the matmuls run with M=4 instead of 3, and CPU BLAS picks kernels by shape.
    eager, graph, backend = decode_both(tiny, 3, backend_class=backend_class)
    assert backend.bucket(3) == 4
    eq = compare(eager, graph)
    assert eq.identical, eq.describe()
    assert eq.max_abs_logit_diff <= 1e-5


@GRAPH_BACKENDS
def test_a_new_prefill_reuses_the_captured_graphs(tiny, backend_class):
    _, _, backend = decode_both(tiny, 8, backend_class=backend_class)
    captured = dict(backend.graphs)
    eager, graph, _ = decode_both(tiny, 8, seed=1, graph=backend)  # new prompt, same graphs
    assert backend.graphs == captured
    assert compare(eager, graph).identical
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


def test_recapture_replays_the_same(tiny):
    backend = GraphBackend(tiny)
    tiny.setup_cache(8, 38)
    backend.prepare(8)
    backend.prepare(8)  # capture again over the first
    eager, graph, _ = decode_both(tiny, 8, graph=backend)
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


def ragged_decode(backend, prompt, positions, steps):
    """Prefill `prompt` [B, T], then decode every row from its own position: the logits [B, V]
    of each step. What `decode` does when prompts of different lengths share a padded batch."""
    with torch.inference_mode():
        token = greedy(backend.prefill(prompt)[:, -1])
        positions, logits = positions.clone(), []
        for _ in range(steps):
            step = backend.step(token, positions).clone()
            logits.append(step)
            token, positions = greedy(step), positions + 1
    return logits


def test_replay_reads_each_rows_own_position(tiny):
    # rows at positions 3, 9, 6 and 12 of one bucket: the captured graph must take every row's
    # position from the static buffer, as eager takes it from the argument
    graph = GraphBackend(tiny)
    tiny.setup_cache(graph.cache_rows(4), 24)
    graph.prepare(4)
    prompt = random_prompt(4, 12, tiny.config.vocab_size, seed=3)
    positions = torch.tensor([3, 9, 6, 12])
    eager = ragged_decode(EagerBackend(tiny), prompt, positions, steps=6)
    replayed = ragged_decode(graph, prompt, positions, steps=6)
    assert all(torch.equal(e, r) for e, r in zip(eager, replayed))
    # and the positions mattered: the same rows decoded all from position 12 differ
    aligned = ragged_decode(EagerBackend(tiny), prompt, torch.full((4,), 12), steps=6)
    assert not torch.equal(aligned[0][:3], eager[0][:3])


def test_buckets_are_captured_largest_first(tiny):
    graph = GraphBackend(tiny, buckets=(1, 2, 4, 8))
    tiny.setup_cache(8, 16)
    with nvtx.record_to([]) as events:
        graph.prepare(8)
    captures = [name for kind, name in events if kind == "push" and name.startswith("capture[")]
    assert captures == ["capture[bs=8]", "capture[bs=4]", "capture[bs=2]", "capture[bs=1]"]
    assert list(graph.graphs) == [8, 4, 2, 1]


def bucket_graphs(backend: GraphBackend, bs: int) -> tuple:
    """The graphs bucket `bs` replays: one, or a piecewise step's pieces."""
    first = backend.graphs[bs][0]
    return first.graphs if isinstance(first, Pieces) else (first,)


TAPE_NOTE = ("TapeGraphs here: CUDA-graph semantics without a GPU, a correctness check, not a "
             "speed claim (launch overhead exists only on CUDA)")


@GRAPH_BACKENDS
def test_prepare_reports_each_buckets_memory_and_what_lint_and_capture_took(tiny, backend_class):
    backend = backend_class(tiny)
    tiny.setup_cache(4, 16)
    start = time.perf_counter()
    report = backend.prepare(4)
    wall = time.perf_counter() - start
    held = {bs: sum(graph.memory_bytes for graph in bucket_graphs(backend, bs)) for bs in (4, 2, 1)}
    # in capture order; a tape has no device memory of its own to report (CUDA graphs add device_bytes)
    assert list(report.buckets.items()) == [(bs, {"pool_bytes": n}) for bs, n in held.items()]
    assert report.memory_bytes == sum(held.values()) > 0
    assert 0 < report.lint_seconds and 0 < report.seconds and report.lint_seconds + report.seconds < wall
    assert backend.kind == "tape" and report.notes == [TAPE_NOTE]


def test_a_batch_above_the_captured_buckets_is_refused_at_the_step(tiny):
    backend = GraphBackend(tiny)
    tiny.setup_cache(4, 16)
    backend.prepare(4)  # buckets 1, 2, 4
    tokens, positions = torch.zeros(5, 1, dtype=torch.long), torch.zeros(5, dtype=torch.long)
    with pytest.raises(GraphrtError, match=r"^batch 5 exceeds the largest captured bucket 4$"):
        backend.step(tokens, positions)


def test_a_step_copies_its_inputs_in_then_replays_its_bucket(tiny):
    backend = GraphBackend(tiny)
    tiny.setup_cache(4, 16)
    backend.prepare(4)
    with nvtx.record_to([]) as events:
        backend.step(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    # no module ranges: on replay the model's Python does not run
    assert events == [("push", "copy_in"), ("pop", "copy_in"), ("push", "replay[bs=4]"), ("pop", "replay[bs=4]")]


@GRAPH_BACKENDS
def test_every_tensor_a_backend_makes_is_on_the_models_device(backend_class):
    # Under a meta default device, a tensor made without naming the model's device lands on
    # meta, and the run breaks or differs from eager: on a GPU the same slip puts a static
    # buffer on the CPU. Everything here, capture and decode included, runs under it.
    model = build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)
    prompt = random_prompt(2, 5, model.config.vocab_size, seed=0)
    with torch.device("meta"):
        backend = backend_class(model)
        model.setup_cache(backend.cache_rows(2), 5 + 6)
        backend.prepare(2)
        graph = decode(backend, prompt, steps=6)
        eager = decode(EagerBackend(model), prompt, steps=6)
    assert graph.tokens.device == CPU
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_decodes())
def test_replay_equals_eager_for_random_configs(case):
    config, batch, prompt_len, seed = case
    model = build_model(config, CPU, torch.float32, seed=seed)
    eager, graph, _ = decode_both(model, batch, prompt_len=prompt_len, steps=6, seed=seed)
    assert torch.equal(eager.tokens, graph.tokens)
    assert all(torch.equal(e, g) for e, g in zip(eager.logits, graph.logits))


def test_default_buckets_are_powers_of_two_up_to_the_batch():
    assert default_buckets(1) == (1,)
    assert default_buckets(3) == (1, 2, 4)
    assert default_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert default_buckets(40)[-1] == 64


@pytest.mark.parametrize("text, message", [
    ("1,two,4", "expected comma-separated integers"),
    ("0,1,2", "every bucket must be a positive integer"),
    ("1,4,2", "strictly increasing"),
    ("1,2,2,4", "strictly increasing"),
])
def test_malformed_buckets(text, message):
    with pytest.raises(GraphrtError, match=message):
        parse_buckets(text)


def test_batch_above_the_largest_bucket_is_an_error(tiny):
    backend = GraphBackend(tiny, buckets=(1, 2, 4))
    with pytest.raises(GraphrtError) as refused:
        backend.cache_rows(6)
    assert str(refused.value) == ("batch 6 exceeds the largest graph bucket 4 (--buckets 1,2,4); "
                                  "add a bucket of at least 6")


def test_a_step_before_any_capture_says_to_prepare_first(tiny):
    with pytest.raises(GraphrtError, match=r"^the graph backend has captured nothing yet: call prepare\(max_batch\) first$"):
        GraphBackend(tiny).step(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


class HostSyncQwen2(Qwen2ForCausalLM):
    """A step that reads a position back to the host: what invariant 2 forbids."""

    def decode_step(self, tokens, positions):
        last = int(positions.max())  # a host sync
        return super().decode_step(tokens, positions)[:, : last + 1]


def test_a_step_with_a_host_sync_fails_at_capture_naming_the_op():
    model = HostSyncQwen2(PRESETS["tiny"])
    random_init(model, seed=0)
    model.setup_cache(1, 16)
    with pytest.raises(GraphCaptureError, match=r"aten\.(item|_local_scalar_dense).*host sync"):
        GraphBackend(model).prepare(1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@GRAPH_BACKENDS
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_cuda_graph_replay_generates_eager_tokens(backend_class, batch):
    # bf16: logits within bf16 rounding of the values. A padded batch (3 -> bucket 4) runs other
    # GEMM shapes and cuBLAS may pick other kernels, so greedy tokens may part where eager's two
    # best logits are closer than that rounding: tokens must agree wherever the margin is wider.
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.bfloat16, seed=0)
    eager, graph, backend = decode_both(model, batch, backend_class=backend_class)
    assert backend.kind == "cuda"
    eq = compare(eager, graph)
    assert eq.max_abs_logit_diff <= 2e-2, eq.describe()
    if not eq.identical:
        step, seq = eq.first_divergence
        best, second = eager.logits[step][seq].topk(2).values.tolist()
        # each of the two logits may move by up to the largest difference, the other way
        assert best - second <= 2 * eq.max_abs_logit_diff, (
            f"{eq.describe()}: eager's top-2 margin there is {best - second:.3g}, wider than twice "
            "the largest logit difference, so rounding cannot explain it")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@GRAPH_BACKENDS
def test_cuda_buckets_share_one_pool_largest_first(backend_class):
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.float32, seed=0)
    backend = backend_class(model)
    model.setup_cache(8, 38)
    report = backend.prepare(8)
    assert list(backend.graphs) == [8, 4, 2, 1]  # capture order, largest first
    sizes = [report.buckets[b]["pool_bytes"] for b in (8, 4, 2, 1)]
    assert sizes[0] > 0 and sum(sizes[1:]) <= sizes[0]  # the smaller ones reuse its pool
