"""ModelConfig checks itself; config.json is read in every form HF has written it."""

import json

import pytest

from graphrt.config import PRESETS, ModelConfig, from_hf_dir, resolve
from graphrt.errors import GraphrtError

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
    # Qwen2 model cards: 0.49B, 1.54B, 7.62B parameters
    assert round(PRESETS["qwen2-0.5b"].num_parameters() / 1e9, 2) == 0.49
    assert round(PRESETS["qwen2-1.5b"].num_parameters() / 1e9, 2) == 1.54
    assert round(PRESETS["qwen2-7b"].num_parameters() / 1e9, 2) == 7.62


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 900}, "hidden_size 900 != num_attention_heads 14 x head_dim 64"),
    ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads 3"),
    ({"use_sliding_window": True}, "use_sliding_window is true"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"torch_dtype": "int8"}, "torch_dtype 'int8' is not one of"),
])
def test_invalid_configs_say_which_field(tmp_path, change, message):
    raw = {**QWEN2_0_5B, **change}
    if "hidden_size" in change:
        raw["head_dim"] = 64
    with pytest.raises(GraphrtError, match=message) as e:
        from_hf_dir(write(tmp_path, raw))
    assert str(e.value).startswith(str(tmp_path / "config.json"))


def test_missing_fields_are_listed(tmp_path):
    raw = {k: v for k, v in QWEN2_0_5B.items() if k not in ("vocab_size", "hidden_size")}
    with pytest.raises(GraphrtError, match="missing field\\(s\\) vocab_size, hidden_size"):
        from_hf_dir(write(tmp_path, raw))


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(GraphrtError, match="not a preset \\(qwen2-0.5b, qwen2-1.5b, qwen2-7b"):
        resolve("qwen3-0.6b")


def test_dataclass_checks_apply_to_presets_too():
    with pytest.raises(GraphrtError, match="num_attention_heads 4 is not divisible"):
        ModelConfig("bad", vocab_size=8, hidden_size=16, intermediate_size=8,
                    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=3)
