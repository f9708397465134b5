"""`graphrt lint --model`: the lint `run` does before capture, on a model's decode step alone;
findings by module, exit 0 when clean and 1 otherwise; for a model with experts, each experts
implementation transformers offers, whether a graph captures its step and what it launches.

The checkpoints are tiny ones transformers makes and saves here, every parameter seeded."""

from __future__ import annotations

import json

import pytest
from cli_checks import one_line_error
import torch

# a tiny shape every architecture below takes (`graphrt run`'s tests of these models use it too)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
ARCHITECTURES = {
    "qwen2": {},
    # a sliding-window layer then a full one: transformers counts the sliding layer's writes in an int
    "gemma3_text": {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1},
}
# the lint's two captures at positions 11 and 12: past gemma3's window of 8 in both
SHORT = ("--batch", 2, "--max-seq-len", 24)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> a directory transformers saved: norms near 1, every other parameter small noise."""
    transformers = pytest.importorskip("transformers")
    made = {}
    for model_type, extra in ARCHITECTURES.items():
        config = transformers.AutoConfig.for_model(model_type, **TINY, **extra)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=generator)
                p.copy_(1 + 0.1 * noise if "norm" in name else 0.02 * noise)
        made[model_type] = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(made[model_type])
    return made


def lint(cli, tmp_path, *args):
    """`graphrt lint ARGS --json ...`: the result and the JSON it wrote."""
    out = tmp_path / "lint.json"
    result = cli("lint", *args, "--json", out)
    assert "Traceback" not in result.output
    return result, json.loads(out.read_text())


def test_transformers_qwen2_forward_with_its_static_cache_lints_clean_and_exits_0(cli, checkpoints, tmp_path):
    result, doc = lint(cli, tmp_path, "--model", checkpoints["qwen2"], "--impl", "hf", *SHORT)
    assert result.exit_code == 0, result.output
    assert doc["implementation"] == "transformers" and doc["architecture"] == "Qwen2ForCausalLM"
    assert doc["findings"] == [] and doc["clean"] and doc["captures"] and doc["experts"] is None
    assert "lint: no findings" in result.stdout and "verdict: clean" in result.stdout


def test_gemma3s_sliding_window_counter_is_a_python_value_named_by_module_and_exits_1(cli, checkpoints, tmp_path):
    result, doc = lint(cli, tmp_path, "--model", checkpoints["gemma3_text"], *SHORT)
    assert result.exit_code == 1, result.output
    assert not doc["clean"] and not doc["captures"] and doc["findings"]
    # that int and nothing else: the cache's tensors, written in place, are the step's state
    for finding in doc["findings"]:
        assert (finding["kind"], finding["op"], finding["module"]) == ("python-value", "aten.add.Tensor",
                                                                       "model (Gemma3TextModel)")
        assert "a Python value read at capture" in finding["text"]
    # printed under its module, the op and what differs indented beneath it
    lines = result.stdout.splitlines()
    at = lines.index("model (Gemma3TextModel)")
    assert lines[at + 1].startswith("  aten.add.Tensor: argument other is ")
    assert lines[-2].startswith("verdict: a graph would replay the step differently from eager")


@pytest.fixture(scope="module")
def moe_lint(checkpoints, tmp_path_factory):
    """qwen3_moe linted with the default experts implementation: the result and its JSON."""
    from click.testing import CliRunner

    from graphrt.cli.main import main

    out = tmp_path_factory.mktemp("moe") / "lint.json"
    result = CliRunner().invoke(main, ["lint", "--model", str(checkpoints["qwen3_moe"]),
                                       *map(str, SHORT), "--json", str(out)])
    return result, json.loads(out.read_text())


def test_moe_experts_eager_loop_cannot_be_captured_and_batched_mm_can(moe_lint):
    result, doc = moe_lint
    rows = {row["implementation"]: row for row in doc["experts"]}
    assert list(rows) == ["eager", "batched_mm", "grouped_mm"]
    eager = rows["eager"]
    assert not eager["captures"] and eager["findings"]
    # its routing takes shapes from the data and reads token counts back to the host, which a
    # capture refuses, in each layer's experts module; what follows from it stays in the MoE block
    refused = {f["module"] for f in eager["findings"] if f["kind"] == "refused"}
    assert refused == {f"model.layers.{i}.mlp.experts (Qwen3MoeExperts)" for i in range(2)}
    assert all(".mlp" in f["module"] for f in eager["findings"])
    assert rows["batched_mm"]["captures"] and rows["batched_mm"]["findings"] == []
    table = result.stdout[result.stdout.index("experts implementations"):].splitlines()
    assert table[1].split() == ["experts", "graph", "captures", "ops", "per", "step", "lint", "findings"]
    assert table[3].split()[:2] == ["eager", "no"] and table[4].split()[:2] == ["batched_mm", "yes"]


def test_moe_default_is_one_a_graph_captures_and_the_verdict_is_its(moe_lint):
    result, doc = moe_lint
    (default,) = [row for row in doc["experts"] if row["default"]]
    assert default["implementation"] == doc["experts_implementation"] != "eager"
    assert default["captures"] and doc["captures"] and doc["clean"] and result.exit_code == 0
    assert f"{default['implementation']} (default)" in result.stdout


def test_moe_ops_per_step_differ_by_implementation_as_each_one_launches(moe_lint):
    _, doc = moe_lint
    ops = {row["implementation"]: row["ops_per_step"] for row in doc["experts"]}
    # the eager loop runs ops per expert hit, batched_mm a few for all experts at once
    assert ops["eager"] > ops["batched_mm"] > 0


def test_experts_given_is_the_one_judged_and_the_default_is_still_named(cli, checkpoints, tmp_path):
    result, doc = lint(cli, tmp_path, "--model", checkpoints["qwen3_moe"], "--experts", "eager", *SHORT)
    assert result.exit_code == 1, result.output
    assert doc["experts_implementation"] == "eager" and doc["findings"] and not doc["captures"]
    defaults = [row["implementation"] for row in doc["experts"] if row["default"]]
    assert defaults and defaults != ["eager"]
    assert "experts eager" in result.stdout.splitlines()[0]


def test_the_lean_preset_lints_clean_on_graphrts_own_step(cli, tmp_path):
    result, doc = lint(cli, tmp_path, "--model", "tiny", *SHORT)
    assert result.exit_code == 0, result.output
    assert doc["implementation"] == "graphrt" and doc["architecture"] == "Qwen2ForCausalLM"
    assert doc["clean"] and doc["captures"] and doc["experts"] is None


def test_ops_per_step_is_the_figure_run_counts_for_its_eager_step(cli, tmp_path):
    _, doc = lint(cli, tmp_path, "--model", "tiny", *SHORT)
    out = tmp_path / "run.json"
    ran = cli("run", "--model", "tiny", "--mode", "eager", "--batch", 2, "--steps", 2, "--prompt-len", 4,
              "--json", out)
    assert ran.exit_code == 0, ran.output
    assert json.loads(out.read_text())["modes"]["eager"]["ops_per_step"] == doc["ops_per_step"]


@pytest.mark.parametrize("args, fragments, code", [
    (("--model", "no-such-model"), ("unknown model 'no-such-model'",), 1),
    (("--model", "tiny", "--batch", 0), ("--batch must be a positive integer, got 0",), 1),
    (("--model", "tiny", "--max-seq-len", 3), ("--max-seq-len", "3"), 2),
    (("--model", "tiny", "--device", "tpu"), ("--device must be auto, cpu or cuda",), 1),
    (("--model", "tiny", "--experts", "batched_mm"), ("--experts batched_mm: tiny runs on graphrt's step",), 1),
])
def test_bad_input_is_one_error_line(cli, args, fragments, code):
    one_line_error(cli("lint", *args), *fragments, code=code)


def test_an_experts_implementation_transformers_lacks_is_one_error_line(cli, checkpoints):
    one_line_error(cli("lint", "--model", checkpoints["qwen3_moe"], "--experts", "fastest"),
                   "--experts must be one of eager, batched_mm, grouped_mm, got 'fastest'")


def test_json_onto_a_directory_is_refused_before_the_model_loads(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    # a usage error (exit 2), where a model that does not exist would be exit 1
    one_line_error(cli("lint", "--model", "no-such-model", "--json", tmp_path / "taken"), "taken", code=2)
