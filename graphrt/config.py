"""Model configuration: a validated dataclass, named presets with real Qwen2 shapes, and a
reader for Hugging Face `config.json` files."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError

DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(GraphrtError):
    """A ModelConfig that cannot describe a Qwen2 model graphrt runs."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name}: {problem}")
        self.problem = problem


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    use_sliding_window: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if (problem := self._problem()) is not None:
            raise ConfigError(self.name, problem)

    def _problem(self) -> str | None:
        """What is wrong with this config, in one phrase; None when nothing is."""
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim",
                    "max_position_embeddings"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return f"{key} must be a positive integer, got {value!r}"
        if self.hidden_size != self.num_attention_heads * self.head_dim:
            return (f"hidden_size {self.hidden_size} != num_attention_heads "
                    f"{self.num_attention_heads} x head_dim {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            return (f"num_attention_heads {self.num_attention_heads} is not divisible by "
                    f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            return f"head_dim must be even for rotary embeddings, got {self.head_dim}"
        if self.use_sliding_window:
            return ("use_sliding_window is true; graphrt supports full attention only "
                    "(every released Qwen2 checkpoint sets it false)")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            return "rms_norm_eps and rope_theta must be positive"
        if self.torch_dtype not in DTYPES:
            return f"torch_dtype {self.torch_dtype!r} is not one of {', '.join(DTYPES)}"
        return None

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        kv = self.num_key_value_heads * d
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k, v (bias), o (no bias)
        layer = attn + 3 * h * i + 2 * h  # gate, up, down; two norms
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head

    def to_hf_dict(self) -> dict[str, Any]:
        """The fields of a Hugging Face Qwen2 `config.json` for this model."""
        d = asdict(self)
        d.pop("name")
        d.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu",
                 attention_dropout=0.0, sliding_window=None, max_window_layers=d["num_hidden_layers"])
        return d


PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("qwen2-0.5b", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    max_position_embeddings=131072, tie_word_embeddings=True),
        ModelConfig("qwen2-1.5b", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                    num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                    max_position_embeddings=131072, tie_word_embeddings=True),
        ModelConfig("qwen2-7b", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                    num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                    max_position_embeddings=131072, tie_word_embeddings=False),
        ModelConfig("qwen2.5-0.5b", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    max_position_embeddings=32768, tie_word_embeddings=True),
        # Small enough for tests and a 2-core CPU, with GQA (2 query heads per KV head).
        ModelConfig("tiny", vocab_size=512, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="float32"),
    )
}

# Fields read from config.json, with the names they may appear under.
_HF_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads")


def from_hf_dir(path: str | Path) -> ModelConfig:
    """Read a Hugging Face model directory's `config.json` (any of its known forms)."""
    path = Path(path)
    if not path.exists():
        raise GraphrtError(f"{path}: no such model directory (and not a preset: "
                           f"{', '.join(PRESETS)})")
    file = path / "config.json"
    if not file.is_file():
        raise GraphrtError(f"{path}: no config.json in this directory")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphrtError(f"{file}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise GraphrtError(f"{file}: expected a JSON object at the top level")
    missing = [k for k in _HF_FIELDS if k not in raw]
    if "num_key_value_heads" in missing and "num_attention_heads" in raw:
        missing.remove("num_key_value_heads")  # absent means plain multi-head attention
    if missing:
        raise GraphrtError(f"{file}: missing field(s) {', '.join(missing)}")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_theta = raw.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None)
    if rope_theta is None:
        raise GraphrtError(f"{file}: missing rope_theta (top-level or in rope_parameters)")
    dtype = raw.get("dtype", raw.get("torch_dtype")) or "bfloat16"
    fields = {k: raw[k] for k in _HF_FIELDS if k in raw}
    fields.setdefault("num_key_value_heads", raw["num_attention_heads"])
    try:
        return ModelConfig(
            name=path.name,
            **fields,
            head_dim=raw.get("head_dim") or 0,
            max_position_embeddings=raw.get("max_position_embeddings", 32768),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings")),
            torch_dtype=dtype,
            use_sliding_window=bool(raw.get("use_sliding_window")),
        )
    except ConfigError as e:
        raise GraphrtError(f"{file}: {e.problem}") from None


def resolve(model: str) -> tuple[ModelConfig, Path | None]:
    """A preset by name (no checkpoint: random weights), or a HF model directory and its config."""
    if model in PRESETS:
        return PRESETS[model], None
    if "/" not in model and not Path(model).exists():
        raise GraphrtError(f"unknown model {model!r}: not a directory, and not a preset "
                           f"({', '.join(PRESETS)})")
    return from_hf_dir(model), Path(model)
