"""`graphrt run --model DIR` on a model that runs on transformers' own forward: what the user
sees. Bad input gets one line, before any weight is read; a run's JSON says which forward ran,
which mode was refused and why, and the config as the checkpoint's config.json holds it."""

import json
import shutil
import struct
import sys

import pytest
from conftest import train_tokenizer
from hf_checkpoints import lack_grouped_mm
from cli_checks import one_line_error

from graphrt.run.text import TOKENIZER_FILE

RUN = ("run", "--batch", 2, "--prompt-len", 6, "--steps", 4)


@pytest.fixture
def weightless_mistral(hf_checkpoint, tmp_path):
    """A copy of the mistral checkpoint whose weight file ends after its header: whatever is
    refused on it was refused before any weight was read (transformers cannot load it)."""
    directory = shutil.copytree(hf_checkpoint("mistral"), tmp_path / "mistral")
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    weights.write_bytes(data[:8 + header_size])
    return directory


def test_a_checkpoint_cut_short_is_refused_in_one_line_naming_it(cli, weightless_mistral):
    result = cli(*RUN, "--model", weightless_mistral)
    one_line_error(result, str(weightless_mistral), "transformers cannot load it as a causal LM")


def test_tp_on_a_transformers_model_is_refused_before_any_rank_starts(cli, weightless_mistral):
    result = cli(*RUN, "--model", weightless_mistral, "--tp", 2)
    # "--tp 2:", the launcher's refusal: a rank that started would refuse with "--tp:"
    one_line_error(result, "--tp 2: mistral runs on transformers' own forward", "leave out --tp")


