"""Does a mode generate what eager generates? Tokens first, then how close the logits are."""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.engine import Generation


@dataclass(frozen=True)
class Equivalence:
    mode: str
    reference: str
    identical: bool
    first_divergence: tuple[int, int] | None  # (decode step, sequence): first token that differs
    max_abs_logit_diff: float | None  # over the compared steps, None when none was kept
    compared_steps: int

    def describe(self) -> str:
        if self.identical:
            tokens = "tokens identical"
        else:
            step, seq = self.first_divergence
            tokens = f"tokens diverge at step {step}, sequence {seq}"
        if self.max_abs_logit_diff is None:
            return f"{self.mode} vs {self.reference}: {tokens}"
        return (f"{self.mode} vs {self.reference}: {tokens}; max |Δ logits| "
                f"{self.max_abs_logit_diff:.3g} over {self.compared_steps} steps")


def compare(reference: Generation, other: Generation) -> Equivalence:
    """Compare `other` with `reference`; logits only up to the first differing token, since
    after it the two decodes see different inputs."""
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
    diff = max(((r - o).abs().max().item() for r, o in
                zip(reference.logits[:limit], other.logits[:limit])), default=None)
    return Equivalence(other.mode, reference.mode, first is None, first, diff, limit)
