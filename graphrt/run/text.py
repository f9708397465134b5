"""Real text in and out: a model directory's `tokenizer.json`, read with Hugging Face's
`tokenizers` (the library behind HF's fast tokenizers, so the ids are the ones HF would use).

    tokenizer = load_tokenizer("path/to/Qwen2-0.5B")
    rows = encode_rows(tokenizer, ["The capital of France is"], batch=4)   # the prompt, 4 times
    texts = decode_rows(tokenizer, generation.tokens)                     # one string per row
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from graphrt.errors import GraphrtError, first_line
from graphrt.model.config import PRESETS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of a model directory; a clear error for a preset or a directory without one."""
    if model in PRESETS:
        raise GraphrtError(f"--prompt needs a model directory with a {TOKENIZER_FILE}; preset "
                           f"{model!r} has random weights and no tokenizer (use --prompt-len for random ids)")
    path = Path(model) / TOKENIZER_FILE
    if not path.is_file():
        raise GraphrtError(f"{path}: no such file, so --prompt cannot be encoded; give a model "
                           f"directory with a {TOKENIZER_FILE}, or leave --prompt out for random ids")
    from tokenizers import Tokenizer  # here: only a run with --prompt needs it loaded

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises its own Exception for any malformed file
        raise GraphrtError(f"{path}: not a tokenizer the tokenizers library reads ({first_line(e)})") from None


def encode_rows(tokenizer: Tokenizer, prompts: tuple[str, ...] | list[str], batch: int
                ) -> tuple[tuple[int, ...], ...]:
    """Token ids per batch row: one prompt repeated over `batch` rows, or one row per prompt
    (then `batch` must be 1, its default, or the number of prompts)."""
    if len(prompts) > 1 and batch not in (1, len(prompts)):
        raise GraphrtError(f"--batch {batch} with {len(prompts)} --prompt values: give one prompt "
                           f"for all rows or one --prompt per row")
    rows = []
    for prompt in prompts:
        ids = tuple(tokenizer.encode(prompt).ids)
        if not ids:
            raise GraphrtError(f"--prompt {prompt!r} encodes to no tokens; give some text")
        rows.append(ids)
    return tuple(rows * batch) if len(rows) == 1 else tuple(rows)


def decode_rows(tokenizer: Tokenizer, ids: torch.Tensor | list[list[int]]) -> list[str]:
    """Token ids [B, N] -> one string per row, special tokens kept (as HF's decode does)."""
    rows = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    return tokenizer.decode_batch(rows, skip_special_tokens=False)


def continuation_lines(tokenizer: Tokenizer, prompts: tuple[tuple[int, ...], ...],
                       generated: dict[str, torch.Tensor]) -> list[str]:
    """Each row's prompt, then what each mode generated after it, as quoted text."""
    quote = lambda text: json.dumps(text, ensure_ascii=False)  # noqa: E731 (shows \\n and spaces)
    texts = {mode: decode_rows(tokenizer, tokens) for mode, tokens in generated.items()}
    width = max(map(len, generated), default=0)
    lines = []
    for row, prompt in enumerate(decode_rows(tokenizer, [list(p) for p in prompts])):
        lines.append(f"row {row}: {quote(prompt)}")
        lines += [f"  {mode:<{width}} → {quote(texts[mode][row])}" for mode in generated]
    return lines


def add_text(doc: dict[str, Any], tokenizer: Tokenizer, generated: dict[str, torch.Tensor]) -> None:
    """Put the prompt's and each mode's text beside their ids in a `graphrt run` JSON document."""
    doc["prompt_text"] = decode_rows(tokenizer, doc["prompt_ids"])
    for mode, tokens in generated.items():
        doc["modes"][mode]["generated_text"] = decode_rows(tokenizer, tokens)
