"""The names and kinds of graphrt's NVTX ranges, without torch or NVTX: what a range is called
(`model.layers.3.self_attn (Qwen2Attention)`, `replay[bs=8]`), which kind of work a module range
holds, and the colour of each, for whoever writes ranges (graphrt.measure.nvtx) and whoever reads
them back from a trace."""

from __future__ import annotations

KINDS = ("attention", "mlp", "norm", "embedding", "lm_head", "other")

# ARGB colours, one per kind (matplotlib's tab10, so plots can use the same ones)
KIND_COLORS: dict[str, int] = {
    "attention": 0xFF1F77B4,
    "mlp": 0xFFFF7F0E,
    "norm": 0xFF2CA02C,
    "embedding": 0xFF9467BD,
    "lm_head": 0xFFD62728,
    "other": 0xFF7F7F7F,
}
# Named ranges take their colour from the stem before any `[...]`: `replay[bs=8]` -> replay.
STEP_COLORS: dict[str, int] = {
    "prefill": 0xFF17BECF,
    "decode_step": 0xFFBCBD22,
    "capture": 0xFFE377C2,
    "replay": 0xFF8C564B,
    "copy_in": 0xFFAEC7E8,
    "compile": 0xFFFFBB78,
    "record": 0xFFDBDB8D,  # graphrt trace: the steps a profiler records, after warmup
    "count": 0xFF9EDAE5,  # the one step whose launches are counted, after the timing
}
DEFAULT_STEP_COLOR = 0xFFC7C7C7

_ATTENTION_LEAVES = frozenset({"qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj"})
_MLP_LEAVES = frozenset({"gate_up_proj", "gate_proj", "up_proj", "down_proj"})


def module_range_name(qualname: str, module: object) -> str:
    """`model.layers.3.self_attn (Qwen2Attention)`; for the root (qualname "") the class alone in
    parentheses, `(Qwen2ForCausalLM)`, so every module range parses the same way."""
    cls = type(module).__name__
    return f"{qualname} ({cls})" if qualname else f"({cls})"


def parse_range_name(name: str) -> tuple[str, str]:
    """Reverse `module_range_name`: `model.norm (Qwen2RMSNorm)` -> `("model.norm", "Qwen2RMSNorm")`.

    Raises ValueError for a name that no module range has (e.g. `prefill`).
    """
    head, sep, cls = name.rpartition("(")
    if not sep or not name.endswith(")") or (head and not head.endswith(" ")):
        raise ValueError(f"{name!r} is not a module range name ('<qualname> (<class>)')")
    return head[:-1], cls[:-1]


def kind_of(qualname: str, module: object) -> str:
    """The kind (one of `KINDS`) of a module, from its qualified name and its class (or the
    class's name, as a trace has it).

    The order of the rules matters: `post_attention_layernorm` is a norm, not attention, and
    the rotary table (`Qwen2RotaryEmbedding` in HF, `RotaryTable` here) counts as attention, the
    only thing it feeds, not as an embedding. Projections take the kind of their block.
    """
    cls = (module if isinstance(module, str) else type(module).__name__).lower()
    parts = qualname.split(".") if qualname else []
    leaf = parts[-1] if parts else ""
    if leaf == "lm_head":
        return "lm_head"
    if "norm" in cls or leaf.endswith("norm"):
        return "norm"
    if "rotary" in cls or "rotary" in leaf:
        return "attention"
    if "embedding" in cls or leaf == "embed_tokens":
        return "embedding"
    if "attention" in cls or leaf in _ATTENTION_LEAVES or "self_attn" in parts:
        return "attention"
    if "mlp" in cls or leaf in _MLP_LEAVES or "mlp" in parts:
        return "mlp"
    return "other"
