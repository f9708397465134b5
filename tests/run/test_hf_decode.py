"""Models that run on transformers' own forward: graphrt's eager decode is transformers' greedy
`generate`, token for token, and a graph replays eager's tokens or is refused in one line that
names the module.

Each architecture is decoded once per module (eager, then graph on the TapeGraph, CPU, fp32) and
the tests below read that one run."""

import pytest
import torch
from hf_checkpoints import ARCHITECTURES, LEAN, WITH_EXPERTS, greedy_generate, reference

from graphrt.run.execute import RunResult, run
from graphrt.run.spec import RunSpec

PROMPT_LEN, STEPS = 6, 6
# A Python int the step reads at capture: transformers' sliding-window layers keep their write
# position as one, so a replay would write every step at the position of its capture.
GRAPH_REFUSED = {"gemma3_text": "Gemma3TextModel", "gpt_oss": "GptOssModel"}
# (model_type, impl): every architecture on transformers' forward, the lean families by --impl hf
DECODED = [(name, "auto") for name in ARCHITECTURES] + [(name, "hf") for name in LEAN]


def decode_spec(directory, impl: str = "auto", mode: str = "eager,graph", **kwargs) -> RunSpec:
    return RunSpec(model=str(directory), mode=mode, batch=2, prompt_len=PROMPT_LEN, steps=STEPS,
                   device="cpu", dtype="float32", impl=impl, **kwargs)


@pytest.fixture(scope="module")
def decoded(hf_checkpoint):
    """(model_type, impl) -> its run's RunResult, decoded once for the module."""
    runs: dict[tuple[str, str], RunResult] = {}

    def result(model_type: str, impl: str) -> RunResult:
        if (model_type, impl) not in runs:
            runs[model_type, impl] = run(decode_spec(hf_checkpoint(model_type), impl))
        return runs[model_type, impl]

    return result


@pytest.mark.parametrize("model_type,impl", DECODED)
def test_eager_decodes_what_transformers_greedy_generate_decodes(decoded, hf_checkpoint, model_type, impl):
    result = decoded(model_type, impl)
    assert result.config.implementation == "hf"
    eager = result.generations["eager"].tokens  # prefill's token, then one per step
    assert eager.shape == (2, 1 + STEPS)
    assert not torch.equal(result.prompt[0], result.prompt[1])
    # a checkpoint whose greedy path repeats one token would agree with anything that repeats it
    assert all(len(set(row)) > 2 for row in eager.tolist()), eager
    expected = greedy_generate(reference(hf_checkpoint(model_type)), result.prompt, 1 + STEPS)
    assert eager.tolist() == expected.tolist()


@pytest.mark.parametrize("model_type,impl", DECODED)
def test_graph_replays_eager_tokens_or_is_refused_naming_the_module(decoded, model_type, impl):
    result = decoded(model_type, impl)
    if model_type in GRAPH_REFUSED:
        assert "graph" not in result.generations
        line = result.refused["graph"]
        assert "\n" not in line
        assert line.startswith("the capture refused the step: ")
        assert f" in model ({GRAPH_REFUSED[model_type]}): " in line
        assert "a Python value read at capture" in line
    else:
        assert result.refused == {}
        graph, eager = result.generations["graph"], result.generations["eager"]
        assert torch.equal(graph.tokens, eager.tokens)
        # a TapeGraph replays eager's very ops into the same tensors: bit for bit, not close
        assert all(torch.equal(g, e) for g, e in zip(graph.logits, eager.logits, strict=True))


@pytest.mark.parametrize("model_type", WITH_EXPERTS)
def test_every_experts_implementation_decodes_what_transformers_experts_loop_decodes(
        hf_checkpoint, model_type):
    directory = hf_checkpoint(model_type)
    expected = None
    for experts in ("eager", "batched_mm", "grouped_mm"):
        result = run(decode_spec(directory, mode="eager", experts=experts))
        if expected is None:
            expected = greedy_generate(reference(directory), result.prompt, 1 + STEPS).tolist()
        assert result.generations["eager"].tokens.tolist() == expected, experts


@pytest.mark.parametrize("model_type,expert_class",
                         [("qwen3_moe", "Qwen3MoeExperts"), ("mixtral", "MixtralExperts")])
def test_a_graph_refuses_transformers_experts_loop_naming_the_experts_module(
        hf_checkpoint, model_type, expert_class):
    # the loop takes as many tokens per expert as the router sent it: a shape from the data
    result = run(decode_spec(hf_checkpoint(model_type), experts="eager"))
    line = result.refused["graph"]
    assert f"in model.layers.0.mlp.experts ({expert_class}): " in line
    assert "its output shape depends on tensor data" in line
    assert "eager" in result.generations and "graph" not in result.generations


@pytest.mark.parametrize("model_type", LEAN)
def test_transformers_forward_decodes_what_graphrts_lean_step_decodes_on_one_checkpoint(
        decoded, hf_checkpoint, model_type):
    lean = run(decode_spec(hf_checkpoint(model_type), impl="lean", mode="eager"))
    assert lean.config.implementation == "lean"
    assert lean.generations["eager"].tokens.tolist() == decoded(model_type, "hf").generations["eager"].tokens.tolist()


def test_impl_hf_on_a_preset_decodes_what_the_lean_step_decodes_on_its_random_weights():
    # no checkpoint: transformers' model is built on the lean model's very tensors
    spec = dict(model="tiny", mode="eager", batch=2, prompt_len=PROMPT_LEN, steps=STEPS, device="cpu")
    hf, lean = run(RunSpec(**spec, impl="hf")), run(RunSpec(**spec))
    assert (hf.config.implementation, lean.config.implementation) == ("hf", "lean")
    tokens = hf.generations["eager"].tokens
    assert tokens.tolist() == lean.generations["eager"].tokens.tolist()
    assert all(len(set(row)) > 2 for row in tokens.tolist()), tokens


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.compiles
def test_compile_decodes_eager_tokens_on_a_dense_transformers_model(hf_checkpoint):
    torch._dynamo.reset()
    result = run(decode_spec(hf_checkpoint("mistral"), mode="eager,compile"))
    assert result.refused == {}
    assert torch.equal(result.generations["compile"].tokens, result.generations["eager"].tokens)
    torch._dynamo.reset()
