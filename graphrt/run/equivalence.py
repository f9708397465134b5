"""Does a mode generate what eager generates? Tokens first, then whether the logits differ
beyond rounding.

A mode differs from eager where its tokens diverge, or where a step's logits differ beyond the
rounding of the model's dtype: `max |Δ| > atol + rtol × max |eager logits|`, (atol, rtol) per
dtype (graphrt.graphs.tolerance, the rule the localizer judges each module by). That is what the
equivalence line says, and what makes `graphrt run` localize a graph mode (graphrt.run.diagnose).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.graphs.tolerance import LAST_BITS, ValueDifference, compare_values
from graphrt.run.decode import Generation


@dataclass(frozen=True)
class Equivalence:
    mode: str
    reference: str
    identical: bool
    first_divergence: tuple[int, int] | None  # (decode step, sequence): first token that differs
    max_abs_logit_diff: float | None  # over the compared steps, None when none was kept
    compared_steps: int
    dtype: str = "float32"  # the model's, whose rounding the logits are judged by
    # the first compared step whose logits differ beyond that rounding, and how
    logits_beyond: tuple[int, ValueDifference] | None = None

    @property
    def differs(self) -> bool:
        """Tokens diverge, or logits differ beyond rounding."""
        return not self.identical or self.logits_beyond is not None

    @property
    def first_step(self) -> int | None:
        """The first decode step that differs (its tokens or its logits); None if none does."""
        steps = [s for s in (self.first_divergence and self.first_divergence[0],
                             self.logits_beyond and self.logits_beyond[0]) if s is not None]
        return min(steps, default=None)

    def describe(self) -> str:
        if self.identical:
            tokens = "tokens identical"
        else:
            step, seq = self.first_divergence
            tokens = f"tokens diverge at step {step}, sequence {seq}"
        if self.max_abs_logit_diff is None:
            return f"{self.mode} vs {self.reference}: {tokens}"
        if self.logits_beyond is None:
            judged = f"within {self.dtype} rounding"
        else:
            step, found = self.logits_beyond
            judged = f"beyond {self.dtype} rounding at step {step} ({found.describe()})"
        return (f"{self.mode} vs {self.reference}: {tokens}; max |Δ logits| "
                f"{self.max_abs_logit_diff:.3g} over {self.compared_steps} steps, {judged}")


def logits_differ(reference: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> ValueDifference | None:
    """Where one step's logits [B, V] differ beyond `dtype`'s rounding (they are compared as
    float32 copies of what a `dtype` model computed); None where they do not."""
    return compare_values(reference.float(), other.float(), {torch.float32: LAST_BITS.get(dtype, (0.0, 0.0))})


def compare(reference: Generation, other: Generation, dtype: torch.dtype = torch.float32) -> Equivalence:
    """Compare `other` with `reference`, a model of `dtype`; logits only up to the first
    differing token, since after it the two decodes see different inputs."""
    # (column, sequence) of each differing token, earliest column first, then lowest sequence;
    # tokens[:, 0] comes from the shared eager prefill, column j >= 1 from decode step j - 1
    differs = (reference.tokens != other.tokens).T.nonzero()
    first = None
    if len(differs):
        col, seq = differs[0].tolist()
        first = (col - 1, seq)
    limit = min(len(reference.logits), len(other.logits))
    if first is not None:
        limit = min(limit, first[0] + 1)  # the diverging step itself still saw equal inputs
    pairs = list(zip(reference.logits[:limit], other.logits[:limit]))
    diff = max(((r - o).abs().max().item() for r, o in pairs), default=None)
    beyond = next(((step, found) for step, (r, o) in enumerate(pairs)
                   if (found := logits_differ(r, o, dtype)) is not None), None)
    return Equivalence(other.mode, reference.mode, first is None, first, diff, limit,
                       str(dtype).removeprefix("torch."), beyond)
