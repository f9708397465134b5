"""How a mode's generation is compared with eager's: the first token that differs, and the
logits up to and including the step that produced it."""

import pytest
import torch

from graphrt.run.decode import Generation
from graphrt.run.equivalence import compare

BATCH, STEPS, VOCAB = 3, 5, 4


def generation(mode: str, tokens: list[list[int]], logits_shift: dict[int, float] | None = None,
               kept: int = STEPS) -> Generation:
    """A generation with these tokens [B, 1 + STEPS]; the logits of step s are a fixed base
    plus `logits_shift[s]` (0 where not given), for the first `kept` steps."""
    shift = logits_shift or {}
    base = torch.arange(BATCH * VOCAB, dtype=torch.float32).view(BATCH, VOCAB)
    logits = [base + shift.get(step, 0.0) for step in range(kept)]
    return Generation(mode, torch.tensor(tokens), step_ms=[], logits=logits)


# column 0 is the prefill's token, shared by every mode; column j >= 1 is decode step j - 1
EAGER = [[7, 1, 2, 3, 4, 5],
         [7, 1, 2, 3, 4, 5],
         [7, 1, 2, 3, 4, 5]]


def with_tokens(changes: dict[tuple[int, int], int]) -> list[list[int]]:
    """EAGER with tokens[row][column] replaced."""
    rows = [list(r) for r in EAGER]
    for (row, column), token in changes.items():
        rows[row][column] = token
    return rows


def test_identical_generations_compare_every_kept_step():
    eq = compare(generation("eager", EAGER), generation("graph", EAGER, {1: 0.25, 4: 0.5}))
    assert (eq.identical, eq.first_divergence, eq.compared_steps) == (True, None, STEPS)
    assert eq.max_abs_logit_diff == 0.5  # step 4, the last one, is compared too
    assert (eq.mode, eq.reference) == ("graph", "eager")
    assert eq.describe() == ("graph vs eager: tokens identical; max |Δ logits| 0.5 over 5 steps, beyond float32 "
                             "rounding at step 1 (row 0, column 0, max |Δ| 0.25 > atol 1e-05 + rtol 1e-05 × "
                             "max |eager| 11)")
    assert eq.differs and eq.first_step == 1


@pytest.mark.parametrize("changes, first", [
    ({(1, 3): 9}, (2, 1)),  # one token: row 1's at decode step 2
    ({(0, 4): 9, (1, 3): 9}, (2, 1)),  # the earliest step wins, whatever the row
    ({(2, 2): 9, (0, 2): 9, (1, 5): 9}, (1, 0)),  # at one step, the lowest row
    ({(2, 1): 9}, (0, 2)),  # the very first decode step
], ids=["one", "earliest-step", "lowest-row", "step-0"])
def test_the_first_divergence_is_the_earliest_step_then_the_lowest_row(changes, first):
    eq = compare(generation("eager", EAGER), generation("graph", with_tokens(changes)))
    assert not eq.identical
    assert eq.first_divergence == first


def test_logits_are_compared_up_to_and_including_the_diverging_step():
    # tokens first differ at step 2; step 2's logits were computed from equal inputs and are
    # compared, step 3's were not (the two decodes saw different tokens) and are not
    graph = generation("graph", with_tokens({(0, 3): 9}), {0: 0.125, 2: 0.5, 3: 8.0, 4: 9.0})
    eq = compare(generation("eager", EAGER), graph)
    assert (eq.first_divergence, eq.compared_steps, eq.max_abs_logit_diff) == ((2, 0), 3, 0.5)
    assert eq.describe() == ("graph vs eager: tokens diverge at step 2, sequence 0; "
                             "max |Δ logits| 0.5 over 3 steps, beyond float32 rounding at step 0 (row 0, "
                             "column 0, max |Δ| 0.125 > atol 1e-05 + rtol 1e-05 × max |eager| 11)")
    assert eq.first_step == 0


def test_only_the_steps_both_modes_kept_are_compared():
    eq = compare(generation("eager", EAGER, kept=4), generation("graph", EAGER, {3: 1.0}, kept=2))
    assert (eq.compared_steps, eq.max_abs_logit_diff) == (2, 0.0)


def test_without_kept_logits_only_tokens_are_compared():
    eq = compare(generation("eager", EAGER, kept=0), generation("graph", with_tokens({(1, 2): 9}), kept=0))
    assert eq.max_abs_logit_diff is None and eq.compared_steps == 0
    assert eq.describe() == "graph vs eager: tokens diverge at step 1, sequence 1"
