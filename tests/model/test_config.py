"""ModelConfig checks itself; config.json is read in every form HF has written it."""

import json
from dataclasses import replace

import pytest

from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS, Llama3Rope, ModelConfig, from_hf_dir
from graphrt.model.resolve import resolve

QWEN2_0_5B = {  # Qwen/Qwen2-0.5B's config.json, in the transformers 4.x form
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 131072, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936, "model_type": "qwen2",
}


def write(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_real_qwen2_config_reads_as_the_preset(tmp_path):
    cfg = from_hf_dir(write(tmp_path, QWEN2_0_5B))
    preset = PRESETS["qwen2-0.5b"]
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "head_dim", "rope_theta",
                  "tie_word_embeddings", "torch_dtype"):
        assert getattr(cfg, field) == getattr(preset, field), field


def test_newer_form_with_dtype_and_rope_parameters(tmp_path):
    raw = dict(QWEN2_0_5B)
    raw.pop("torch_dtype"), raw.pop("rope_theta")
    raw.update(dtype="float16", rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    cfg = from_hf_dir(write(tmp_path, raw))
    assert (cfg.torch_dtype, cfg.rope_theta) == ("float16", 5e5)


def test_preset_parameter_counts_are_the_published_sizes():
    # model cards: Qwen2 0.49B, 1.54B, 7.62B; Qwen3-0.6B 0.60B (0.44B without embeddings);
    # Llama 3.2 1B 1.24B
    assert round(PRESETS["qwen2-0.5b"].num_parameters() / 1e9, 2) == 0.49
    assert round(PRESETS["qwen2-1.5b"].num_parameters() / 1e9, 2) == 1.54
    assert round(PRESETS["qwen2-7b"].num_parameters() / 1e9, 2) == 7.62
    qwen3 = PRESETS["qwen3-0.6b"]
    assert round(qwen3.num_parameters() / 1e9, 2) == 0.60
    assert round((qwen3.num_parameters() - qwen3.vocab_size * qwen3.hidden_size) / 1e9, 2) == 0.44
    assert round(PRESETS["llama-3.2-1b"].num_parameters() / 1e9, 2) == 1.24


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 900}, "hidden_size 900 is not divisible by num_attention_heads 14, and no head_dim is given"),
    ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads 3"),
    ({"use_sliding_window": True}, "use_sliding_window is true"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"torch_dtype": "int8"}, "torch_dtype 'int8' is not one of"),
])
def test_invalid_configs_say_which_field(tmp_path, change, message):
    raw = {**QWEN2_0_5B, **change}
    with pytest.raises(GraphrtError, match=message) as e:
        from_hf_dir(write(tmp_path, raw))
    assert str(e.value).startswith(str(tmp_path / "config.json"))


def test_missing_fields_are_listed(tmp_path):
    raw = {k: v for k, v in QWEN2_0_5B.items() if k not in ("vocab_size", "hidden_size")}
    with pytest.raises(GraphrtError, match="missing field\\(s\\) vocab_size, hidden_size"):
        from_hf_dir(write(tmp_path, raw))


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(GraphrtError, match="not a preset \\(qwen2-0.5b, qwen2-1.5b, qwen2-7b"):
        resolve("qwen4-1b")


def test_dataclass_checks_apply_to_presets_too():
    with pytest.raises(GraphrtError, match="num_attention_heads 4 is not divisible"):
        ModelConfig("bad", vocab_size=8, hidden_size=16, intermediate_size=8,
                    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=3)


