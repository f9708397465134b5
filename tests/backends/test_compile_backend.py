"""torch.compile of the same step generates what eager generates."""

import pytest
import torch

from graphrt.backends.compiled import CompileBackend
from graphrt.backends.eager import EagerBackend
from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.run.decode import decode, random_prompt
from graphrt.run.equivalence import compare

CPU = torch.device("cpu")


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.compiles
def test_compiling_happens_in_prepare_and_the_step_generates_eager_tokens():
    from torch._dynamo.utils import counters

    model = build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)
    model.setup_cache(2, 24)
    prompt = random_prompt(2, 8, model.config.vocab_size, seed=0)
    eager = decode(EagerBackend(model), prompt, steps=16)
    torch._dynamo.reset()
    counters.clear()
    backend = CompileBackend(model)
    report = backend.prepare(2)
    assert counters["stats"]["unique_graphs"] == 1  # the whole step, compiled in prepare
    compiled = decode(backend, prompt, steps=16)
    assert counters["stats"]["unique_graphs"] == 1  # no recompile inside the timed steps
    # what prepare reports is the compile: far longer than any step it made
    assert report.seconds > 10 * max(compiled.step_ms) / 1e3
    eq = compare(eager, compiled)
    assert eq.identical, eq.describe()
    # Inductor fuses and reorders float math: close, not bitwise
    assert eq.max_abs_logit_diff <= 1e-4
    torch._dynamo.reset()


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "")
    model = build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)
    model.setup_cache(1, 8)
    with pytest.raises(GraphrtError, match="needs a C\\+\\+ compiler"):
        CompileBackend(model).prepare(1)


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.compiles
def test_the_decode_loop_reuses_the_graph_prepare_compiled():
    # prepare() compiles with throwaway inputs; the decode loop then passes inference tensors.
    # Dynamo guards on its inputs' dispatch keys, so inputs made outside inference mode would
    # compile a second graph on the first real step: uncounted in the compile time, and inside
    # the loop that is being measured.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # counted per process, across resets
    model = build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)
    model.setup_cache(1, 12)
    backend = CompileBackend(model)
    backend.prepare(1)
    graphs_after_prepare = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    decode(backend, random_prompt(1, 4, model.config.vocab_size, seed=0), steps=4)
    assert graphs_after_prepare == 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.compiles
def test_a_whole_compile_run_timing_and_counting_compiles_the_step_once():
    # The count re-runs a step after the timing: its inputs must pass the same Dynamo guards
    # (inference tensors, contiguous) or the counted step is a fresh compile's warm-up.
    from graphrt.run import execute
    from graphrt.run.spec import RunSpec

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    result = execute.run(RunSpec(model="tiny", device="cpu", mode="compile", steps=6))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]
    assert len(result.generations["compile"].step_ms) == 6 - result.spec.warmup
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.inductor
@pytest.mark.compiles
def test_a_reduce_overhead_compile_that_skips_its_cuda_graphs_is_noted_and_one_that_keeps_them_is_not():
    from graphrt.backends.compiled import watch_cudagraph_skips

    torch._dynamo.reset()
    with watch_cudagraph_skips() as kept:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4))  # the default mode wraps nothing in graphs
    # on a CPU tensor reduce-overhead cannot wrap Inductor's code in a CUDA graph: a skip, counted
    with watch_cudagraph_skips() as skipped:
        torch.compile(lambda x: x * 3 - 1, mode="reduce-overhead")(torch.ones(4))
    torch._dynamo.reset()
    assert kept.count == 0 and kept.note() is None
    assert skipped.count >= 1
    assert "torch.compile skipped its CUDA graphs" in skipped.note()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.inductor
@pytest.mark.compiles
def test_a_reduce_overhead_compile_on_cuda_that_skips_its_graphs_says_inductors_reason():
    from graphrt.backends.compiled import watch_cudagraph_skips

    torch._dynamo.reset()
    with watch_cudagraph_skips() as skipped:  # a CPU tensor beside a CUDA one: one graph cannot hold both
        torch.compile(lambda x, y: x * 2 + y.sum().to(x.device), mode="reduce-overhead")(
            torch.ones(4, device="cuda"), torch.ones(4))
    torch._dynamo.reset()
    assert skipped.count >= 1
    assert "skipping cudagraphs due to" in skipped.note()
