"""Model configuration: a validated dataclass, named presets with real shapes, and a reader for
Hugging Face `config.json` files.

One model serves three families, told apart by a few fields (`Family`): Qwen2 and Qwen2.5
(`qwen2`), Qwen3 dense (`qwen3`) and Llama 3.x (`llama`). Anything else is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError

DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(GraphrtError):
    """A ModelConfig that cannot describe a model graphrt runs."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name}: {problem}")
        self.problem = problem


@dataclass(frozen=True)
class Family:
    """What sets one family's layers apart from another's; everything else is shared."""

    architecture: str  # the HF class its config.json names in `architectures`
    qkv_bias: bool  # q/k/v projections carry a bias (o_proj never does)
    qk_norm: bool  # an RMSNorm over each head of q and of k, before rotary


FAMILIES: dict[str, Family] = {
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, qk_norm=False),  # Qwen2 and Qwen2.5
    "qwen3": Family("Qwen3ForCausalLM", qkv_bias=False, qk_norm=True),  # Qwen3 dense
    "llama": Family("LlamaForCausalLM", qkv_bias=False, qk_norm=False),  # Llama 2/3.x, Mistral-style
}

ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class Llama3Rope:
    """`rope_type: llama3` (Llama 3.1+): the inverse frequencies are rescaled once, by band of
    wavelength against the pretraining context (HF `_compute_llama3_parameters`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def problem(self) -> str | None:
        if not (self.factor > 0 and 0 < self.low_freq_factor < self.high_freq_factor
                and self.original_max_position_embeddings > 0):
            return (f"rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor "
                    f"and original_max_position_embeddings > 0, got {self}")
        return None


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
    model_type: str = "qwen2"  # the family, a key of FAMILIES
    rope_scaling: Llama3Rope | None = None  # None: plain RoPE

    def __post_init__(self) -> None:
        if (not self.head_dim and self.num_attention_heads > 0
                and self.hidden_size % self.num_attention_heads == 0):
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if (problem := self._problem()) is not None:
            raise ConfigError(self.name, problem)

    def _problem(self) -> str | None:
        """What is wrong with this config, in one phrase; None when nothing is."""
        if self.model_type not in FAMILIES:
            return f"model_type {self.model_type!r} is not one of {', '.join(FAMILIES)}"
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return f"{key} must be a positive integer, got {value!r}"
        if self.head_dim == 0:
            return (f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads}, and no head_dim is given")
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 0:
            return f"head_dim must be a positive integer, got {self.head_dim!r}"
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
        return self.rope_scaling and self.rope_scaling.problem()

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        qkv_rows = (self.num_attention_heads + 2 * self.num_key_value_heads) * d
        attn = h * qkv_rows + self.num_attention_heads * d * h  # q, k, v; o
        attn += qkv_rows * self.family.qkv_bias + 2 * d * self.family.qk_norm
        layer = attn + 3 * h * i + 2 * h  # gate, up, down; two norms
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head

    def to_hf_dict(self) -> dict[str, Any]:
        """The fields of a Hugging Face `config.json` for this model (transformers 5 reads
        `rope_parameters`; 4.x read the same dict as `rope_scaling`)."""
        d = asdict(self)
        d.pop("name")
        scaling = d.pop("rope_scaling")
        d.update(architectures=[self.family.architecture], hidden_act="silu", attention_dropout=0.0,
                 attention_bias=False, mlp_bias=False, sliding_window=None,
                 max_window_layers=d["num_hidden_layers"],
                 rope_parameters={"rope_type": "llama3" if scaling else "default",
                                  "rope_theta": self.rope_theta, **(scaling or {})})
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
        ModelConfig("qwen3-0.6b", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                    max_position_embeddings=40960, tie_word_embeddings=True, model_type="qwen3"),
        ModelConfig("llama-3.2-1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500_000.0,
                    tie_word_embeddings=True, model_type="llama",
                    rope_scaling=Llama3Rope(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=8192)),
        # Small enough for tests and a 2-core CPU, with GQA (2 query heads per KV head).
        ModelConfig("tiny", vocab_size=512, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="float32"),
    )
}

# Fields read from config.json, with the names they may appear under.
_HF_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads")
# Fields that mean mixture-of-experts layers, in the families' MoE siblings and Mixtral.
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def _architecture_problem(raw: dict[str, Any]) -> str | None:
    """Why config.json describes a model none of the families is, in one phrase; None if it is one.
    The family is checked first: every other field means something only within one."""
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        return f"model_type {model_type!r} is not one of {', '.join(FAMILIES)}"
    expected = [FAMILIES[model_type].architecture]
    if raw.get("architectures", expected) != expected:
        return f"architectures {raw['architectures']!r} is not {expected!r} (model_type {model_type})"
    for key in _EXPERT_FIELDS:
        if raw.get(key):
            return f"{key} {raw[key]!r}: mixture-of-experts layers are not supported (dense models only)"
    sliding = sorted({t for t in raw.get("layer_types") or () if t != "full_attention"})
    if sliding:
        return f"layer_types holds {', '.join(map(repr, sliding))}; graphrt runs full attention only"
    for key, value in (("hidden_act", "silu"), ("mlp_bias", False), ("partial_rotary_factor", 1.0)):
        if raw.get(key, value) != value:
            return f"{key} {raw[key]!r} is not supported (expected {value!r})"
    if model_type != "qwen2" and raw.get("attention_bias"):  # Qwen2's q/k/v bias is not a field
        return "attention_bias true is not supported (q/k/v and o_proj without bias)"
    return None


def _rope(raw: dict[str, Any]) -> tuple[float | None, Llama3Rope | None, str | None]:
    """rope_theta, the llama3 rescaling (or None) and what is wrong (or None), from any form:
    `rope_theta` at the top level or inside `rope_parameters` (transformers 5) or
    `rope_scaling` (4.x, where `type` was once `rope_type`)."""
    key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    rope = raw.get(key)
    rope = rope if isinstance(rope, dict) else {}
    theta = raw.get("rope_theta", rope.get("rope_theta"))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        return theta, None, f"{key} rope_type {rope_type!r} is not one of {', '.join(ROPE_TYPES)}"
    if rope_type == "default":
        return theta, None, None
    fields = {"original_max_position_embeddings": raw.get("max_position_embeddings"), **rope}
    try:
        return theta, Llama3Rope(*(fields[f] for f in Llama3Rope.__dataclass_fields__)), None
    except KeyError as e:
        return theta, None, f"{key} of rope_type llama3 lacks {e.args[0]}"


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
    if (problem := _architecture_problem(raw)) is not None:
        raise GraphrtError(f"{file}: {problem}")
    missing = [k for k in _HF_FIELDS if k not in raw]
    if "num_key_value_heads" in missing and "num_attention_heads" in raw:
        missing.remove("num_key_value_heads")  # absent means plain multi-head attention
    if missing:
        raise GraphrtError(f"{file}: missing field(s) {', '.join(missing)}")
    rope_theta, rope_scaling, problem = _rope(raw)
    if problem is not None:
        raise GraphrtError(f"{file}: {problem}")
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
            model_type=raw["model_type"],
            rope_scaling=rope_scaling,
        )
    except ConfigError as e:
        raise GraphrtError(f"{file}: {e.problem}") from None


def resolve(model: str) -> tuple[ModelConfig, Path | None]:
    """A preset by name (no checkpoint: random weights), or a HF model directory and its config."""
    if model in PRESETS:
        return PRESETS[model], None
    if not model.strip():
        raise GraphrtError(f"--model {model!r}: expected a preset ({', '.join(PRESETS)}) or a model directory")
    if "/" not in model and not Path(model).exists():
        raise GraphrtError(f"unknown model {model!r}: not a directory, and not a preset "
                           f"({', '.join(PRESETS)})")
    return from_hf_dir(model), Path(model)