TINY_FIELDS = dict(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                   num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("change, problem", [
    ({"hidden_size": 12, "num_attention_heads": 4, "num_key_value_heads": 4},
     "head_dim must be even for rotary embeddings, got 3"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
    ({"vocab_size": 8.0}, "vocab_size must be a positive integer, got 8.0"),
    ({"head_dim": -4}, "head_dim must be a positive integer, got -4"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer, got 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
    ({"hidden_size": 18}, "hidden_size 18 is not divisible by num_attention_heads 4, and no head_dim is given"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps and rope_theta must be positive"),
    ({"rope_theta": 0.0}, "rms_norm_eps and rope_theta must be positive"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"use_sliding_window": True}, "use_sliding_window is true; graphrt supports full attention only "
                                   "(every released Qwen2 checkpoint sets it false)"),
    ({"torch_dtype": "float64"}, "torch_dtype 'float64' is not one of float32, bfloat16, float16"),
], ids=["odd-head-dim", "bool-for-int", "float-for-int", "negative", "zero-positions",
        "zero-kv-heads", "heads-do-not-divide", "eps", "theta", "zero-heads", "sliding-window", "dtype"])
def test_a_config_that_graphrt_cannot_run_is_refused_with_its_problem(change, problem):
    with pytest.raises(GraphrtError) as e:
        ModelConfig("bad", **{**TINY_FIELDS, **change})
    assert str(e.value) == f"bad: {problem}"
    assert e.value.problem == problem


def test_head_dim_defaults_to_hidden_over_heads_and_may_be_given():
    assert ModelConfig("mha", **TINY_FIELDS).head_dim == 4
    wide = ModelConfig("wide", **{**TINY_FIELDS, "hidden_size": 32, "head_dim": 8})
    assert (wide.head_dim, wide.num_query_groups) == (8, 2)
    assert PRESETS["qwen2-7b"].num_query_groups == 7


def test_parameter_count_equals_the_built_models(tiny_config):
    import torch

    from graphrt.model.weights import build_model

    model = build_model(tiny_config, torch.device("cpu"), torch.float32)
    distinct = {id(p): p.numel() for p in model.parameters()}  # a tied matrix once
    assert tiny_config.num_parameters() == sum(distinct.values())


def write_text(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent", "no such model directory (and not a preset: qwen2-0.5b, qwen2-1.5b, "),
    (lambda d: d, "no config.json in this directory"),
    (lambda d: write_text(d, "{not json"), "invalid JSON"),
    (lambda d: write(d, [1, 2]), "expected a JSON object at the top level"),
    (lambda d: write(d, {k: v for k, v in QWEN2_0_5B.items() if k != "rope_theta"}),
     "missing rope_theta (top-level or in rope_parameters)"),
    (lambda d: write(d, {**{k: v for k, v in QWEN2_0_5B.items() if k != "rope_theta"},
                         "rope_scaling": "linear"}),
     "missing rope_theta (top-level or in rope_parameters)"),
], ids=["no-dir", "no-config", "bad-json", "not-object", "no-rope-theta", "rope-not-a-dict"])
def test_unreadable_model_directories_are_named(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(GraphrtError) as e:
        from_hf_dir(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_absent_kv_heads_means_multi_head_attention_and_defaults_apply(tmp_path):
    raw = {k: v for k, v in QWEN2_0_5B.items()
           if k not in ("num_key_value_heads", "torch_dtype", "max_position_embeddings",
                        "rms_norm_eps", "tie_word_embeddings", "use_sliding_window")}
    cfg = from_hf_dir(write(tmp_path, raw))
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 14
    assert (cfg.torch_dtype, cfg.max_position_embeddings, cfg.rms_norm_eps) == ("bfloat16", 32768, 1e-6)
    assert (cfg.tie_word_embeddings, cfg.use_sliding_window, cfg.name) == (False, False, tmp_path.name)


def test_every_field_given_is_read(tmp_path):
    raw = {**QWEN2_0_5B, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "head_dim": 64,
           "tie_word_embeddings": False, "rope_theta": 2e4, "torch_dtype": "float32"}
    cfg = from_hf_dir(write(tmp_path, raw))
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.head_dim) == (1e-5, 4096, 64)
    assert (cfg.tie_word_embeddings, cfg.rope_theta, cfg.torch_dtype) == (False, 2e4, "float32")
    assert from_hf_dir(write(tmp_path, QWEN2_0_5B)).tie_word_embeddings is True


def test_rope_theta_may_sit_in_rope_scaling(tmp_path):
    raw = {k: v for k, v in QWEN2_0_5B.items() if k != "rope_theta"}
    raw["rope_scaling"] = {"rope_type": "default", "rope_theta": 2.5e5}
    assert from_hf_dir(write(tmp_path, raw)).rope_theta == 2.5e5


def test_resolve_tells_presets_from_directories(tmp_path):
    assert resolve("tiny") == (PRESETS["tiny"], None)
    cfg, path = resolve(str(write(tmp_path, QWEN2_0_5B)))
    assert path == tmp_path and cfg.hidden_size == 896
    with pytest.raises(GraphrtError, match="unknown model 'qwen9': not a directory, and not a preset"):
        resolve("qwen9")


@pytest.mark.parametrize("preset, hf_class", [("qwen2-0.5b", "Qwen2Config"), ("qwen3-0.6b", "Qwen3Config"),
                                             ("llama-3.2-1b", "LlamaConfig")])
def test_the_hf_dict_is_a_config_transformers_reads_back(tmp_path, preset, hf_class):
    transformers = pytest.importorskip("transformers")
    preset = PRESETS[preset]
    d = preset.to_hf_dict()
    hf = transformers.AutoConfig.for_model(**d)  # picks the class by model_type
    assert type(hf).__name__ == hf_class
    assert (hf.architectures, hf.hidden_act, hf.attention_dropout) == ([preset.family.architecture], "silu", 0.0)
    assert (hf.num_hidden_layers, hf.num_key_value_heads, hf.tie_word_embeddings) == (
        preset.num_hidden_layers, preset.num_key_value_heads, preset.tie_word_embeddings)
    assert (hf.head_dim, hf.rope_parameters["rope_theta"]) == (preset.head_dim, preset.rope_theta)
    # and graphrt reads the same model back from it
    back = from_hf_dir(write(tmp_path, d))
    assert back == ModelConfig(**{**preset.__dict__, "name": tmp_path.name})


QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json: head_dim is its own field (16 x 128 != 1024)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B's config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


@pytest.mark.parametrize("raw, preset", [(QWEN3_0_6B, "qwen3-0.6b"), (LLAMA_3_2_1B, "llama-3.2-1b")])
def test_real_qwen3_and_llama_configs_read_as_their_presets(tmp_path, raw, preset):
    assert from_hf_dir(write(tmp_path, raw)) == replace(PRESETS[preset], name=tmp_path.name)


def test_llama3_rope_reads_from_rope_parameters_with_theta_inside(tmp_path):
    raw = {k: v for k, v in LLAMA_3_2_1B.items() if k not in ("rope_scaling", "rope_theta")}
    raw["rope_parameters"] = {**LLAMA_3_2_1B["rope_scaling"], "rope_theta": 5e5}
    del raw["rope_parameters"]["original_max_position_embeddings"]  # defaults to max_position_embeddings
    cfg = from_hf_dir(write(tmp_path, raw))
    assert cfg.rope_theta == 5e5
    assert cfg.rope_scaling == Llama3Rope(32.0, 1.0, 4.0, original_max_position_embeddings=131072)


@pytest.mark.parametrize("change, problem", [
    ({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]},
     "model_type 'qwen2_moe' is not one of qwen2, qwen3, llama"),
    ({"model_type": None}, "model_type None is not one of qwen2, qwen3, llama"),
    ({"architectures": ["MistralForCausalLM"]},
     "architectures ['MistralForCausalLM'] is not ['LlamaForCausalLM'] (model_type llama)"),
    ({"num_local_experts": 8}, "num_local_experts 8: mixture-of-experts layers are not supported (dense models only)"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     "layer_types holds 'sliding_attention'; graphrt runs full attention only"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_scaling rope_type 'yarn' is not one of default, llama3"),
    ({"rope_parameters": {"type": "dynamic", "factor": 2.0}},  # the 4.x key `type`
     "rope_parameters rope_type 'dynamic' is not one of default, llama3"),
    ({"rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
     "rope_scaling of rope_type llama3 lacks factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
     "rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (expected 'silu')"),
    ({"mlp_bias": True}, "mlp_bias True is not supported (expected False)"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported (expected 1.0)"),
    ({"attention_bias": True}, "attention_bias true is not supported (q/k/v and o_proj without bias)"),
], ids=["moe-type", "no-type", "architecture", "experts", "sliding-layers", "yarn", "old-type-key",
        "llama3-incomplete", "llama3-bands", "act", "mlp-bias", "partial-rotary", "attention-bias"])
def test_another_architecture_is_refused_in_one_line_naming_the_field(tmp_path, change, problem):
    with pytest.raises(GraphrtError) as e:
        from_hf_dir(write(tmp_path, {**LLAMA_3_2_1B, **change}))
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: {problem}") and "\n" not in message