def test_an_encoder_decoder_checkpoint_is_refused_naming_why(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    # its config.json alone: the refusal reads nothing else
    transformers.AutoConfig.for_model("t5", vocab_size=512, d_model=64, d_ff=128, num_layers=2,
                                      num_heads=4, d_kv=16).save_pretrained(tmp_path / "t5")
    result = cli(*RUN, "--model", tmp_path / "t5")
    one_line_error(result, str(tmp_path / "t5" / "config.json"), "model_type 't5' is an encoder-decoder model",
                   "decoder-only causal LMs")


def test_a_model_that_is_no_causal_lm_is_refused_with_transformers_reason(cli, weightless_mistral):
    transformers = pytest.importorskip("transformers")
    transformers.AutoConfig.for_model("vit", hidden_size=64).save_pretrained(weightless_mistral)
    one_line_error(cli(*RUN, "--model", weightless_mistral), str(weightless_mistral),
                   "transformers cannot load it as a causal LM", "ViTConfig")


def test_a_model_type_transformers_does_not_know_is_refused_naming_it(cli, weightless_mistral):
    config = weightless_mistral / "config.json"
    config.write_text(config.read_text().replace('"model_type": "mistral"', '"model_type": "nonsense_lm"'))
    one_line_error(cli(*RUN, "--model", weightless_mistral), str(weightless_mistral),
                   "transformers cannot load it as a causal LM", "nonsense_lm")


def test_a_model_with_a_recurrent_state_is_refused_naming_why(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("mamba", hidden_size=64, num_hidden_layers=2, vocab_size=512,
                                               state_size=4)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mamba")
    one_line_error(cli(*RUN, "--model", tmp_path / "mamba"),
                   "MambaForCausalLM keeps a recurrent state transformers' StaticCache does not hold")


def test_experts_on_a_model_without_experts_is_refused_before_its_weights_are_read(cli, weightless_mistral):
    result = cli(*RUN, "--model", weightless_mistral, "--experts", "batched_mm")
    one_line_error(result, "--experts batched_mm: mistral has no experts")


def test_an_unknown_experts_implementation_is_refused_listing_the_choices_before_transformers_loads(
        cli, hf_checkpoint, monkeypatch):
    directory = hf_checkpoint("mixtral")
    monkeypatch.setitem(sys.modules, "transformers", None)  # refused before it would be imported
    result = cli(*RUN, "--model", directory, "--experts", "nonsense")
    one_line_error(result, "--experts must be one of eager, batched_mm, grouped_mm, got 'nonsense'")


def test_grouped_mm_asked_for_where_the_device_lacks_it_is_refused_in_one_line(cli, hf_checkpoint, monkeypatch):
    lack_grouped_mm(monkeypatch)
    result = cli(*RUN, "--model", hf_checkpoint("mixtral"), "--experts", "grouped_mm")
    one_line_error(result, "--experts grouped_mm: transformers refuses it here",
                   "grouped_mm needs a newer torch on this device")


def test_experts_on_a_lean_model_is_refused_naming_the_step_it_runs(cli):
    one_line_error(cli(*RUN, "--model", "tiny", "--experts", "eager"),
                   "--experts eager: tiny runs on graphrt's step, which has no experts")


def test_prompts_of_different_lengths_are_refused_before_the_model_loads(cli, weightless_mistral):
    # transformers' StaticCache writes every row at one position
    tokenizer = train_tokenizer()
    tokenizer.save(str(weightless_mistral / TOKENIZER_FILE))
    prompts = ["The quick brown fox", "Graphs replay"]
    lengths = sorted(len(tokenizer.encode(p).ids) for p in prompts)
    assert lengths[0] != lengths[1]
    result = cli("run", "--model", weightless_mistral, "--steps", 4, "--prompt", prompts[0], "--prompt", prompts[1])
    one_line_error(result, f"--prompt: rows of {lengths} tokens", "give prompts of one length")


def test_impl_lean_on_an_architecture_graphrt_does_not_implement_is_refused_with_the_reason(cli, hf_checkpoint):
    directory = hf_checkpoint("mistral")
    one_line_error(cli(*RUN, "--model", directory, "--impl", "lean"),
                   str(directory / "config.json"), "model_type 'mistral' is not one of qwen2, qwen3, llama")


def test_without_transformers_a_transformers_model_names_the_extra_to_install(cli, hf_checkpoint, monkeypatch):
    directory = hf_checkpoint("mistral")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    one_line_error(cli(*RUN, "--model", directory, "--mode", "eager"),
                   "transformers is not installed", "pip install 'graphrt[hf]'")


def test_transformers_4_is_refused_naming_the_version_and_the_extra(cli, hf_checkpoint, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers, "__version__", "4.57.1")  # its cache API is not 5.x's
    one_line_error(cli(*RUN, "--model", hf_checkpoint("mistral")),
                   "needs transformers >= 5.24", "found 4.57.1", "pip install 'graphrt[hf]'")


def test_without_transformers_a_lean_model_still_runs(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    result = cli(*RUN, "--model", "tiny", "--mode", "eager")
    assert result.exit_code == 0, result.output
    assert "(no hf eager row: transformers is not installed)" in result.stdout


def test_json_says_transformers_ran_which_mode_was_refused_and_the_checkpoints_config(
        cli, hf_checkpoint, tmp_path):
    directory, out = hf_checkpoint("gemma3_text"), tmp_path / "run.json"
    result = cli(*RUN, "--model", directory, "--mode", "eager,graph", "--json", out)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    assert run["implementation"] == "transformers"
    assert run["config"] == json.loads((directory / "config.json").read_text())
    assert list(run["modes"]) == ["eager"]
    assert run["hf_ops_per_step"] is None  # transformers' step is the run's own: no second row
    why = run["refused"]["graph"]
    assert "in model (Gemma3TextModel): " in why
    # the table says the same in one line, and the run went on to count eager's step
    assert f"graph: not run: {why}" in result.stdout.splitlines()
    assert run["modes"]["eager"]["ops_per_step"] > 0


def test_json_of_a_model_every_mode_runs_refuses_nothing(cli, hf_checkpoint, tmp_path):
    out = tmp_path / "run.json"
    result = cli(*RUN, "--model", hf_checkpoint("mixtral"), "--mode", "eager,graph", "--json", out)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    assert (run["implementation"], run["refused"]) == ("transformers", {})
    assert run["config"]["num_local_experts"] == 4
    assert run["modes"]["graph"]["equivalence"]["identical"] is True
    assert run["modes"]["graph"]["generated_ids"] == run["modes"]["eager"]["generated_ids"]
